"""The shared implementation of every aggregator that sums through gvq's P2P: each one is written once,
as :meth:`FlatAggregator.average` of one :class:`gvq.aggregators.base.Bucket` over the rings it declares.

See docs/design.md#gvqaggregatorsbasepy for how it works and why.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from gvq.aggregators.base import Aggregator, Bucket, RunContext
from gvq.aggregators.dtypes import refuse_dtypes
from gvq.comm import clock
from gvq.comm.p2p import P2P, nccl_group


class FlatAggregator(Aggregator):
    """The shared implementation: every aggregator is written once, as :meth:`average` of one
    :class:`Bucket` (by default the sum over its declared :meth:`rings`, through
    :class:`gvq.comm.p2p.P2P`, divided by N).  Post-backward, :meth:`aggregate` averages the whole-model
    bucket; :mod:`gvq.hooks` calls :meth:`average_bucket_` per DDP bucket, in the iteration frame
    :meth:`aggregate` runs in too (:meth:`begin_iteration`, :meth:`end_iteration`).  Subclasses
    declare :meth:`rings` (and :meth:`average` where a ring is not all), and if they measure something
    untimed, :meth:`measure` / :meth:`measure_after`."""

    #: all its traffic goes through P2P, so net.clock=virtual can time it
    virtual_time = True
    #: P2P counts what it receives as well as what it sends (an all-gather receives N - 1 payloads)
    extra_fields = ("bytes_received", "bytes_inter")
    #: every one averages any DDP bucket (:meth:`average_bucket_`)
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
        self.p2p = P2P(ctx.rank, ctx.world_size, ctx.timeout_s, ctx.bandwidth_bps, ctx.latency_s, group=ctx.group,
                       cluster=ctx.cluster)
        self.stopwatch = clock.Stopwatch()
        self.error_sums = [0.0, 0.0]     # this iteration's ||mean - exact||^2, ||exact||^2 (aggregate_error)
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

    def per_parameter(self) -> dict[str, torch.Tensor]:
        """State laid out as the whole flat gradient, each parameter's block where its values are (error
        feedback's memory), by the name a :class:`Bucket`'s ``state`` gives its share.  Default: none."""
        return {}

    def bucket_of(self, flat: torch.Tensor, params, iteration: int) -> Bucket:
        """The :class:`Bucket` :meth:`average` sees for ``flat``, the concatenated gradients of
        ``self.params[i]`` for ``i`` in ``params``: with its parameters' share of :meth:`per_parameter`
        (the state itself for every parameter, else a gathered copy that :meth:`average_bucket_` writes
        back).  Tools that replay :meth:`measure` or :meth:`average` build their vector with it."""
        params = tuple(params)
        whole = params == self.everything
        return Bucket(flat, params, iteration, {k: v if whole else self.gather(v, params)
                                                for k, v in self.per_parameter().items()})

    def average_bucket_(self, flat: torch.Tensor, params, iteration: int) -> dict:
        """Average one vector in place: ``flat`` is the concatenated gradients of ``self.params[i]`` for
        ``i`` in ``params``, in that order (post-backward: every parameter; the hook: a DDP bucket).  Its
        :meth:`bucket_of` (the per-parameter state's share), then :meth:`measure` (untimed),
        :meth:`average` (``aggregate_s``), :meth:`measure_after` (untimed), and the share is scattered
        back: so a bucket rebuild loses nothing.  With ``ctx.aggregate_error`` the raw vector is copied
        first (before :meth:`measure`, which may fold state into ``flat``) and the mean's error against
        its exact mean added to the iteration's (:meth:`add_error`).  Returns the measurements."""
        raw = self.raw_copy(flat)
        bucket = self.bucket_of(flat, params, iteration)
        extra = self.measure(bucket)
        t0 = clock.now()
        extra.update(self.average(bucket) or {})
        extra["aggregate_s"] = clock.now() - t0
        extra.update(self.measure_after(bucket))
        self.add_error(flat, raw)
        if bucket.params != self.everything:
            for k, whole in self.per_parameter().items():
                self.scatter_(whole, bucket.params, bucket.state[k])
        return extra

    def average(self, bucket: Bucket) -> dict | None:
        """Overwrite ``bucket.flat`` with its mean over ranks; return extra columns (or None): the one
        method an aggregator writes.  Default: the sum over its declared :meth:`rings`, divided by N."""
        rings = self.rings(bucket.params, self.ctx.world_size)
        if rings is None:
            raise NotImplementedError(f"{type(self).__name__}: declares neither rings() nor average()")
        measured = {}
        for r in rings:
            measured.update(r.run_(bucket.flat, self.p2p, self.stopwatch) or {})   # a ring's own columns
        bucket.flat.div_(self.ctx.world_size)
        return measured or None

    # -- aggregate_error (opt-in): the error of the mean the ranks end with, not of one rank's encoding ---
    def raw_copy(self, flat: torch.Tensor) -> torch.Tensor | None:
        """This rank's raw vector ``flat`` in float64 (a reference finer than what it checks), before
        anything touches it, where :meth:`add_error`'s all-reduce takes it; None unless
        ``ctx.aggregate_error``."""
        if not self.ctx.aggregate_error:
            return None
        # NCCL carries the device's tensor; gloo takes a host copy (a GPU tensor it may refuse)
        device = flat.device if nccl_group() else torch.device("cpu")
        with clock.get().blocked():                 # untimed: see add_error
            return flat.detach().to(device=device, dtype=torch.float64, copy=True)

    def add_error(self, flat: torch.Tensor, raw: torch.Tensor | None) -> None:
        """Add ``flat`` (now the mean) against the exact mean of the ranks' ``raw`` (:meth:`raw_copy`) to
        the iteration's sums: a hook iteration averages several vectors, and its error is the whole
        gradient's.  The exact mean is torch's all-reduce on the transport's group, not :class:`P2P`'s
        ring, so ``bytes_sent`` and ``wire_s`` never see it; inside the clock's ``blocked`` (one span: a
        nested one would count the work before it), so virtual time never does either; and after the
        ring, not before, so it never waits out a slower peer's backward that ``aggregate_s`` holds."""
        if raw is None:
            return
        with clock.get().blocked():
            if self.ctx.world_size > 1:
                dist.all_reduce(raw, group=self.p2p.group)
            exact = raw.div_(self.ctx.world_size)
            diff = flat.detach().to(exact.device, torch.float64) - exact
            self.error_sums[0] += float(diff.square().sum())
            self.error_sums[1] += float(exact.square().sum())

    def aggregate_error(self) -> float:
        """||mean - exact mean||^2 / ||exact mean||^2 over the vectors since :meth:`reset_counters`; NaN
        when not measured (``aggregate_error=false``) or the exact mean is zero."""
        err, norm = self.error_sums
        return err / norm if self.ctx.aggregate_error and norm > 0 else float("nan")

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

    # -- the iteration frame: post-backward (aggregate) and the hook (gvq.hooks.state) both open and close
    # -- an iteration with these, one average_bucket_ per vector in between ------------------------------
    def begin_iteration(self, iteration: int) -> None:
        """Open an iteration: the counters at zero, then :meth:`start_iteration`."""
        self.reset_counters()
        self.start_iteration(iteration)

    def end_iteration(self, iteration: int) -> dict:
        """Close it: :meth:`finish_iteration`'s columns, then the counters since :meth:`begin_iteration`
        and the iteration's :meth:`aggregate_error`."""
        return {**self.finish_iteration(iteration), **self.counters(), "aggregate_error": self.aggregate_error()}

    def reset_counters(self) -> None:
        """Start an iteration's byte count, wire time, codec stopwatch and error sums at zero."""
        self.p2p.reset()
        self.stopwatch = clock.Stopwatch()
        self.error_sums = [0.0, 0.0]

    def counters(self) -> dict:
        """Codec times, wire time, staging time and bytes sent and received since :meth:`reset_counters`."""
        return {"compress_s": self.stopwatch.get("compress"), "decompress_s": self.stopwatch.get("decompress"),
                "wire_s": self.p2p.wire_s, "stage_s": self.p2p.stage_s, "bytes_sent": self.p2p.bytes_sent,
                "bytes_received": self.p2p.bytes_received, "bytes_inter": self.p2p.bytes_inter}

    def average_vector(self, flat: torch.Tensor, iteration: int, params: tuple[int, ...] | None = None) -> dict:
        """The vector ``flat`` of ``params``' values (None: the whole model) averaged in place, as one
        bucket in the iteration frame the hook runs its buckets in (:meth:`begin_iteration`,
        :meth:`end_iteration`); ``aggregate_s`` adds the end (a refit), not the untimed measurements."""
        self.begin_iteration(iteration)
        stats = self.average_bucket_(flat, self.everything if params is None else tuple(params), iteration)
        t0 = clock.now()
        end = self.end_iteration(iteration)
        return {**stats, **end, "aggregate_s": stats["aggregate_s"] + clock.now() - t0}

    def aggregate(self, iteration: int) -> dict:
        """Replace every grad by the mean over ranks: the whole-model bucket through
        :meth:`average_vector`; ``aggregate_s`` adds flatten / unflatten."""
        t0 = clock.now()
        flat = self.flatten()
        t_flat = clock.now() - t0
        stats = self.average_vector(flat, iteration)
        t0 = clock.now()
        self.unflatten(flat)
        return {**stats, "aggregate_s": t_flat + stats["aggregate_s"] + clock.now() - t0}

    def close(self) -> None:
        p2p = self.__dict__.get("p2p")        # None: setup never ran
        if p2p is not None:
            p2p.close()

    def __getstate__(self) -> dict:
        """Pickles without its transport (sockets and threads stay with the process that opened them):
        unpickled, ``p2p`` is None, and whoever runs it opens one (a hook state does on first use)."""
        return {k: v for k, v in self.__dict__.items() if k != "p2p"}
