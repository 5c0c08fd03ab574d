"""The aggregator contract: what the training loop, the benchmarks and the tools call to turn per-rank
gradients into their mean.

See docs/design.md#gvqaggregatorsbasepy for how it works and why.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass

import torch

from gvq.aggregators.dtypes import refuse_dtypes
from gvq.comm import clock
from gvq.comm.p2p import P2P
from gvq.compressors._segments import balanced_segments
from gvq.compressors.base import Compressor
from gvq.compressors.base import check_int  # noqa: F401 (the one integer-argument check; re-exported)


@dataclass
class RunContext:
    """What an aggregator needs to know about the run it is bound to."""
    rank: int
    world_size: int
    seed: int = 0
    timeout_s: float | None = None   # how long a peer is waited for; None: the process group's timeout
    bandwidth_bps: float | None = None
    latency_s: float = 0.0
    run_dir: str | None = None     # where rank 0 may write aggregator-specific files (None: nowhere)


class Aggregator:
    """The one contract every aggregator satisfies (``conf/aggregator/*`` all do, torch DDP's included).

    Subclasses implement :meth:`setup` and :meth:`aggregate`; every other member has a default that is
    right for an aggregator without that feature.  Call order: ``preflight`` (launcher, before ranks
    start; optional), ``setup``, ``wrap``, then per iteration ``aggregate``; ``state_dict`` /
    ``load_state_dict`` around checkpoints (after ``wrap``); ``summary`` and ``close`` at the end.
    Whether it runs inside backward instead is not its business: :func:`gvq.hooks.overlapped.aggregator_from`
    decides, and wraps it.
    """

    #: short label for logs, reports and a checkpoint's identity
    name: str = "aggregator"
    #: extra per-iteration CSV columns :meth:`aggregate` reports (values: rank 0's)
    extra_fields: tuple[str, ...] = ()
    #: all its traffic goes through gvq's P2P, so ``net.clock=virtual`` can time it (torch DDP's cannot)
    virtual_time: bool = False
    #: it averages during backward (torch DDP): :meth:`wrap` returns the model to train, whose gradients
    #: are the mean once backward returns, so the loop checks them once (before :meth:`aggregate`)
    inside_backward: bool = False
    #: after :meth:`setup`, the one flat buffer every ``param.grad`` is a view of (the guards check it
    #: with one reduction); None where gradients live elsewhere (torch DDP: one check per parameter)
    bucket: torch.Tensor | None = None
    #: the codec, for aggregators built around one (the benchmarks time it alone); None: none
    compressor: Compressor | None = None
    #: it can average any one DDP gradient bucket (:meth:`FlatAggregator.allreduce_bucket_`, per-parameter
    #: state included), so :mod:`gvq.hooks` can run it inside backward; False: torch DDP's own options
    #: (they overlap by themselves).  The one declaration of that capability
    any_bucket: bool = False

    # -- life cycle ----------------------------------------------------------------------------------
    def preflight(self, params: list[torch.nn.Parameter]) -> None:
        """Checks that need the model's shapes, run by the launcher before any rank starts: raise a
        one-line ``ValueError`` (GradiVeQ: K against every conv layer).  Default: nothing to check."""

    def setup(self, params: list[torch.nn.Parameter], ctx: RunContext) -> None:
        """Bind to this rank's parameters and the run (called once, after construction)."""
        raise NotImplementedError

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model the loop trains, called once after :meth:`setup`: the model itself, unless the
        aggregator lives inside backward (``inside_backward``: torch DDP wraps it)."""
        return model

    def aggregate(self, iteration: int) -> dict:
        """Replace every ``param.grad`` by the mean over ranks; return the iteration's measurements.

        ``aggregate_s`` has one meaning for every aggregator and clock: what this rank waited, after its
        backward produced the last gradient, until every gradient was averaged.  An aggregator
        ``inside_backward`` also returns ``inside_compute_s``: the part of that wait its rank's clock
        already counted in the compute phase (under the wall clock backward itself waits for the last
        bucket), which the training loop takes out of ``compute_s``, so the two never count it twice."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the transport (threads, links).  Default: nothing held."""

    # -- measurements ----------------------------------------------------------------------------------
    @property
    def max_abs(self) -> float:
        """The largest magnitude the wire carries (its compressor's; fp16: 65504): the guards refuse an
        iteration where world_size x max|g| exceeds it, before a partial sum can overflow mid-ring."""
        return math.inf if self.compressor is None else self.compressor.max_abs

    def measure(self, flat: torch.Tensor) -> dict:
        """Untimed measurements on this rank's own flat gradient, before it is summed (e.g. the
        compression error); every rank pays them, so none waits for rank 0.  Default: none."""
        return {}

    def measure_after(self, flat: torch.Tensor) -> dict:
        """Untimed measurements once ``flat`` holds the mean, from what the sum left behind (PowerSGD's
        and error feedback's compression error).  Default: none."""
        return {}

    def summary(self) -> dict:
        """Run-level figures for ``summary.json``'s ``aggregator`` (GradiVeQ: refreshes, relays).
        Default: none (the key is left out)."""
        return {}

    # -- checkpoints ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What a checkpoint must keep for a bitwise resume (tensors, numbers, strings).  Default:
        nothing (a stateless aggregator)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output (after :meth:`setup` and :meth:`wrap`)."""

    # -- tools (gvq.bench, gvq.predict) --------------------------------------------------------------
    def codec_session(self, flat: torch.Tensor) -> contextlib.AbstractContextManager:
        """A context around one iteration's codec calls on this rank's gradient ``flat``, for codecs
        that keep state between calls (PowerSGD: a fresh iteration of its P / Q state; GradiVeQ: its
        Eq. 7 loss tracking).  The aggregator runs its own rings inside it; tools that replay its
        codec calls (``gvq.predict calibrate``) do the same.  Default: nothing to set up."""
        return contextlib.nullcontext()

    def prepare_benchmark(self, grads: list[torch.Tensor], args=None) -> None:
        """Pin the steady (compressed) state before a benchmark times :meth:`aggregate` (GradiVeQ: fit
        a basis; PowerSGD: no uncompressed start).  Called after :meth:`setup`.  Default: nothing."""

    def benchmark_warmup(self) -> int:
        """Iterations a benchmark must run before timing, for state :meth:`prepare_benchmark` cannot
        pin (torch's PowerSGD hook counts its own iterations).  Default: 0."""
        return 0


class FlatAggregator(Aggregator):
    """The shared implementation: flatten grads into one bucket, average it with
    :meth:`allreduce_mean_` (a sum over ranks by :meth:`allreduce_`, through
    :class:`gvq.comm.p2p.P2P`, then a division by N), write back.  Subclasses implement
    :meth:`allreduce_` and, if they measure something untimed, :meth:`measure` / :meth:`measure_after`."""

    #: all its traffic goes through P2P, so net.clock=virtual can time it
    virtual_time = True
    #: every one averages a DDP bucket (:meth:`allreduce_bucket_`; stateful ones override it)
    any_bucket = True
    #: set by :meth:`setup`: the parameters it averages, and its transport (None again once unpickled:
    #: see :meth:`__getstate__`)
    params: list[torch.nn.Parameter] | None = None
    p2p: P2P | None = None
    #: parameter dtypes it cannot average at their precision, with why: :meth:`setup` refuses them in
    #: one line (see :mod:`gvq.aggregators.dtypes`); every other dtype keeps its own
    refused_dtypes: tuple[tuple[torch.dtype, str], ...] = ()

    def setup(self, params: list[torch.nn.Parameter], ctx: RunContext) -> None:
        """:meth:`bind`, then every ``param.grad`` laid out in one flat buffer (:attr:`bucket`), for
        :meth:`aggregate` after backward."""
        self.bind(params, ctx)
        self.bucket = self._grad_bucket()

    def bind(self, params: list[torch.nn.Parameter], ctx: RunContext) -> None:
        """Bind to this rank's parameters and the run (transport, per-parameter state; subclasses add
        theirs here), leaving every ``param.grad`` where it is: all a caller that holds the gradients in
        buffers of its own needs (:mod:`gvq.hooks`: DDP's buckets)."""
        self.params = [p for p in params if p.requires_grad]
        refuse_dtypes(self.name, self.params, self.refused_dtypes)
        self.ctx = ctx
        self.p2p = P2P(ctx.rank, ctx.world_size, ctx.timeout_s, ctx.bandwidth_bps, ctx.latency_s)
        self.stopwatch = clock.Stopwatch()
        # where each parameter's values start in the whole flat gradient (per-parameter state lives there)
        self.offsets = [0]
        for p in self.params:
            self.offsets.append(self.offsets[-1] + p.numel())

    def _grad_bucket(self) -> torch.Tensor | None:
        """One flat buffer that every ``p.grad`` is a view of (as DDP's buckets): backward writes
        straight into it, so flatten / unflatten cost nothing in the default layout.  None for
        parameters of several dtypes (a grad must have its parameter's): :meth:`flatten` then
        concatenates them in the widest, and :meth:`unflatten` casts each back."""
        if len({p.dtype for p in self.params}) > 1:
            for p in self.params:                 # as in a bucket: an unused parameter averages zeros
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            return None
        flat = torch.zeros(sum(p.numel() for p in self.params), dtype=self.params[0].dtype,
                           device=self.params[0].device) if self.params else torch.zeros(0)
        offset = 0
        for p in self.params:
            view = flat[offset: offset + p.numel()].view_as(p)
            if p.grad is not None:
                view.copy_(p.grad)
            p.grad = view
            offset += p.numel()
        return flat

    def _grads_in_bucket(self) -> bool:
        if self.bucket is None:
            return False
        offset, base = 0, self.bucket.data_ptr()
        for p in self.params:
            if p.grad is None or p.grad.data_ptr() != base + offset * self.bucket.element_size():
                return False
            offset += p.numel()
        return True

    def flatten(self) -> torch.Tensor:
        """The gradient as one flat vector (the bucket itself while grads still live there)."""
        if self._grads_in_bucket():
            return self.bucket
        return torch.cat([p.grad.reshape(-1) for p in self.params])

    def unflatten(self, flat: torch.Tensor) -> None:
        if flat is self.bucket and self._grads_in_bucket():
            return
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad.copy_(flat[offset: offset + n].view_as(p.grad))
            offset += n

    def allreduce_(self, flat: torch.Tensor, iteration: int) -> dict | None:
        """Overwrite ``flat`` with its **sum** over ranks; return extra columns (or None)."""
        raise NotImplementedError

    def allreduce_mean_(self, flat: torch.Tensor, iteration: int) -> dict:
        """Average ``flat`` over ranks in place: :meth:`measure` (untimed), the sum, the division by N,
        :meth:`measure_after` (untimed).  Returns the measurements and ``aggregate_s`` (the sum and the
        division).  Bytes and codec times accumulate in :meth:`counters` until :meth:`reset_counters`."""
        extra = self.measure(flat)
        t0 = clock.now()
        extra.update(self.allreduce_(flat, iteration) or {})
        flat.div_(self.ctx.world_size)
        extra["aggregate_s"] = clock.now() - t0
        extra.update(self.measure_after(flat))
        return extra

    # -- one DDP bucket at a time (gvq.hooks), on the communication thread, in DDP's bucket order ------
    def start_iteration(self, iteration: int) -> None:
        """Before the iteration's first bucket: per-iteration decisions that must be the same for every
        bucket (GradiVeQ's schedule phase).  Default: none."""

    def allreduce_bucket_(self, flat: torch.Tensor, params: list[int], iteration: int) -> dict:
        """Average one DDP bucket in place: ``flat`` is the concatenated gradients of ``self.params[i]``
        for ``i`` in ``params``, in that order.  Per-parameter state (error memory, PCA bases, PowerSGD's
        P / Q) is read and written for those parameters only, so a bucket rebuild loses nothing.
        Returns measurements as :meth:`allreduce_mean_`.  Default (no per-parameter state):
        :meth:`allreduce_mean_`."""
        return self.allreduce_mean_(flat, iteration)

    def gather(self, whole: torch.Tensor, params: list[int]) -> torch.Tensor:
        """The values of ``whole`` (laid out as the whole flat gradient) for ``params``, concatenated in
        that order: a bucket's share of per-parameter state."""
        return torch.cat([whole[self.offsets[i]: self.offsets[i + 1]] for i in params]) if params \
            else whole[:0].clone()

    def scatter_(self, whole: torch.Tensor, params: list[int], part: torch.Tensor) -> None:
        """Inverse of :meth:`gather`: write ``part`` back into ``whole`` at ``params``' places."""
        off = 0
        for i in params:
            n = self.offsets[i + 1] - self.offsets[i]
            whole[self.offsets[i]: self.offsets[i + 1]].copy_(part[off: off + n])
            off += n

    def finish_iteration(self, iteration: int) -> dict:
        """After the iteration's last bucket: run-level columns (GradiVeQ's refresh decision).
        Default: none."""
        return {}

    def reset_counters(self) -> None:
        """Start an iteration's byte count, wire time and codec stopwatch at zero."""
        self.p2p.reset()
        self.stopwatch = clock.Stopwatch()

    def counters(self) -> dict:
        """Codec times, wire time, staging time and bytes sent since :meth:`reset_counters`."""
        return {"compress_s": self.stopwatch.get("compress"), "decompress_s": self.stopwatch.get("decompress"),
                "wire_s": self.p2p.wire_s, "stage_s": self.p2p.stage_s, "bytes_sent": self.p2p.bytes_sent}

    def aggregate(self, iteration: int) -> dict:
        """Replace every grad by the mean over ranks: one :meth:`allreduce_mean_` on the whole bucket;
        ``aggregate_s`` adds flatten / unflatten and excludes the untimed measurements."""
        self.reset_counters()
        t0 = clock.now()
        flat = self.flatten()
        t_flat = clock.now() - t0
        stats = self.allreduce_mean_(flat, iteration)
        t0 = clock.now()
        self.unflatten(flat)
        return {**stats, "aggregate_s": t_flat + stats["aggregate_s"] + clock.now() - t0, **self.counters()}

    def close(self) -> None:
        p2p = self.__dict__.get("p2p")        # None: setup never ran
        if p2p is not None:
            p2p.close()

    def __getstate__(self) -> dict:
        """Pickles without its transport (sockets and threads stay with the process that opened them):
        unpickled, ``p2p`` is None, and whoever runs it opens one (a hook state does on first use)."""
        return {k: v for k, v in self.__dict__.items() if k != "p2p"}


@functools.lru_cache(maxsize=64)
def equal_segments(numel: int, n: int) -> list[slice]:
    """``n`` contiguous segments of sizes differing by at most one (empty when numel < n); cached: the
    ring asks for the same split every iteration."""
    return balanced_segments(numel, n)
