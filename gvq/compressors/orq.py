"""ORQ-s, the ORQ paper's optimized random quantization (sec. 3.1, Algorithm 1), per bucket.

See docs/design.md#gvqcompressorsorqpy for how it works and why.
"""
from __future__ import annotations

import torch

from gvq.compressors import _fused as fused
from gvq.compressors import _triton
from gvq.compressors._bucketing import prefix_sums
from gvq.compressors._histogram import LevelFit, LevelQuantizer, bins_for, cumulative, rank_edge
from gvq.compressors.base import check_int

MAX_K = 15                         # 2**15 + 1 levels: codes still fit 16 bits


def solve_level(srt: torch.Tensor, csum: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Eq. (12) for every interval [lo, hi] (m, q) of every sorted bucket ``srt`` (m, n);
    ``csum`` (m, n+1) float64 prefix sums of ``srt``."""
    first = torch.searchsorted(srt, lo)                      # first index with v >= lo
    end = torch.searchsorted(srt, hi, right=True)            # one past the last with v <= hi
    count = end - first
    width = (hi - lo).double()
    total = csum.gather(1, end) - csum.gather(1, first)      # sum of v in [lo, hi]
    rhs = (total - lo.double() * count) / torch.where(width > 0, width, 1.0)   # R of Eq. (12)
    j = (end - 1 - rhs.floor().long()).clamp_(min=first, max=end - 1)      # (floor(R)+1)-th largest
    b = srt.gather(1, j.clamp_(0, srt.shape[1] - 1))
    return torch.where((count > 0) & (width > 0), b, (lo + hi) / 2)


def halving_rounds(s: int) -> int:
    """K of s = 2**K + 1 levels: Algorithm 1's rounds."""
    return (s - 1).bit_length() - 1


def orq_levels(srt: torch.Tensor, s: int) -> torch.Tensor:
    """Algorithm 1 on sorted buckets (m, n): (m, s) nondecreasing levels, s = 2**K + 1."""
    csum = prefix_sums(srt)
    levels = torch.stack([srt[:, 0], srt[:, -1]], dim=1)
    for _ in range(halving_rounds(s)):                                       # halve every interval once per round
        levels = interleave(levels, solve_level(srt, csum, levels[:, :-1].contiguous(), levels[:, 1:].contiguous()))
    return levels


def interleave(levels: torch.Tensor, mid: torch.Tensor) -> torch.Tensor:
    """(m, q+1) and (m, q) -> (m, 2q+1): ``mid`` between consecutive ``levels``."""
    grown = torch.empty(levels.shape[0], 2 * levels.shape[1] - 1, dtype=levels.dtype, device=levels.device)
    grown[:, 0::2], grown[:, 1::2] = levels, mid
    return grown


def orq_edges(counts: torch.Tensor, s: int) -> torch.Tensor:
    """Algorithm 1 on bucket histograms (m, bins): (m, s) nondecreasing integer edges.  Eq. (12)
    per interval [lo, hi) of edges, t in bin units: R = sum (t - lo) / (hi - lo), the level is the
    (floor(R)+1)-th largest value of the interval, placed on the edge nearest to it."""
    m, bins = counts.shape
    cum, mom = cumulative(counts)
    edges = torch.tensor([0, bins], device=counts.device).expand(m, 2)
    for _ in range(halving_rounds(s)):                               # halve every interval once per round
        lo, hi = edges[:, :-1], edges[:, 1:]
        first, end = cum.gather(1, lo), cum.gather(1, hi)
        width = (hi - lo).double()
        rhs = (mom.gather(1, hi) - mom.gather(1, lo) - lo * (end - first)) / width.clamp(min=1)
        rank = torch.minimum(torch.maximum(end - 1 - rhs.floor(), first), end - 1)
        mid = torch.minimum(torch.maximum(rank_edge(cum, counts, rank).round().long(), lo), hi)
        edges = interleave(edges, torch.where((end > first) & (hi > lo), mid, (lo + hi) // 2))
    return edges


class ORQ(LevelQuantizer):
    name = "orq"
    stochastic = True
    level_fit = LevelFit(fused.encode_orq, orq_levels, orq_edges)

    def __init__(self, levels: int = 5,             # s = 2**K + 1; fewer => more compression, more error
                 bucket: int | None = 2048,         # larger => fewer side floats, levels fit to more values
                 clip: float | None = None,        # c: clip to +-c*RMS first (narrower range, biased)
                 fit: str = "histogram",            # histogram (no sort, faster) | sorted (exact levels)
                 kernels: str = "auto"):           # auto | triton | torch (gvq/compressors/_kernels.py)
        super().__init__(bucket, clip, fit, kernels)
        check_int("levels", levels, 3, 2 ** MAX_K + 1, " (ORQ: 2^K + 1 levels)")
        k = halving_rounds(levels)
        if (1 << k) + 1 != levels:
            raise ValueError(f"levels={levels}: ORQ needs levels = 2^K + 1 (3, 5, 9, 17, ...)")
        self.levels, self.k, self.n_side = levels, k, levels

    def triton_spec(self):
        """The Triton kernels run Algorithm 1 on the histogram (few levels, no clipping); else torch."""
        if self.fit != "histogram" or self.clip or self.levels > _triton.FIT_MAX_LEVELS:
            return None
        return _triton.FitSpec("orq_fit", bins_for)

