"""Random-k sparsification with indices every rank draws alike, so none is sent: ``python cli.py
aggregator=randomk`` (unscaled, with error feedback: the anchors' form), or the unbiased form without
(``aggregator.compressor.scale=true aggregator._target_=gvq.aggregators.compressed.CompressedAggregator``).

Per bucket of ``bucket`` values (its scope), k = max(1, floor(ratio * n)) positions, without replacement:
the k smallest of a 64-bit hash of (the run's seed, the iteration, the vector, the position), a counter
the aggregator names per vector (``Compressor.begin_vector``).  So the draw is a pure function of what
every rank knows alike, fresh each iteration and vector, never of call order (GRACE's per-tensor counter
desynchronises when a rank skips a tensor), and the global torch RNG is never touched (GRACE's
``torch.manual_seed`` per tensor makes dropout the same on every rank).  A bucket's positions are its own
(counted from the bucket's start in its vector), so a ring segment, made of whole buckets, draws what the
whole vector's allgather draws.  The wire: the k values, float32, 4k bytes per bucket; every rank picks
the same positions, so payloads add up (``additive``): the summing ring (mode b) carries them.

``scale=true`` multiplies by n/k: unbiased, E||C(g)||^2 = (n/k)||g||^2 (at 1%, 100 times the energy).
``scale=false`` (the default) sends the values as they are: biased, a contraction, so it needs error
feedback (GRACE ResNet-20 at 1%: 0.554 without, 0.883 with; notes section 2.2).  NaN/Inf inputs (or sums
past float32) raise at the iteration's check.

Each bucket's positions are in index order on every path, so payloads of the torch and the Triton path
(``kernels``: :mod:`gvq.compressors._triton_grace`) are the same bytes and either decodes the other's.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gvq.compressors import _triton_grace
from gvq.compressors._kernels import TORCH, DeviceKernels, Op
from gvq.compressors._packing import split_rows
from gvq.compressors.base import Compressor, Health, check_bucket

GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)      # 2^64 / phi, as int64: consecutive positions spread apart
MIX = (0xFF51AFD7ED558CCD - (1 << 64), 0xC4CEB9FE1A85EC53 - (1 << 64))   # murmur3's 64-bit finaliser
LOW31 = (1 << 31) - 1                         # (z >> 33) & LOW31: a logical shift of an int64 (torch's is arithmetic)


def _mix64(z: Tensor) -> Tensor:
    """murmur3's fmix64 in place on int64 (products wrap mod 2^64): every output bit depends on every
    input bit, so the hashes of consecutive counters serve as independent uniform draws."""
    for m in (*MIX, None):
        z.bitwise_xor_(torch.bitwise_right_shift(z, 33).bitwise_and_(LOW31))
        if m is not None:
            z.mul_(m)
    return z


def shared_key(seed: int, iteration: int, vector: int) -> int:
    """The counter's high part, one int64 of (seed, iteration, vector), on the host once per vector: each
    folded in, then mixed, so (1, 2, 3) and (2, 1, 3) differ."""
    acc = torch.zeros(1, dtype=torch.int64)
    for part in (seed, iteration, vector):
        acc = _mix64(acc.add_(int(part)).mul_(GOLDEN))
    return int(acc)


class RandomK(DeviceKernels, Compressor):
    per_process = ('_picked', '_golden', '_tables')   # rebuilt in each process
    name = "randomk"
    additive = True            # the same positions on every rank: the k values of each add up
    stochastic = False         # no per-rank randomness: the draw is shared (begin_vector), nothing to seed

    def __init__(self, ratio: float = 0.01,      # k / n per bucket; lower => fewer bytes, more variance or residual
                 bucket: int | None = 4096,      # values per scope (k drawn in each); null => one per segment
                 scale: bool = False,            # true: x n/k, unbiased (no EF); false: as is, needs EF
                 kernels: str = "auto"):         # auto | triton | torch (gvq/compressors/_kernels.py)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ValueError(f"ratio={ratio!r}: must be in (0, 1] (the fraction of each bucket's values sent)")
        # not self.ratio: Compressor.ratio(numel) is the achieved ratio every tool reads
        self.keep, self.bucket, self.scale = float(ratio), check_bucket(bucket), bool(scale)
        # a long vector's ratio: a bucket's n / k (floor(ratio * n) can sit below ratio * n)
        self.ideal_ratio = self.bucket / self.count(self.bucket) if self.bucket else 1.0 / self.keep
        self.init_kernels(kernels)
        self._tables = {}
        self.key = shared_key(0, 0, 0)
        self.health = Health("sum")     # the inputs' sums since the last check: NaN/Inf stay so
        self._picked: dict = {}         # (start, stop, device) -> positions, for the present key only
        self._golden: dict = {}         # (start, stop, device) -> the counters times GOLDEN (_counters)

    def triton_table(self, seg: slice, device) -> tuple[Tensor, Tensor]:
        """The Triton path's bucket table (``_triton_grace.slot_table``) and each bucket's n/k (float32),
        constants of the segment, made once per device."""
        cache = (seg.start, seg.stop, torch.device(device))
        if cache not in self._tables:
            sizes = [b for m, b in self._scopes(seg.stop - seg.start) for _ in range(m)]
            starts, ks = [sum(sizes[:i]) for i in range(len(sizes))], [self.count(b) for b in sizes]
            self._tables[cache] = (_triton_grace.slot_table(starts, sizes, ks, device),
                                   torch.tensor([b / k for b, k in zip(sizes, ks)], dtype=torch.float32,
                                                device=device))
        return self._tables[cache]

    def begin_vector(self, seed: int, iteration: int, vector: int) -> None:
        key = shared_key(seed, iteration, vector)
        if key != self.key:
            self.key, self._picked = key, {}

    def check_health(self) -> None:
        total = self.health.read()
        if total is not None and not math.isfinite(total):
            raise ValueError(f"{self.name}: input gradient has NaN or Inf values (or sums past float32); "
                             "refusing to send them")

    def cuts(self, numel: int) -> list[int]:
        if self.bucket == 0:
            return list(range(numel + 1))
        return list(range(0, numel, self.bucket)) + [numel]

    def count(self, n: int) -> int:
        """k of a scope of ``n`` values (0 for none)."""
        return max(1, math.floor(self.keep * n)) if n else 0

    def _scopes(self, n: int) -> list[tuple[int, int]]:
        """(rows, values per row) of a segment of ``n`` values: its full buckets, then the ragged tail."""
        b = self.bucket if self.bucket and self.bucket < n else n
        rows = [(n // b, b)] if n else []
        if n and n % b:
            rows.append((1, n % b))
        return rows

    def payload_spec(self, seg: slice) -> tuple[torch.dtype, int]:
        return torch.float32, sum(m * self.count(b) for m, b in self._scopes(seg.stop - seg.start))

    def positions(self, seg: slice, device) -> Tensor:
        """The positions (in ``seg``, int64) every rank sends for the present key: per bucket, its k
        smallest hashes of (key, position in the bucket's vector), in index order."""
        cache = (seg.start, seg.stop, torch.device(device))
        if cache not in self._picked:
            n = seg.stop - seg.start
            path = self.path(device) if n else TORCH
            self._picked[cache] = POSITIONS(path, self, seg, device)
        return self._picked[cache]

    def torch_positions(self, seg: slice, device) -> Tensor:
        n = seg.stop - seg.start
        h = _mix64(torch.add(self._counters(seg, device), self.key))
        parts, offset = [], 0
        for rows, (m, b) in zip(split_rows(h, self.bucket), self._scopes(n)):
            k = self.count(b)
            top = torch.topk(rows, k, dim=1, largest=False, sorted=False).indices.sort(dim=1).values
            top += torch.arange(offset, offset + m * b, b, device=device).view(m, 1)
            parts.append(top.reshape(-1))
            offset += m * b
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64, device=device)

    def _counters(self, seg: slice, device) -> Tensor:
        """Each position's counter times GOLDEN (int64, wrapping): fixed per segment, so made once, and a
        key's hashes start with one add, not an arange and a product over the segment."""
        key = (seg.start, seg.stop, torch.device(device))
        if key not in self._golden:
            self._golden[key] = torch.arange(seg.start, seg.stop, dtype=torch.int64, device=device).mul_(GOLDEN)
        return self._golden[key]

    def compress(self, x: Tensor, seg: slice) -> Tensor:
        x = x.reshape(-1)
        return COMPRESS(self.path(x.device) if x.numel() else TORCH, self, x, seg)

    def torch_compress(self, x: Tensor, seg: slice) -> Tensor:
        if x.numel():
            self.health.note(x.sum(dtype=torch.float32))
        values = torch.take(x, self.positions(seg, x.device)).to(torch.float32)
        if self.scale:                # n/k per scope: full buckets, then the tail's own
            start = 0
            for m, b in self._scopes(x.numel()):
                k = self.count(b)
                values[start: start + m * k] *= b / k
                start += m * k
        return values

    def decompress(self, payload: Tensor, seg: slice) -> Tensor:
        _, k = self.payload_spec(seg)
        if payload.numel() != k:
            raise ValueError(f"{self.name}: payload of {payload.numel()} values for a segment of "
                             f"{seg.stop - seg.start}; expected {k}")
        return DECOMPRESS(self.path(payload.device) if k else TORCH, self, payload, seg)

    def torch_decompress(self, payload: Tensor, seg: slice) -> Tensor:
        out = torch.zeros(seg.stop - seg.start, dtype=torch.float32, device=payload.device)
        return out.index_copy_(0, self.positions(seg, payload.device), payload.to(torch.float32))


# random-k's calls per path (``_kernels.Op``): the torch reference, and its Triton kernels
POSITIONS = Op(torch=RandomK.torch_positions, triton=_triton_grace.randomk_positions)
COMPRESS = Op(torch=RandomK.torch_compress,
              triton=lambda q, x, seg: _triton_grace.randomk_compress(q, x.contiguous(), seg))
DECOMPRESS = Op(torch=RandomK.torch_decompress, triton=_triton_grace.randomk_decompress)
