"""A ring aggregator run inside backward: ``python cli.py aggregator=qsgd aggregator.overlap=true``
(``aggregator.bucket_cap_mb=0.5`` for smaller buckets; unset: DDP's defaults, its 1 MiB first bucket
included).

Those two keys are the run's, not the aggregator's: :func:`gvq.hooks.builder.aggregator_from` takes
them out of the config node and is the one place that decides to wrap.

:class:`Overlapped` wraps the model in torch's ``DistributedDataParallel`` with :func:`gvq.hooks.gvq_hook`
registered, so each bucket is averaged by the wrapped aggregator's ring on this rank's communication
thread while backward goes on.  Its columns (``comm_s``, ``exposed_s``, ``last_bucket_s``, ``straggle_s``,
``buckets``; the wrapped aggregator's codec, wire and byte counters over every bucket) are declared, with
their reductions over ranks, in :mod:`gvq.schema.columns` (docs/columns.md).  What backward waited for at
its end is ``aggregate_s`` on either clock: under ``net.clock=virtual`` :meth:`Overlapped.aggregate`
moves the compute lane to the communication lane's finish (docs/virtual-time.md); under the wall clock
backward itself waited, and the training loop moves that wait out of ``compute_s``.
"""
from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from gvq.aggregators.base import Aggregator, check_bucket_cap
from gvq.aggregators.ddp import wrap_ddp
from gvq.aggregators.flat import FlatAggregator
from gvq.comm import clock
from gvq.hooks.state import GvqHookState, gvq_hook, require_hookable



class Overlapped(Aggregator):
    """``inner`` (a gvq ring aggregator) averaging DDP's buckets during backward."""

    inside_backward = True
    bucket = None                      # DDP owns the gradient buffers

    def __init__(self, inner: FlatAggregator, bucket_cap_mb: float | None = None):
        """``bucket_cap_mb``: DDP's bucket size; None: DDP's defaults (its small first bucket too)."""
        require_hookable(inner, "aggregator.overlap=true")
        self.inner = inner
        self.bucket_cap_mb = check_bucket_cap(bucket_cap_mb)
        self.name = inner.name
        self.extra_fields = (("buckets", "comm_s", "exposed_s", "last_bucket_s", "averaging_s", "straggle_s")
                             + tuple(inner.extra_fields))
        self.virtual_time = inner.virtual_time
        self.compressor = inner.compressor
        self.state: GvqHookState | None = None

    def preflight(self, params) -> None:
        self.inner.preflight(params)

    def setup(self, params, ctx) -> None:
        self.inner.bind(params, ctx)            # DDP owns the gradient buffers
        self.ctx = ctx

    def wrap(self, model: torch.nn.Module) -> DistributedDataParallel:
        ddp = wrap_ddp(model, self.bucket_cap_mb)
        # the run's lanes (virtual time included); DDP's group, named: nothing to infer
        self.state = GvqHookState(self.inner, lanes=clock.lanes(), group=ddp.process_group)
        ddp.register_comm_hook(self.state, gvq_hook)
        # DDP's forward opens with collectives (its bucket rebuild after the first backward) that wait for
        # peers' forwards: the host's clock lock (net.exclusive) is given up for them, or the rank holding
        # it would wait on a peer that waits for the lock.  Hooks run on the wrapper, then on the model.
        ddp.register_forward_pre_hook(lambda *_: clock.get().yield_core())
        model.register_forward_pre_hook(lambda *_: clock.get().resume_core())
        return ddp

    def aggregate(self, iteration: int) -> dict:
        """The iteration's measurements (backward already averaged every bucket)."""
        if self.state is None:
            raise RuntimeError(f"{self.name}: the model was not wrapped (agg.wrap(model) after agg.setup)")
        lane = clock.get()
        t0 = lane.now()
        stats = self.state.iteration_stats()
        lane.advance_to(self.state.t_done)       # virtual: the compute lane waits here for the last bucket
        # wall: backward itself waited (DDP's finalize waits on every bucket), so compute_s holds the wait
        self.inside_compute_s = 0.0 if lane.virtual else stats["exposed_s"]
        return {**stats, "aggregate_s": lane.now() - t0 + self.inside_compute_s}

    def close(self) -> None:
        if self.state is not None:
            self.state.close()
        self.inner.close()

    # -- delegated ------------------------------------------------------------------------------------
    @property
    def max_abs(self) -> float:
        return self.inner.max_abs

    def summary(self) -> dict:
        return self.inner.summary()

    def state_dict(self) -> dict:
        return self.state.state_dict() if self.state is not None else {"aggregator": self.inner.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.state is not None:
            self.state.load_state_dict(state)
        else:
            self.inner.load_state_dict(state["aggregator"])

    def prepare_benchmark(self, grads, args=None) -> None:
        self.inner.prepare_benchmark(grads, args)

    def benchmark_warmup(self) -> int:
        return self.inner.benchmark_warmup()
