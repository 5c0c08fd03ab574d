"""Error feedback (Seide et al. 2014; Karimireddy et al. 2019) for any compressor on any topology:
``python cli.py aggregator=signsgd aggregator._target_=gvq.aggregators.error_feedback.ErrorFeedbackAggregator``.

See docs/design.md#gvqaggregatorserror_feedbackpy for how it works and why.
"""
from __future__ import annotations

import torch

from gvq.aggregators.compressed import CompressedAggregator
from gvq.aggregators.dtypes import widest_dtype
from gvq.compressors import _kernels
from gvq.compressors._kernels import Op, launch_kernel
from gvq.compressors.base import check_choice

BLOCK = 1024            # values a program of the Triton path's error-memory kernels handles

EF_UNITS = ("gradient", "step")


class ErrorFeedback:
    """One rank's error-feedback memory e: what its payloads left out, added to its next vector before
    that is compressed.  :class:`ErrorFeedbackAggregator`, GradiVeQ (``error_feedback=true``) and PowerSGD
    each hold one.  Laid out as the whole flat gradient, each parameter's block where its values are, so
    a DDP bucket works on its parameters' share (``bucket.state[key]``: :meth:`share`) and any bucketing
    sees the same memory; a checkpoint keeps it under ``key``."""

    def __init__(self, numel: int, dtype: torch.dtype, device, key: str = "error", kernels: str = "torch",
                 decay: float = 1.0, units: str = "gradient"):
        self.memory = torch.zeros(numel, dtype=dtype, device=device)
        self.key = key
        # the path of :meth:`fold_in_` and :meth:`keep_mean_` (``_kernels.choose_path``, once: the memory stays put)
        self.path = _kernels.choose_path(_kernels.check_kernels(kernels), self.memory.device, host=False)
        self.decay = check_decay(decay)
        # gradient: e in the gradient's units (p = g + e); step: in the update's (p = lr * g + e, Karimireddy et
        # al. 2019), so a residual left at one lr is applied at the lr it was computed under, not the next one's
        self.units = check_choice("aggregator.ef_units", units, EF_UNITS, "the units the residual is kept in")

    def per_parameter(self) -> dict[str, torch.Tensor]:
        """The memory as its owner's :meth:`FlatAggregator.per_parameter` lists it."""
        return {self.key: self.memory}

    def share(self, bucket) -> torch.Tensor:
        """The memory's share of a :class:`gvq.aggregators.base.Bucket` (all of it for every parameter)."""
        return bucket.state[self.key]

    def feed(self, x: torch.Tensor, e: torch.Tensor, lr: float | None) -> None:
        """Before compressing, in place: e <- decay * e, then x <- x + e (gradient units) or x <- lr * x + e
        (step units: ``lr`` the step's learning rate).  ``e``: this memory or a bucket's share of it."""
        if self.decay != 1.0:
            e.mul_(self.decay)
        if self.units == "step":
            x.mul_(lr)
        self.feed_(x, e)

    def to_gradient_(self, mean: torch.Tensor, lr: float | None) -> None:
        """After the average: step units back to the gradient's (mean / lr) for the optimizer, whose own
        lr multiplies it again; gradient units: nothing."""
        if self.units == "step":
            mean.div_(lr)

    @staticmethod
    def feed_(x: torch.Tensor, e: torch.Tensor) -> None:
        """Before compressing: x <- x + e (PowerSGD feeds the gradient into its memory instead, e <- e + g,
        so that M keeps the memory's precision when the gradient is 16-bit: the same sum)."""
        x.add_(e)

    @staticmethod
    def keep_(e: torch.Tensor, kept: torch.Tensor, sent: torch.Tensor | None = None, alpha: float = 1.0) -> None:
        """After: e <- kept - alpha * sent, what the payload left out (``sent`` None: ``kept`` is it;
        ``kept`` may be ``e`` itself).  A sum that went out exact leaves e <- 0 (``e.zero_()``)."""
        if sent is None:
            e.copy_(kept)
        else:
            torch.sub(kept, sent, alpha=alpha, out=e)

    def fold_in_(self, e: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """PowerSGD's form (:meth:`feed_`'s note): e <- e + x, then x <- e too, and a copy of e returned (its
        pass P's input, whose write-back is void; pass Q reads and overwrites ``x``)."""
        return FOLD_IN(self.path, e, x)

    def keep_mean_(self, e: torch.Tensor, total: torch.Tensor, n: int, raw: list[slice], raw_mask) -> None:
        """After a sum of ``n`` ranks: e <- e - total / n, 0 on the ``raw`` spans (sent exact), and
        ``total`` <- the mean.  ``raw_mask()``: 1 on those spans (uint8, e's length), the kernel's form."""
        KEEP_MEAN(self.path, e, total, n, raw, raw_mask)

    def state_dict(self) -> dict:
        return {self.key: self.memory.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.memory.copy_(state[self.key])


def _fold_in_torch(e: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ErrorFeedback.feed_(e, x)
    x.copy_(e)
    return e.clone()


def _fold_in_triton(e: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    from gvq.compressors import _triton_lowrank as k     # imports triton: only once a kernel runs
    scratch = torch.empty_like(e)
    if e.numel():
        launch_kernel(k.feed_memory, (-(-e.numel() // BLOCK),), e, x, x, scratch, e.numel(), BLOCK=BLOCK)
    return scratch


def _keep_mean_torch(e: torch.Tensor, total: torch.Tensor, n: int, raw: list[slice], raw_mask) -> None:
    ErrorFeedback.keep_(e, e, total, alpha=1.0 / n)
    for s in raw:
        e[s] = 0.0
    total.div_(n)


def _keep_mean_triton(e: torch.Tensor, total: torch.Tensor, n: int, raw: list[slice], raw_mask) -> None:
    from gvq.compressors import _triton_lowrank as k     # the kernel divides ``total`` as it keeps
    if e.numel():
        launch_kernel(k.keep_residual, (-(-e.numel() // BLOCK),), e, total, raw_mask(), e.numel(), n,
                      F64=e.dtype == torch.float64, BLOCK=BLOCK)


# the memory's steps around a sum of payloads, per path (``_kernels.Op``): torch's, and one launch each
FOLD_IN = Op(torch=_fold_in_torch, triton=_fold_in_triton)
KEEP_MEAN = Op(torch=_keep_mean_torch, triton=_keep_mean_triton)


def check_decay(decay) -> float:
    ok = isinstance(decay, (int, float)) and not isinstance(decay, bool) and 0 <= decay <= 1
    if not ok:
        raise ValueError(f"aggregator.ef_decay={decay!r}: must be in [0, 1] (1: the residual kept whole; "
                         "SparseLoCo uses 0.95)")
    return float(decay)


def feed_back(comp, flat: torch.Tensor, error: torch.Tensor, transmitted: torch.Tensor,
              segs: list[slice], clock, feedback: ErrorFeedback | None = None, lr: float | None = None) -> None:
    """In place: flat <- g' = g + e (``feedback``'s decay and units; None: as given); transmitted <- Q(g')
    segment by segment; error <- g' - Q(g')."""
    if feedback is None:
        ErrorFeedback.feed_(flat, error)
    else:
        feedback.feed(flat, error, lr)
    for s in segs:
        with clock("compress"):
            payload = comp.compress(flat[s], s)
        with clock("decompress"):
            transmitted[s] = comp.decompress(payload, s)
    ErrorFeedback.keep_(error, flat, transmitted)


def fed_back_error(error: torch.Tensor, transmitted: torch.Tensor) -> float:
    """||g' - Q(g')||^2 / ||g'||^2 of the last vector fed back, with g' = t + e (untimed)."""
    lost = float(error.pow(2).sum())
    whole = float((transmitted + error).pow(2).sum())
    return lost / whole if whole > 0 else 0.0


class ErrorFeedbackAggregator(CompressedAggregator):
    """:class:`CompressedAggregator` whose ranks feed back what their compressor lost, decayed by
    ``ef_decay`` and kept in ``ef_units`` (step: the run's learning rate, ``RunContext.lr``, read as each
    iteration opens)."""

    extra_fields = CompressedAggregator.extra_fields
    feeds_back = True

    def __init__(self, compressor, *, topology: str, hop: str, ef_decay: float, ef_units: str):
        super().__init__(compressor, topology=topology, hop=hop, ef_decay=ef_decay, ef_units=ef_units)
        self.name = f"{self.name}+ef"
        self.ef_decay, self.ef_units = check_decay(ef_decay), ef_units
        self.step_lr: float | None = None

    def bind(self, params, ctx):
        super().bind(params, ctx)
        if self.ef_units == "step" and ctx.lr is None:
            raise ValueError("aggregator.ef_units=step: this run gives the aggregator no learning rate "
                             "(RunContext.lr); use ef_units=gradient")
        device = self.params[0].device if self.params else torch.device("cpu")
        # in the widest parameter dtype, float32 at least: no parameter's share is rounded below its precision
        dtype = widest_dtype((p.dtype for p in self.params), at_least=torch.float32)
        self.feedback = ErrorFeedback(self.offsets[-1], dtype, device, decay=self.ef_decay, units=self.ef_units)
        self.transmitted = torch.zeros_like(self.feedback.memory)      # this rank's last t = Q(g')

    def start_iteration(self, iteration: int) -> None:
        # once per iteration, every bucket of it in the same units (a host value, read before any ring)
        self.step_lr = float(self.ctx.lr()) if self.ef_units == "step" else None

    def per_parameter(self):
        """The error memory and this rank's last transmitted Q(g'): a bucket feeds back its share."""
        return {**self.feedback.per_parameter(), "transmitted": self.transmitted}

    def measure(self, bucket):
        return {}          # the error of g' falls out of feed_back for free (see measure_after)

    def average(self, bucket):
        n, flat = self.ctx.world_size, bucket.flat
        segs = self.segments(flat.numel(), n) if self.topology == "ring" else [slice(0, flat.numel())]
        feed_back(self.codec_for(bucket.params), flat, self.feedback.share(bucket), bucket.state["transmitted"],
                  segs, self.stopwatch, self.feedback, self.step_lr)
        out = super().average(bucket)
        self.feedback.to_gradient_(flat, self.step_lr)
        return out

    def measure_after(self, bucket):
        return {"compression_error": fed_back_error(self.feedback.share(bucket), bucket.state["transmitted"])}

    def state_dict(self) -> dict:
        return {**super().state_dict(), **self.feedback.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.feedback.load_state_dict(state)
