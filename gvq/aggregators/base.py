"""The aggregator contract: what the training loop, the benchmarks and the tools call to turn per-rank
gradients into their mean.

See docs/design.md#gvqaggregatorsbasepy for how it works and why.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, field

import torch

from gvq.aggregators.dtypes import refuse_dtypes
from gvq.comm import clock
from gvq.comm.p2p import P2P
from gvq.comm.ring import Ring
from gvq.compressors._segments import balanced_segments
from gvq.compressors.base import Compressor
from gvq.compressors.base import check_int  # noqa: F401 (the one integer-argument check; re-exported)


def check_bucket_cap(value) -> float | None:
    """``aggregator.bucket_cap_mb`` (torch DDP's and the gvq hook's bucket size, MiB): > 0, or None for
    DDP's defaults (its small first bucket included; torch drops it when a size is passed)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"aggregator.bucket_cap_mb={value!r}: must be > 0 (or unset)")
    return float(value)


@dataclass
class Bucket:
    """One vector an aggregator averages (:meth:`FlatAggregator.average`): one DDP bucket, or
    post-backward the whole gradient, with its parameters' share of the per-parameter state."""
    flat: torch.Tensor                 # this rank's gradients of ``params``, concatenated; becomes their mean
    params: tuple[int, ...]            # positions in the aggregator's ``params``, in ``flat``'s order
    iteration: int
    state: dict[str, torch.Tensor]     # ``per_parameter``'s shares, laid out as ``flat``
    notes: dict = field(default_factory=dict)   # what :meth:`measure` leaves for :meth:`measure_after`


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
    Whether it runs inside backward instead is not its business: :func:`gvq.hooks.builder.aggregator_from`
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
    #: inside backward only, set by each :meth:`aggregate`: the part of its ``aggregate_s`` this rank's
    #: clock already counted in the compute phase (under the wall clock backward itself waits for the
    #: last bucket), which the training loop takes out of ``compute_s``, so the two never count it twice
    inside_compute_s: float = 0.0
    #: the codec, for aggregators built around one (the benchmarks time it alone); None: none
    compressor: Compressor | None = None
    #: it can average any one DDP gradient bucket (:meth:`FlatAggregator.average_bucket_`, per-parameter
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
        ``inside_backward`` also sets :attr:`inside_compute_s`."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the transport (threads, links).  Default: nothing held."""

    # -- measurements ----------------------------------------------------------------------------------
    @property
    def max_abs(self) -> float:
        """The largest magnitude the wire carries (its compressor's; fp16: 65504): the guards refuse an
        iteration where world_size x max|g| exceeds it, before a partial sum can overflow mid-ring."""
        return math.inf if self.compressor is None else self.compressor.max_abs

    def measure(self, bucket: Bucket) -> dict:
        """Untimed measurements on this rank's own gradient ``bucket.flat``, before it is summed (e.g. the
        compression error); every rank pays them, so none waits for rank 0.  Default: none."""
        return {}

    def measure_after(self, bucket: Bucket) -> dict:
        """Untimed measurements once ``bucket.flat`` holds the mean, from what the sum left behind
        (PowerSGD's and error feedback's compression error).  Default: none."""
        return {}

    def rings(self, params: tuple[int, ...], n: int) -> list[Ring] | None:
        """The rings :meth:`FlatAggregator.average` runs, in order, on a vector of ``params`` (positions,
        in the vector's order) at ``n`` ranks in its present phase: what :mod:`gvq.predict` prices.
        None: none declared (torch DDP's own collectives), and the cost model refuses to price it."""
        return None

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
    """The shared implementation: every aggregator is written once, as :meth:`average` of one
    :class:`Bucket` (by default the sum over its declared :meth:`rings`, through
    :class:`gvq.comm.p2p.P2P`, divided by N).  Post-backward, :meth:`aggregate` averages the whole-model
    bucket; :mod:`gvq.hooks` calls :meth:`average_bucket_` per DDP bucket, between
    :meth:`start_iteration` and :meth:`finish_iteration` as :meth:`aggregate` does.  Subclasses
    declare :meth:`rings` (and :meth:`average` where a ring is not all), and if they measure something
    untimed, :meth:`measure` / :meth:`measure_after`."""

    #: all its traffic goes through P2P, so net.clock=virtual can time it
    virtual_time = True
    #: every one averages any DDP bucket (:meth:`average_bucket_`)
    any_bucket = True
    #: attributes holding per-parameter state laid out as the whole flat gradient (error memory): a
    #: bucket sees its parameters' share as ``bucket.state[name]``, written back after :meth:`average`
    per_parameter: tuple[str, ...] = ()
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

    # -- one vector: the whole gradient after backward, or one DDP bucket (gvq.hooks) --------------------
    @property
    def everything(self) -> tuple[int, ...]:
        """Every parameter's position: the whole-model bucket post-backward aggregation averages."""
        return tuple(range(len(self.params)))

    def numel_of(self, params: tuple[int, ...]) -> int:
        return sum(self.offsets[i + 1] - self.offsets[i] for i in params)

    def memo(self, key, build):
        """``build()``, kept under ``key`` until :meth:`forget` (per-bucket plans and ring segments: a
        bucket's parameters come back every iteration)."""
        memo = self.__dict__.setdefault("_memo", {})
        if key not in memo:
            memo[key] = build()
        return memo[key]

    def forget(self) -> None:
        """Drop :meth:`memo`'s plans (GradiVeQ: a refit makes new bases)."""
        self.__dict__.get("_memo", {}).clear()

    def start_iteration(self, iteration: int) -> None:
        """Before the iteration's first vector: per-iteration decisions every vector shares (GradiVeQ's
        schedule phase, PowerSGD's fresh Q).  Default: none."""

    def average_bucket_(self, flat: torch.Tensor, params, iteration: int) -> dict:
        """Average one vector in place: ``flat`` is the concatenated gradients of ``self.params[i]`` for
        ``i`` in ``params``, in that order (post-backward: every parameter; the hook: a DDP bucket).  The
        per-parameter state's share (:attr:`per_parameter`) is gathered into the :class:`Bucket`, then
        :meth:`measure` (untimed), :meth:`average` (``aggregate_s``), :meth:`measure_after` (untimed),
        and the share is scattered back: so a bucket rebuild loses nothing.  Returns the measurements."""
        params = tuple(params)
        whole = params == self.everything
        state = {k: getattr(self, k) if whole else self.gather(getattr(self, k), params) for k in self.per_parameter}
        bucket = Bucket(flat, params, iteration, state)
        extra = self.measure(bucket)
        t0 = clock.now()
        extra.update(self.average(bucket) or {})
        extra["aggregate_s"] = clock.now() - t0
        extra.update(self.measure_after(bucket))
        if not whole:
            for k in self.per_parameter:
                self.scatter_(getattr(self, k), params, state[k])
        return extra

    def average(self, bucket: Bucket) -> dict | None:
        """Overwrite ``bucket.flat`` with its mean over ranks; return extra columns (or None): the one
        method an aggregator writes.  Default: the sum over its declared :meth:`rings`, divided by N."""
        rings = self.rings(bucket.params, self.ctx.world_size)
        if rings is None:
            raise NotImplementedError(f"{type(self).__name__}: declares neither rings() nor average()")
        for r in rings:
            r.run_(bucket.flat, self.p2p, self.stopwatch)
        bucket.flat.div_(self.ctx.world_size)
        return None

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
        """Replace every grad by the mean over ranks: the whole-model bucket, between
        :meth:`start_iteration` and :meth:`finish_iteration` as the hook runs its buckets;
        ``aggregate_s`` adds flatten / unflatten and the finish (a refit), not the untimed measurements."""
        self.reset_counters()
        self.start_iteration(iteration)
        t0 = clock.now()
        flat = self.flatten()
        t_flat = clock.now() - t0
        stats = self.average_bucket_(flat, self.everything, iteration)
        t0 = clock.now()
        stats.update(self.finish_iteration(iteration))
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
