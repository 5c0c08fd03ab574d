"""Linear-s (the ORQ paper's naive baseline, as in Deep Compression): s levels at equal steps of the
bucket's empirical CDF, i.e. its quantiles 0, 1/(s-1), ..., 1 (min and max included, linear interpolation
between order statistics as ``numpy.quantile``), each value rounded at random to a neighbouring level
(Eq. 7): unbiased.  Every level gets about the same number of values, which wastes levels where the
density is high (the paper's Fig. 1).

Wire: the s levels (s float32 a bucket) + base-s codes (``bucketing.word_format``: s=5 -> 2.35 bits a
value, s=9 -> 3.2).  No sort: ``Linear`` reads the quantiles off each bucket's histogram (``_histogram``:
levels on the edge nearest each quantile, within one bin of it; rounding by table lookup).
``fit: sorted`` keeps the exact quantiles (``quantile_levels``, one sort per bucket).
"""
from __future__ import annotations

import torch

from gvq.compressors import _fused as fused
from gvq.compressors import _triton
from gvq.compressors._packing import MAX_LEVELS
from gvq.compressors._histogram import LevelFit, LevelQuantizer, bins_for, cumulative, rank_edge
from gvq.compressors.base import check_int


def quantile_levels(sorted_rows: torch.Tensor, s: int) -> torch.Tensor:
    """(m, s) quantiles j/(s-1) of each sorted row, linearly interpolated between order statistics."""
    n = sorted_rows.shape[1]
    pos = torch.linspace(0, n - 1, s, dtype=torch.float64, device=sorted_rows.device)
    lo = pos.floor().long()
    hi = torch.clamp(lo + 1, max=n - 1)
    frac = (pos - lo).float()
    a, b = sorted_rows[:, lo], sorted_rows[:, hi]
    return torch.lerp(a, b, frac).clamp_(min=a, max=b)   # clamp: lerp round-off must not leave [a, b]


def quantile_edges(counts: torch.Tensor, s: int) -> torch.Tensor:
    """(m, s) integer edges nearest the quantiles j/(s-1) of each bucket histogram (m, bins): first 0,
    last ``bins`` (min and max exactly)."""
    m, bins = counts.shape
    cum, _ = cumulative(counts)
    frac = torch.linspace(0, 1, s, dtype=torch.float64, device=counts.device)
    edges = rank_edge(cum, counts, frac * (cum[:, -1:] - 1)).round().long()
    edges[:, 0], edges[:, -1] = 0, bins
    return edges


class Linear(LevelQuantizer):
    name = "linear"
    stochastic = True
    level_fit = LevelFit(fused.encode_linear, quantile_levels, quantile_edges)

    def __init__(self, levels: int = 5,             # fewer => more compression, more error
                 bucket: int | None = 2048,         # larger => fewer side floats, coarser quantiles
                 clip: float | None = None,        # c: clip to +-c*RMS first (narrower range, biased)
                 fit: str = "histogram",            # histogram (no sort, faster) | sorted (exact levels)
                 kernels: str = "auto"):           # auto | triton | torch (gvq/compressors/_kernels.py)
        super().__init__(bucket, clip, fit, kernels)
        self.levels = check_int("levels", levels, 2, MAX_LEVELS, " (Linear-s: s quantile levels)")
        self.n_side = self.levels

    def triton_spec(self):
        """The Triton kernels fit the histogram's quantiles (few levels, no clipping); else torch."""
        if self.fit != "histogram" or self.clip or self.levels > _triton.FIT_MAX_LEVELS:
            return None
        return _triton.FitSpec("linear_fit", bins_for)
