"""gvq's compressors inside any DDP training script, as a communication hook (the shape of torch's
``PowerSGDState`` + ``powerSGD_hook``)::

    from gvq.hooks import GvqHookState, gvq_hook
    ddp = DistributedDataParallel(model)                 # process_group=... : that group is averaged over
    state = GvqHookState.from_config("qsgd", ddp)        # any conf/aggregator ring option
    # or with overrides, the command line's keys: {"compressor.bits": 2}, {"lambda": 0.05, "L_t": 50}
    ddp.register_comm_hook(state, gvq_hook)
    ...                                                                # train as usual
    state.close()

Each bucket DDP hands the hook goes to this rank's communication thread, which averages it through
gvq's ring while backward continues.  ``state.iteration_stats()`` has the last iteration's
measurements; ``state.state_dict()`` / ``load_state_dict()`` go into checkpoints.  In the runner,
``aggregator.overlap=true`` does the same (:class:`Overlapped`).  ``examples/ddp_hook.py`` is a
complete script.  Syncing less often instead (local SGD, DiLoCo), around the script's optimizer step:
:class:`MethodSync` (gvq/hooks/method.py, ``examples/method_hook.py``).  Options compose as ``python cli.py
aggregator=<name> <overrides>`` composes them (gvq/hooks/config.py): the same schemas, knob names and
one-line errors.
"""
from gvq.hooks.method import MethodSync
from gvq.hooks.overlapped import Overlapped
from gvq.hooks.state import GvqHookState, gvq_hook

__all__ = ["GvqHookState", "gvq_hook", "MethodSync", "Overlapped"]
