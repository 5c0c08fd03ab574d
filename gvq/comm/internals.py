"""Every private Python, torch or Hydra API gvq relies on, and nothing else: one place to look on an upgrade.

Each function says what it reads, why no public API does the job, and what the caller does with it.
``tests/comm/test_internals.py`` asserts that each still exists with the shape used here, so a Python,
torch or Hydra release that moves one fails that test by name instead of a run misbehaving quietly; the
same test scans every other gvq module for a private torch, Python, OmegaConf or Hydra name.  It sits in
comm/, below every room that needs it (run, bench, predict).  Callers: :mod:`gvq.run.warm` (the fork
server, the fast exit), :mod:`gvq.run.signals` (the failed rank's traceback), :mod:`gvq.run.sweep`
(Hydra's basic sweeper) and :mod:`gvq.predict.calibrate_overlap` (DDP's first bucket).  Elsewhere gvq
mirrors one private rule of torch without calling it (the PowerSGD hook's choice of which matrices to
compress, :mod:`gvq.aggregators.ddp_memory`); the same test holds the mirror to torch's.
"""
from __future__ import annotations

import pickle

#: the module ``torch.optim`` imports on an optimizer's first step (its compile hooks): the fork server
#: imports it ahead, so a rank does not pay for it inside its first step.  Private, and preloading a name
#: that no longer exists is skipped silently by multiprocessing -- hence the test.
TORCH_FIRST_STEP_MODULE = "torch._dynamo"

#: the ``_target_`` of Hydra's default sweeper (``hydra/sweeper=basic``): the class lives under
#: ``hydra._internal`` and no public name holds its path; :mod:`gvq.run.sweep` mirrors that sweeper's
#: expansion only when the composed sweeper is this one
HYDRA_BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def hydra_basic_sweeper() -> type:
    """Hydra's basic sweeper class (``hydra._internal``): gvq's sweeper (hydra_plugins/gvq_sweeper) is it
    with fewer jobs, and Hydra exposes no public base that expands ``-m`` overrides."""
    import importlib
    module, _, name = HYDRA_BASIC_SWEEPER.rpartition(".")
    return getattr(importlib.import_module(module), name)


def ddp_first_bucket_bytes() -> int:
    """The size of the small first bucket DDP makes when no ``bucket_cap_mb`` is given
    (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``): the cost model buckets a model as DDP does, and
    no public API says what DDP's default first bucket is."""
    import torch.distributed as dist
    return int(dist._DEFAULT_FIRST_BUCKET_BYTES)


def torch_dispatch_mode() -> type:
    """``TorchDispatchMode``, the base class of a mode that sees every aten op (the op counter,
    :mod:`gvq.bench.opcount`): documented, but importable only from the private
    ``torch.utils._python_dispatch``."""
    from torch.utils._python_dispatch import TorchDispatchMode
    return TorchDispatchMode


def fork_server_pid() -> int | None:
    """The pid of multiprocessing's running fork server, else None.  multiprocessing keeps it only in
    ``multiprocessing.forkserver._forkserver._forkserver_pid`` (no public accessor); the tests use it to
    find the ranks as the server's children."""
    from multiprocessing import forkserver
    return forkserver._forkserver._forkserver_pid


def run_exit_handlers() -> None:
    """Run the ``atexit`` handlers now, last registered first, as an ordinary interpreter exit would
    (``atexit._run_exitfuncs``).  The fast exit ends in ``os._exit``, which skips them; no public API runs
    them without also tearing the interpreter down (the teardown the fast exit exists to skip)."""
    import atexit
    atexit._run_exitfuncs()


class _StringsOnly(pickle.Unpickler):
    """Loads pickled plain data (a string) and refuses any object: nothing in the file runs."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused {module}.{name}: only plain data is read here")


def rank_error_trace(ctx, rank: int) -> str | None:
    """The traceback text rank ``rank`` of ``ctx`` (``torch.multiprocessing.start_processes(...,
    join=False)``) raised, else None (it raised nothing, exited, or was killed).  torch writes it, a
    pickled string, to ``ctx.error_files[rank]``: an undocumented attribute and file format, read here as
    plain data only (an object in the file is refused, never imported or called).  ``ctx.join`` reports
    only the first rank to exit; the launcher needs every rank's to name the cause."""
    try:
        with open(ctx.error_files[rank], "rb") as fh:
            trace = _StringsOnly(fh).load()
    except (OSError, EOFError, pickle.UnpicklingError):
        return None
    return trace if isinstance(trace, str) else None
