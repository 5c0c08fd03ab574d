"""The one building block under the 1-bit codecs with values per group (EF-SignSGD's scaled sign, 1-bit SGD's
two means): groups of a flat vector (each parameter tensor, each row of a weight, or fixed buckets), bits
packed 8 per byte, and a few float32 values per group.  A codec states only how its group's values
are fit (``fit``); splitting, packing and decoding live here, each a fixed few whole-tensor ops.

Wire format of a segment with k groups and n values: k x ``n_side`` float32 (little-endian, the group's
values in order), then ceil(n / 8) bytes of bits, value i at bit i % 8 of byte i // 8.  Bit 1: the value
is >= 0 (sign(0) := +1, one bit has no room for a third symbol: :mod:`gvq.compressors.signsgd`'s rule).
Kernels (``kernels``): the torch ops here are the reference; the Triton path
(:mod:`gvq.compressors._triton_grace`) writes the same layout, and either path decodes the other's payload.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import Tensor

from gvq.compressors import _packing, _triton_grace
from gvq.compressors._kernels import TORCH, DeviceKernels, Op
from gvq.compressors.base import Compressor, check_choice


def pack_signs(bits: Tensor) -> Tensor:
    """(n,) bool -> (ceil(n / 8),) uint8: :func:`gvq.compressors._packing.pack_bits` at one bit a value
    (value i at bit i % 8 of byte i // 8, zero padding)."""
    return _packing.pack_bits(bits, 1)


def unpack_signs(packed: Tensor, n: int) -> Tensor:
    """Inverse of :func:`pack_signs`: the first ``n`` bits as (n,) bool."""
    return _packing.unpack_flags(packed, n)


def sign_groups(shapes: list[tuple[int, ...]] | None, numel: int, scope: str, bucket: int) -> list[int]:
    """Sizes of the groups of a vector made of tensors of ``shapes`` (None: one tensor of ``numel``).
    ``tensor``: one per tensor; ``column``: one per row of ``t.view(t.shape[0], -1)`` for 2-D and
    larger tensors (one output unit's weights: the contiguous unit, as CNTK's column in its
    column-major matrices), one per 1-D tensor; ``bucket``: ``bucket`` values each, over the vector."""
    if scope == "bucket":
        return [min(bucket, numel - at) for at in range(0, numel, bucket)]
    shapes = [(numel,)] if shapes is None else shapes
    sizes = []
    for shape in shapes:
        n = math.prod(shape)
        if scope == "column" and len(shape) >= 2 and n:
            sizes += [n // shape[0]] * shape[0]
        elif n:
            sizes.append(n)
    return sizes


class GroupedSign(DeviceKernels, Compressor):
    """Base of the grouped 1-bit codecs: subclasses set ``name``, ``n_side``, ``scopes`` and implement
    :meth:`fit` (the group values from per-group sums) and :meth:`decode` (bits and values to floats)."""

    n_side: int = 1
    scopes: tuple[str, ...] = ("tensor",)

    def __init__(self, scope: str, bucket: int = 2048, kernels: str = "auto"):
        self.scope = check_choice("scope", scope, self.scopes, "which values share the side floats")
        self.bucket = bucket
        self.shapes, self._plans = None, {}
        self.init_kernels(kernels)

    @property
    def ideal_ratio(self) -> float:
        return 32.0

    def grouped(self, shapes):
        """A copy that knows the tensors the vector is made of (its groups)."""
        out = copy.copy(self)
        out.shapes, out._plans = [tuple(s) for s in shapes], {}
        return out

    def _plan(self, seg: slice, device) -> tuple[Tensor, Tensor, int]:
        """(group index of each of ``seg``'s values, values per group, k), kept per segment and device
        (built once on the host: the boundaries are the layout's, not the data's)."""
        key = (seg.start, seg.stop, str(device))
        if key not in self._plans:
            total = seg.stop if self.shapes is None else sum(math.prod(s) for s in self.shapes)
            bounds, at = [], 0
            for size in sign_groups(self.shapes, total, self.scope, self.bucket):
                lo, hi = max(at, seg.start), min(at + size, seg.stop)
                if hi > lo:
                    bounds.append(hi - lo)
                at += size
            counts = torch.tensor(bounds, dtype=torch.int64)
            gid = torch.repeat_interleave(torch.arange(len(bounds)), counts)
            self._plans[key] = (gid.to(device), counts.to(device=device, dtype=torch.float32), len(bounds))
            self._plans[("sizes", *key)] = bounds
        return self._plans[key]

    def triton_table(self, seg: slice, device) -> tuple[Tensor, Tensor]:
        """The Triton path's group table and each value's group (``_triton_grace.group_table``), made once
        per segment and device."""
        key = ("triton", seg.start, seg.stop, str(device))
        if key not in self._plans:
            self._plan(seg, "cpu")
            self._plans[key] = _triton_grace.group_table(self._plans[("sizes", seg.start, seg.stop, "cpu")], device)
        return self._plans[key]

    def payload_spec(self, seg: slice) -> tuple[torch.dtype, int]:
        n = seg.stop - seg.start
        k = self._plan(seg, "cpu")[2]
        return torch.uint8, 4 * self.n_side * k + math.ceil(n / 8)

    def compress(self, x: Tensor, seg: slice) -> Tensor:
        x = x.reshape(-1).to(torch.float32)
        return COMPRESS(self.path(x.device) if x.numel() else TORCH, self, x, seg)

    def torch_compress(self, x: Tensor, seg: slice) -> Tensor:
        gid, counts, k = self._plan(seg, x.device)
        bits = x >= 0
        side = self.fit(x, bits, gid, counts, k)                # (k, n_side)
        return torch.cat([side.reshape(-1).view(torch.uint8), pack_signs(bits)])

    def decompress(self, payload: Tensor, seg: slice) -> Tensor:
        return DECOMPRESS(self.path(payload.device) if seg.stop > seg.start else TORCH, self, payload, seg)

    def torch_decompress(self, payload: Tensor, seg: slice) -> Tensor:
        n = seg.stop - seg.start
        gid, _, k = self._plan(seg, payload.device)
        head = 4 * self.n_side * k
        side = payload[:head].clone().view(torch.float32).view(k, self.n_side)   # clone: 4-byte aligned
        # index_select, not side[gid]: advanced indexing is ~9x slower on a gradient's length on one CPU core
        return self.decode(unpack_signs(payload[head:], n), side.index_select(0, gid))

    @staticmethod
    def group_sum(values: Tensor, gid: Tensor, k: int) -> Tensor:
        """Per-group sums of ``values`` (one index_add: no loop over groups)."""
        return torch.zeros(k, dtype=values.dtype, device=values.device).index_add_(0, gid, values)

    def fit(self, x: Tensor, bits: Tensor, gid: Tensor, counts: Tensor, k: int) -> Tensor:
        raise NotImplementedError

    def decode(self, bits: Tensor, side: Tensor) -> Tensor:
        """``side``: (n, n_side), each value's group's floats."""
        raise NotImplementedError


# the grouped codecs' calls per path (``_kernels.Op``): the torch reference above, and its Triton kernels
COMPRESS = Op(torch=GroupedSign.torch_compress,
              triton=lambda q, x, seg: _triton_grace.grouped_compress(q, x.contiguous(), seg))
DECOMPRESS = Op(torch=GroupedSign.torch_decompress, triton=_triton_grace.grouped_decompress)
