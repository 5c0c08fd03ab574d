"""Deep Gradient Compression's sparsifier (Lin et al., ICLR 2018; the first author's synxlin/deep-gradient-
compression ``dgc/compression.py``): ``python cli.py aggregator=dgc optim.momentum=0``.  The momentum
correction, its masking and the local clipping live in :class:`gvq.aggregators.dgc.DGCAggregator`; this
codec picks and carries the values.

Selection, per scope (each tensor of two or more dimensions; without a layout, the segment):

* a **sampled threshold**: every ``stride``-th |v| of the scope (a fraction ``sample`` of it, and at least
  2/r values, as synxlin), starting at an offset keyed by the iteration (synxlin draws a random start; a key
  needs no generator and replays on a resume); the threshold is the sample's ceil(n_s k / n)-th largest;
* synxlin's adaptation, in one pass: the thresholds t, 0.8 t, ..., 0.8^9 t (its ten tries) are counted at
  once (one search of every value's key among every scope's thresholds, one scatter-add: a fixed few
  whole-vector passes, not a pass per try), and the first whose count reaches ceil(0.8 k) is kept (the
  last, if none does);
* **exact re-selection among the candidates** (|v| >= the kept threshold): the largest |v| of them, at most
  k, by :class:`gvq.compressors.topk.TopK` on the vector with every non-candidate zeroed.  So the count sent
  is min(k, candidates), within [ceil(0.8 k), k] unless fewer than 0.8 k values clear 0.8^9 t (a scope of
  mostly zeros).  Not synxlin's ``idx[:k]``, which keeps the first k candidates *by position* when
  k < count <= 1.3 k: here always the largest, so k is never exceeded and never traded for a smaller value.
  A scope whose k is its length (r = 1) takes threshold 0: every value, through the same path.

The torch reference ranks every value of the masked vector (one ``topk``): synxlin compacts the candidates
first (``nonzero``), which needs the count on the host, and a codec call never reads the device.

k = max(1, floor(r n)) per scope, as top-k's (synxlin: ceil(r n)).  The **warm-up** raises the sparsity
exponentially: stage e < ``warmup_stages`` of ``warmup_iters`` iterations keeps r_e = max(c^(e+1), r) with
c = r^(1 / (stages + 1)) (synxlin's ``warmup_epochs``, in iterations; r = 0.001 and 4 stages: 25%, 6.3%,
1.6%, 0.4%, then 0.1%), so the payload's size is a function of the iteration, alike on every rank.

Payload: top-k's (int32 indices then float32 values, k slots a scope: a slot a scope could not fill goes
as a zero at a non-candidate position), then the **dense** part as float32: tensors of one dimension or
none (biases, norms' weights), sent whole, as synxlin all-reduces them.  8 k bytes a sparse scope, 4 n a
dense tensor; not additive (supports differ): all-gathered.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from gvq.compressors import _dgc_triton
from gvq.compressors._kernels import DeviceKernels, Op
from gvq.compressors.base import Compressor, Health, check_int
from gvq.compressors.topk import TopK, check_ratio

TRIES = 10            # synxlin's adaptation: at most 10 thresholds, each 0.8 of the last
SHRINK = 0.8
LOW = 0.8             # a threshold is kept once it selects ceil(LOW * k) values
_INF = 0x7F800000     # float32 inf's bits: every NaN's (its sign cleared) are larger


@dataclass
class Plan:
    """One segment's layout at one ratio: which of its values are sparse or dense, and the top-k of the
    sparse part (its own segment 0:ns, one scope a sparse tensor)."""
    n: int
    sparse: Tensor             # positions in the segment (int64, CPU), the sparse part in order
    dense: Tensor
    topk: TopK                 # grouped on the sparse pieces
    pieces: list[tuple[int, int, bool]]    # (start, length, dense) of each tensor's run, in segment order

    @property
    def inner_bytes(self) -> int:
        return self.topk.payload_nbytes(slice(0, self.sparse.numel()))


class DGC(DeviceKernels, Compressor):
    per_process = ('_plans', '_consts')   # rebuilt in each process
    name = "dgc"
    additive = False
    stochastic = False         # the sample's offset is keyed by the iteration, nothing is drawn

    def __init__(self, ratio: float = 0.001,      # r: fraction kept per sparse tensor; lower => fewer bytes
                 sample: float = 0.01,            # fraction of |v| sampled for the threshold
                 warmup_iters: int = 0,           # iterations per warm-up stage; 0 => r from the start
                 warmup_stages: int = 4,          # stages of exponentially rising sparsity before r
                 kernels: str = "auto"):          # auto | triton | torch (gvq/compressors/_kernels.py)
        self.r = check_ratio(ratio)
        ok = isinstance(sample, (int, float)) and not isinstance(sample, bool) and 0 < sample <= 1
        if not ok:
            raise ValueError(f"sample={sample!r}: must be a fraction in (0, 1] (of |v| sampled for the threshold)")
        self.sample = float(sample)
        self.warmup_iters = check_int("warmup_iters", warmup_iters, 0, hint=" (0: no warm-up)")
        self.warmup_stages = check_int("warmup_stages", warmup_stages, 1)
        self.init_kernels(kernels)
        self.shapes: tuple[tuple[int, ...], ...] | None = None
        # the iteration begin_vector names, shared (a list) with every grouped view, which the aggregator
        # builds once per layout while begin_vector is said to this codec
        self._at = [0]
        self._plans, self._consts = {}, {}
        self.ideal_ratio = 4.0 / (self.r * 8)
        # the inputs' sums since the last check (shared with every grouped view): a NaN fails the threshold
        # test, so it would stay in v unsent and unseen; its sum stays NaN
        self.health = Health("sum")

    def grouped(self, shapes) -> "DGC":
        view = copy.copy(self)
        view.shapes, view._plans, view._consts = tuple(tuple(s) for s in shapes), {}, {}
        return view

    def triton_tables(self, seg: slice, device) -> dict:
        """The Triton path's tables (:func:`._dgc_triton.tables`), made once per ratio, segment and device."""
        key = ("triton", self.ratio_at(self._at[0]), seg.start, seg.stop, device)
        if key not in self._consts:
            self._consts[key] = _dgc_triton.tables(self, self.plan(seg), device, LOW,
                                                   [SHRINK ** j for j in range(TRIES)])
        return self._consts[key]

    @property
    def key(self) -> int:
        """The present iteration's sample key: each scope's sample starts at it modulo its stride."""
        return self._at[0] * 40503

    def begin_vector(self, seed: int, iteration: int, vector: int) -> None:
        self._at[0] = iteration

    def check_health(self) -> None:
        total = self.health.read()
        if total is not None and not math.isfinite(total):
            raise ValueError(f"{self.name}: input gradient has NaN or Inf values (or sums past float32); "
                             "refusing to send them")

    def ratio_at(self, iteration: int) -> float:
        """The fraction kept in ``iteration``: synxlin's warm-up, max(c^(e+1), r) in stage e."""
        stage = iteration // self.warmup_iters if self.warmup_iters else self.warmup_stages
        if stage >= self.warmup_stages:
            return self.r
        return max(self.r ** ((stage + 1) / (self.warmup_stages + 1)), self.r)

    # -- the layout ---------------------------------------------------------------------------------------
    def plan(self, seg: slice) -> Plan:
        key = (self.ratio_at(self._at[0]), seg.start, seg.stop)
        if key not in self._plans:
            self._plans[key] = self._build_plan(key[0], seg)
        return self._plans[key]

    def _build_plan(self, ratio: float, seg: slice) -> Plan:
        n = seg.stop - seg.start
        shapes = self.shapes if self.shapes is not None else [(1, n)]    # no layout: one sparse scope
        sparse, dense, pieces = [], [], []
        at = 0 if self.shapes is not None else seg.start          # ... which is the segment, where it starts
        for shape in shapes:
            size = math.prod(shape)
            lo, hi = max(at, seg.start), min(at + size, seg.stop)
            if hi > lo:
                (dense if len(shape) <= 1 else sparse).append(torch.arange(lo - seg.start, hi - seg.start))
                pieces.append((lo - seg.start, hi - lo, len(shape) <= 1))
            at += size
        if self.shapes is not None and at < seg.stop:
            raise ValueError(f"{self.name}: segment {seg.start}:{seg.stop} beyond its layout of {at}")
        cat = lambda parts: torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)   # noqa: E731 - one use, beside the plan it builds
        # the torch reference's top-k is torch ops on every device (the Triton path runs its own select)
        topk = TopK(ratio, scope="tensor", kernels="torch").grouped([(m,) for _, m, d in pieces if not d])
        return Plan(n, cat(sparse), cat(dense), topk, pieces)

    def payload_spec(self, seg: slice) -> tuple[torch.dtype, int]:
        plan = self.plan(seg)
        return torch.uint8, plan.inner_bytes + 4 * plan.dense.numel()

    def dense_mask(self, seg: slice, device) -> Tensor:
        """True where ``seg``'s values travel dense (1-D tensors): the aggregator masks no momentum there."""
        return self._const(seg, device)["dense_mask"]

    def _const(self, seg: slice, device) -> dict:
        """The plan's tensors on ``device`` (built once per ratio, segment and device)."""
        key = (self.ratio_at(self._at[0]), seg.start, seg.stop, device)
        if key not in self._consts:
            plan = self.plan(seg)
            mask = torch.zeros(plan.n, dtype=torch.bool)
            mask[plan.dense] = True
            c = {"sparse": plan.sparse, "dense": plan.dense, "dense_mask": mask, **self._sampler(plan)}
            self._consts[key] = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in c.items()}
        return self._consts[key]

    def scope_samples(self, plan: Plan):
        """The sparse scopes' top-k plan and, per scope, its length, sample count (a fraction ``sample``,
        at least 2/r, at most the scope) and its threshold's rank in the sample (0: the largest)."""
        tk = plan.topk.plan(slice(0, plan.sparse.numel()))
        lengths = [b - a for a, b in zip(tk.starts, tk.starts[1:] + [tk.n])]
        counts = [min(length, max(math.ceil(self.sample * length), math.ceil(2 / plan.topk.r)))
                  for length in lengths]
        ranks = [max(1, math.ceil(c * k / length)) - 1 for length, c, k in zip(lengths, counts, tk.ks)]
        return tk, lengths, counts, ranks

    def _sampler(self, plan: Plan) -> dict:
        """Each sparse scope's sampler: its sample's positions (a row a scope; ``valid`` 0 past its count),
        their stride, the sample rank of its threshold (0: the largest), and ceil(0.8 k); and the tables that
        count every try of every scope in one search (:meth:`candidates`)."""
        tk, lengths, counts, ranks = self.scope_samples(plan)
        pos = torch.zeros((len(lengths), max(counts, default=1)), dtype=torch.long)
        for s, (start, length, c) in enumerate(zip(tk.starts, lengths, counts)):   # once per layout
            pos[s, :c] = start + torch.arange(c) * (length // c)
        valid = torch.arange(pos.shape[1])[None, :] < torch.tensor(counts, dtype=torch.long)[:, None]
        scope = torch.arange(len(lengths), dtype=torch.long)
        cols = torch.arange(TRIES + 2)
        return {"pos": pos, "valid": valid.long(), "pad": ~valid, "rank": torch.tensor(ranks, dtype=torch.long),
                "top": max(ranks, default=0) + 1,
                "stride": torch.tensor([length // c for length, c in zip(lengths, counts)], dtype=torch.long),
                "need": torch.tensor([math.ceil(LOW * k) for k in tk.ks], dtype=torch.long),
                "full": torch.tensor([k >= length for length, k in zip(lengths, tk.ks)]),   # r = 1: every value
                # a value's key: its scope above its |v|'s bits (None: one scope, no add)
                "high": None if len(lengths) < 2 else torch.repeat_interleave(
                    scope << 32, torch.tensor(lengths, dtype=torch.long), output_size=tk.n),
                "base": (scope << 32)[:, None], "ceiling": (scope << 32)[:, None] + _INF + 1,
                "shrink": torch.tensor([SHRINK ** j for j in reversed(range(TRIES))], dtype=torch.float32),
                "cols": torch.where(cols <= TRIES, cols, -1), "one": torch.ones(1, dtype=torch.long),
                "no": torch.zeros(1, dtype=torch.bool)}

    # -- the codec ----------------------------------------------------------------------------------------
    def thresholds(self, a: Tensor, seg: slice) -> Tensor:
        """Each sparse scope's sampled threshold t (0 where k is the scope's length), from ``a`` = |v|."""
        c = self._const(seg, a.device)
        offset = torch.remainder(self.key, c["stride"])          # the sample's start, per scope
        at = (c["pos"] + offset[:, None] * c["valid"]).reshape(-1)
        sample = a.index_select(0, at).view(c["pos"].shape).masked_fill_(c["pad"], -1.0)   # pads lose
        top = torch.topk(sample, c["top"], dim=1).values
        return torch.where(c["full"], 0.0, top.gather(1, c["rank"][:, None])[:, 0])

    def _edges(self, thr: Tensor, c: dict) -> Tensor:
        """The sorted int64 edges every key is searched among: per scope (above the last's), a floor, the
        tries' thresholds 0.8^9 t .. t by their float32 bits, and a ceiling just past inf that only a NaN
        reaches (a NaN threshold is put there: no number clears it, as no number compares >= NaN)."""
        tries = (thr[:, None] * c["shrink"]).view(torch.int32).to(torch.int64).clamp_(max=_INF + 1)
        return torch.cat([c["base"], tries + c["base"], c["ceiling"]], 1).reshape(-1)

    def candidates(self, xs: Tensor, seg: slice) -> Tensor:
        """``xs`` (the sparse part, float32) with every value below its scope's adapted threshold zeroed.
        Every try is counted in one search: a value's key (its scope above |v|'s bits, which order as |v|
        for non-negative floats) is found among the edges, so its bin is its scope and how many of the ten
        thresholds it clears (its level) -- or a NaN's bin, which clears none; one scatter-add counts them."""
        c = self._const(seg, xs.device)
        a = xs.abs()
        keys = a.view(torch.int32).to(torch.int64)
        if c["high"] is not None:
            keys += c["high"]
        bins = torch.searchsorted(self._edges(self.thresholds(a, seg), c), keys, right=True)   # 1 + scope's bin
        rows = c["need"].numel()
        hist = keys.new_zeros(1 + rows * (TRIES + 2))     # a scatter-add, not bincount: no host read on CUDA
        hist.scatter_add_(0, bins, c["one"].expand(bins.numel()))
        level = hist[1:].view(rows, TRIES + 2)[:, : TRIES + 1]            # level[s, L]: |v| clearing L tries
        count = level.flip(1).cumsum(1)[:, :TRIES]                        # count[s, j]: |v| >= 0.8^j t
        tries = (count < c["need"][:, None]).sum(1).clamp(max=TRIES - 1)  # the first that reaches 0.8 k
        keep = torch.cat([c["no"], (c["cols"] >= (TRIES - tries)[:, None]).reshape(-1)])   # by bin; NaN: no
        # each bin's mask of a float32's bits (all ones or none): an AND keeps a value or makes it +0.0, as
        # where(keep, xs, 0) would, at a quarter of a bool select's time on one CPU core
        bits = keep.to(torch.int32).neg_().index_select(0, bins)
        return bits.bitwise_and_(xs.view(torch.int32)).view(torch.float32)

    def compress(self, x: Tensor, seg: slice) -> Tensor:
        if self.plan(seg).n == 0:
            return torch.empty(0, dtype=torch.uint8, device=x.device)
        return COMPRESS(self.path(x.device), self, x.reshape(-1), seg)

    def torch_compress(self, x: Tensor, seg: slice) -> Tensor:
        plan, x = self.plan(seg), x.to(torch.float32)
        self.health.note(x.sum(dtype=torch.float32))
        ns, c = plan.sparse.numel(), self._const(seg, x.device)
        xs = x if plan.dense.numel() == 0 else x.index_select(0, c["sparse"])
        sparse = plan.topk.compress(self.candidates(xs, seg), slice(0, ns)) if ns else x.new_empty(0).byte()
        dense = x.index_select(0, c["dense"]).view(torch.uint8)
        return torch.cat([sparse, dense])

    def checked(self, payload: Tensor, seg: slice) -> Tensor:
        """``payload`` if it is ``seg``'s (else a one-line ValueError)."""
        dtype, size = self.payload_spec(seg)
        if payload.dtype != dtype or payload.numel() != size:
            raise ValueError(f"{self.name}: payload of {payload.numel()} {payload.dtype} for segment "
                             f"{seg.start}:{seg.stop}; expected {size} {dtype}")
        return payload

    def decompress(self, payload: Tensor, seg: slice) -> Tensor:
        return DECOMPRESS(self.path(payload.device), self, self.checked(payload, seg), seg)

    def torch_decompress(self, payload: Tensor, seg: slice) -> Tensor:
        plan = self.plan(seg)
        out = torch.zeros(plan.n, dtype=torch.float32, device=payload.device)
        ns, ib, c = plan.sparse.numel(), plan.inner_bytes, self._const(seg, payload.device)
        if ns:
            out.index_copy_(0, c["sparse"], plan.topk.decompress(payload[:ib], slice(0, ns)))
        if plan.dense.numel():
            dense = payload[ib:] if (payload.storage_offset() + ib) % 4 == 0 else payload[ib:].clone()
            out.index_copy_(0, c["dense"], dense.view(torch.float32))
        return out


# DGC's calls per path (``_kernels.Op``): the torch reference, and its Triton kernels (2 launches each way)
COMPRESS = Op(torch=DGC.torch_compress, triton=_dgc_triton.dgc_compress)
DECOMPRESS = Op(torch=DGC.torch_decompress, triton=_dgc_triton.dgc_decompress)
