"""Top-k sparsification (Aji & Heafield 2017; GRACE's ``topk``): per scope, the k = max(1, floor(r * n))
values of largest |v| are sent with their indices, every other value as zero.  ``python cli.py
aggregator=topk`` (error feedback on: a biased codec that needs it, conf/aggregator/topk.yaml).

A scope is each parameter's block of the vector (``tensor``: the layout comes from the aggregator through
:meth:`Compressor.grouped`; without one, a segment is one tensor), fixed ``bucket``-sized runs, or the
whole segment (``global``).  The selected set is exact and deterministic: among equal |v| the lower index
wins.  Each value is ranked by one int64 key, its float32 |v|'s bits (monotone for non-negative floats) above
a tie-break larger for a lower index, so every key is unique and ``torch.topk`` picks exactly that set.  The
scopes are ranked as rows: equal runs (global, bucket, one tensor) are the vector itself, padded at its tail;
unequal ones (per tensor) are gathered into a fixed few row-batches (the short scopes in one, then one per
length, or past ``MAX_BATCHES`` lengths per power of two), padded with values whose keys lose: flat in depth.
Where a row keeps few (k blocks at most a quarter of it), it is ranked in two stages: its blocks of up to
``_topk_plan.MAX_BLOCK`` values by their largest key (ties to the lower block), then exactly among the values of the k
winning blocks, which hold all of the row's top k; a fixed few whole-tensor ops, no host read.  A scope's
kept positions come best first, as the stable sort this replaced (9-17x slower per tensor) ordered them.
NaN ranks above every number (its bits are larger): it is sent, and the run's NaN guard sees it.  Rank is
taken on float32 magnitudes (a float64 input's near-ties may order as their float32 roundings).

Payload: one uint8 tensor of fixed size (payload_spec), each part aligned for its dtype: int32 indices,
then the values; or the values, then the indices packed to ceil(log2 L) bits each, back to back (L the
longest scope: an index is its offset inside its scope; :func:`gvq.compressors._packing.pack_bits`).  Not additive (the
ranks' supports differ): it travels by all-gather, each rank decoding every rank's payload.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import Tensor

from gvq.compressors import _packing, _triton_grace
from gvq.compressors._kernels import DeviceKernels, Op
from gvq.compressors._topk_plan import Plan, constants, plan_rows, select
from gvq.compressors.base import Compressor, check_choice

SCOPES = ("tensor", "bucket", "global")
VALUE_DTYPES = {"float32": torch.float32, "float16": torch.float16}
INDICES = ("int32", "packed")
def check_ratio(ratio) -> float:
    ok = isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 < ratio <= 1
    if not ok:
        raise ValueError(f"ratio={ratio!r}: must be a fraction in (0, 1] (k = max(1, floor(ratio * n)) per scope)")
    return float(ratio)


class TopK(DeviceKernels, Compressor):
    per_process = ('_plans', '_consts')   # rebuilt in each process
    name = "topk"
    additive = False
    stochastic = False
    sparse = True

    def __init__(self, ratio: float = 0.01,      # r: fraction kept per scope; lower => fewer bytes, more error
                 scope: str = "tensor",         # tensor | bucket | global (see the module docstring)
                 bucket: int = 2048,            # scope=bucket: values per scope; smaller => k spread more evenly
                 values: str = "float32",       # float32 | float16 (half the value bytes, rounded)
                 indices: str = "int32",        # int32 | packed (ceil(log2 L) bits each)
                 kernels: str = "auto"):        # auto | triton | torch (gvq/compressors/_kernels.py)
        self.r = check_ratio(ratio)
        self.scope = check_choice("scope", scope, SCOPES, "which values compete for a scope's k")
        if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 1:
            raise ValueError(f"bucket={bucket!r}: must be a positive int (values per scope with scope=bucket)")
        self.bucket = bucket
        self.values = check_choice("values", values, tuple(VALUE_DTYPES), "the wire dtype of the kept values")
        self.indices = check_choice("indices", indices, INDICES, "how the kept positions are written")
        self.vdtype = VALUE_DTYPES[values]
        self.init_kernels(kernels)
        self.blocks: tuple[int, ...] | None = None      # the vector's parameter sizes (grouped)
        self._plans, self._consts = {}, {}
        if indices == "int32":
            self.ideal_ratio = 4.0 / (self.r * (self.vdtype.itemsize + 4))

    def triton_table(self, seg: slice, device) -> Tensor:
        """The Triton path's scope table (:func:`._triton_grace.scope_table`), made once per segment."""
        key = ("triton", seg.start, seg.stop, device)
        if key not in self._consts:
            self._consts[key] = _triton_grace.scope_table(self.plan(seg), device)
        return self._consts[key]

    def grouped(self, shapes) -> "TopK":
        if self.scope != "tensor":
            return self
        view = copy.copy(self)
        view.blocks, view._plans, view._consts = tuple(math.prod(s) for s in shapes), {}, {}
        return view

    # -- the layout: a function of (segment, blocks, knobs) only, so a receiver can size its buffer ------
    def plan(self, seg: slice) -> Plan:
        key = (seg.start, seg.stop)
        if key not in self._plans:
            self._plans[key] = self._build_plan(seg)
        return self._plans[key]

    def _scopes(self, seg: slice) -> list[tuple[int, int]]:
        n = seg.stop - seg.start
        if self.scope == "global" or n == 0:
            return [(0, n)] if n else []
        if self.scope == "bucket":
            return [(a, min(self.bucket, n - a)) for a in range(0, n, self.bucket)]
        if self.blocks is None:
            return [(0, n)]
        out, at = [], 0
        for size in self.blocks:            # the parameters' blocks, cut to the segment
            lo, hi = max(at, seg.start), min(at + size, seg.stop)
            if hi > lo:
                out.append((lo - seg.start, hi - lo))
            at += size
        return out

    def _build_plan(self, seg: slice) -> Plan:
        if self.blocks is not None and self.scope == "tensor" and sum(self.blocks) < seg.stop:
            raise ValueError(f"{self.name}: segment {seg.start}:{seg.stop} beyond its layout of {sum(self.blocks)}")
        scopes = self._scopes(seg)
        return plan_rows(seg.stop - seg.start, scopes, [self.keep(length) for _, length in scopes])

    def keep(self, length: int) -> int:
        """k of a scope of ``length`` values: max(1, floor(r * length)) (topk_chunk: its own k per chunk)."""
        return max(1, math.floor(self.r * length))

    def _index_bytes(self, plan: Plan) -> int:
        return 4 * plan.k if self.indices == "int32" else -(-plan.k * plan.bits // 8)

    def payload_spec(self, seg: slice) -> tuple[torch.dtype, int]:
        plan = self.plan(seg)
        return torch.uint8, plan.k * self.vdtype.itemsize + self._index_bytes(plan)

    def _const(self, seg: slice, device) -> dict[str, Tensor]:
        """The plan's fixed tensors on ``device``: each kept slot's scope start, the tie-breaks (``ramp``:
        the larger the lower a column), a block's offsets (``lanes``) and the row-batches' gathers."""
        key = (seg.start, seg.stop, device)
        if key not in self._consts:
            self._consts[key] = self._build_const(self.plan(seg), device)
        return self._consts[key]

    def _build_const(self, plan: Plan, device) -> dict[str, Tensor]:
        return constants(plan, device)

    # -- the codec ---------------------------------------------------------------------------------------
    def select(self, x: Tensor, seg: slice) -> Tensor:
        """The kept positions of ``x`` (``seg``'s values), relative to the segment (int64, scope order)."""
        return select(x, self.plan(seg), self._const(seg, x.device))

    def compress(self, x: Tensor, seg: slice) -> Tensor:
        x = x.reshape(-1)
        if self.plan(seg).n == 0:
            return torch.empty(0, dtype=torch.uint8, device=x.device)
        return COMPRESS(self.path(x.device), self, x, seg)

    def torch_compress(self, x: Tensor, seg: slice) -> Tensor:
        plan = self.plan(seg)
        pos = self.select(x, seg)
        vals = x[pos].to(self.vdtype).view(torch.uint8)
        local = pos - self._const(seg, x.device)["slot_start"]
        if self.indices == "int32":
            return torch.cat([local.to(torch.int32).view(torch.uint8), vals])
        return torch.cat([vals, _packing.pack_bits(local, plan.bits)])

    def checked(self, payload: Tensor, seg: slice) -> Tensor:
        """``payload`` if it is ``seg``'s (else a one-line ValueError), copied where its bytes would not view
        as 4-byte words."""
        dtype, size = self.payload_spec(seg)
        if payload.dtype != dtype or payload.numel() != size:
            raise ValueError(f"{self.name}: payload of {payload.numel()} {payload.dtype} for segment "
                             f"{seg.start}:{seg.stop}; expected {size} {dtype}")
        return payload.clone() if payload.storage_offset() % 4 else payload

    def unpack(self, payload: Tensor, seg: slice) -> tuple[Tensor, Tensor]:
        """(positions relative to the segment, int64; values in the wire dtype) of a payload."""
        plan, payload = self.plan(seg), self.checked(payload, seg)
        vbytes = plan.k * self.vdtype.itemsize
        if self.indices == "int32":
            local = payload[: 4 * plan.k].view(torch.int32).to(torch.int64)
            vals = payload[4 * plan.k:].view(self.vdtype)
        else:
            vals = payload[:vbytes].view(self.vdtype)
            local = _packing.unpack_bits(payload[vbytes:], plan.bits, plan.k)
        return local + self._const(seg, payload.device)["slot_start"], vals

    def decompress(self, payload: Tensor, seg: slice) -> Tensor:
        if self.plan(seg).n == 0:
            return torch.zeros(0, dtype=torch.float32, device=payload.device)
        return DECOMPRESS(self.path(payload.device), self, payload, seg)

    def torch_decompress(self, payload: Tensor, seg: slice) -> Tensor:
        out = torch.zeros(self.plan(seg).n, dtype=torch.float32, device=payload.device)
        pos, vals = self.unpack(payload, seg)
        out[pos] = vals.to(torch.float32)
        return out

    def entries(self, payload: Tensor, seg: slice) -> tuple[Tensor, Tensor]:
        pos, vals = self.unpack(payload, seg)       # positions are unique: one per kept slot
        return pos, vals.to(torch.float32)

    def kept(self, seg: slice) -> int:
        return self.plan(seg).k


# top-k's calls per path (``_kernels.Op``): the torch reference, and its Triton kernels (1-2 launches each)
COMPRESS = Op(torch=TopK.torch_compress, triton=_triton_grace.topk_compress)
DECOMPRESS = Op(torch=TopK.torch_decompress, triton=_triton_grace.topk_decompress)
