"""BinGrad-b, the ORQ paper's biased binary quantizer (Eq. 16-17), per bucket: deterministic,
Q(v) = b_-1 if v < b_0 else b_1, with b_-1 and b_1 the means of the values below / at-or-above b_0.

See docs/design.md#gvqcompressorsbingrad_bpy for how it works and why.
"""
from __future__ import annotations

import torch

from gvq.compressors import _fused as fused
from gvq.compressors import _triton
from gvq.compressors._bucketing import has_data, prefix_sums
from gvq.compressors._histogram import (
    HistogramQuantizer,
    bin_counts,
    bins_for,
    cumulative,
    edge_values,
    grid_coords,
)

MAX_LLOYD = 1000                   # sorted fit's rounds are O(log n) on the sorted bucket: the cap is never the cost


def split_means(csum: torch.Tensor, below: torch.Tensor, n: int):
    """Means (float32, (m, 1) each) of the ``below`` smallest values and of the rest, from float64
    prefix sums; an empty side gets the other side's mean."""
    s_lo = csum.gather(1, below)
    total = csum[:, -1:]
    mean_lo = s_lo / below.clamp(min=1)
    mean_hi = (total - s_lo) / (n - below).clamp(min=1)
    mean_lo = torch.where(below > 0, mean_lo, mean_hi)
    mean_hi = torch.where(below < n, mean_hi, mean_lo)
    return mean_lo.float(), mean_hi.float()


def lloyd_edge(counts: torch.Tensor) -> torch.Tensor:
    """Lloyd rounds on bucket histograms (m, bins), t in bin units (a bin's values at its centre): the
    edge (m, 1) splitting the two groups, from the mean, until it stops moving.  A round is a map f of
    the edge; f is tabulated at every edge at once and composed with itself by pointer doubling (f^2,
    f^4, ... one gather each), so the fixed point the rounds reach is read in a fixed count of ops and no
    host read (a loop would ask the device "did it move?" every round).  A path through bins + 1 edges
    that reaches a fixed point does so within bins rounds, and 2^k >= bins + 1 compositions pass it."""
    m, bins = counts.shape
    cum, mom = cumulative(counts)
    n, total = cum[:, -1:], mom[:, -1:]
    mean = total / n.clamp(min=1)
    lo = torch.where(cum > 0, mom / cum.clamp(min=1), mean)          # f's two means at every edge
    hi = torch.where(cum < n, (total - mom) / (n - cum).clamp(min=1), lo)
    step = lo.add_(hi).mul_(0.5).round_().clamp_(0, bins).long()
    for _ in range(bins.bit_length()):                              # 2^k >= bins + 1 rounds
        step = step.gather(1, step)
    return step.gather(1, mean.round().long())


def side_means(rows: torch.Tensor, above: torch.Tensor, y: torch.Tensor, inv_count=None, weights=None):
    """Exact means (m, 1) of each bucket's values below and at-or-above the threshold (``above``: a
    float 0/1 mask; ``y``: a float scratch); an empty side gets the other side's mean.  float32 sums
    (torch reduces pairwise: ~1e-7 relative at 2048 values), float64 arithmetic on the sums.  A padded
    batch: ``inv_count`` (m, 1) 1 / real values a row, ``weights`` 0 on padding (``above`` is zeroed there)."""
    if weights is None:
        n, total = rows.shape[1], rows.sum(dim=1, keepdim=True).double()
    else:
        above.mul_(weights)
        n, total = inv_count.double().reciprocal_(), torch.mul(rows, weights, out=y).sum(dim=1, keepdim=True).double()
    n_hi = above.sum(dim=1, keepdim=True).double()
    s_hi = torch.mul(rows, above, out=y).sum(dim=1, keepdim=True).double()
    hi = s_hi / n_hi.clamp(min=1)
    lo = torch.where(n_hi < n, (total - s_hi) / (n - n_hi).clamp(min=1), hi)
    return lo.float(), torch.where(n_hi > 0, hi, lo).float()


class BinGradB(HistogramQuantizer):
    name = "bingrad_b"
    stochastic = False
    levels = 2
    n_side = 2
    side_flags_nonfinite = True    # b_+-1 are means: NaN/Inf propagate

    def __init__(self, threshold: str = "lloyd",    # lloyd (Eq. 17 fixed point) | mean (one pass)
                 bucket: int | None = 2048,         # larger => fewer side floats, two levels for more values
                 clip: float | None = None,         # c: clip to +-c*RMS first
                 fit: str = "histogram",            # histogram (no sort, faster) | sorted (exact)
                 kernels: str = "auto"):           # auto | triton | torch (gvq/compressors/_kernels.py)
        super().__init__(bucket, clip, fit, kernels)
        self.threshold = threshold

    def fused_kernel(self):
        return fused.encode_bingrad_b if self.threshold == "lloyd" else None

    def triton_spec(self):
        """The Triton kernels: Lloyd on the histogram, or the mean (no clipping); else torch."""
        if self.fit != "histogram" or self.clip:
            return None
        return _triton.FitSpec("bingrad_b_fit", bins_for, binary=True, mean=self.threshold == "mean")

    def _encode_histogram(self, rows, inv_count=None, weights=None):
        """Lloyd on the bucket's histogram (a threshold on a bin edge), then the exact side means."""
        if self.threshold == "mean":
            real = rows if weights is None else rows * weights
            mean = real.mean(dim=1, keepdim=True) if inv_count is None else real.sum(dim=1, keepdim=True) * inv_count
            return self._split_at(rows, mean, inv_count, weights)
        m, n = rows.shape
        bins = bins_for(n)
        lo, hi = torch.aminmax(rows, dim=1, keepdim=True)
        idx = self.scratch_like("idx", rows, torch.int32)
        sc = grid_coords(rows, lo, hi, bins, self.scratch_like("y", rows), idx, self.health)
        b0 = edge_values(lloyd_edge(bin_counts(idx, m, bins, weights)), lo, hi, sc, bins)
        return self._split_at(rows, b0, inv_count, weights)

    def _split_at(self, rows, b0, inv_count=None, weights=None):
        """Codes 1 at or above the threshold b0 (m, 1), side (m, 2) the exact means of both sides."""
        above = torch.ge(rows, b0, out=self.scratch_like("above", rows))   # float: bool ops are slower
        lo, hi = side_means(rows, above, self.scratch_like("y", rows), inv_count, weights)
        codes = self.scratch_like("codes", rows, torch.uint8).copy_(above)
        return codes, torch.cat([lo, hi], dim=1)

    def _encode_sorted(self, rows):
        """Lloyd on the sorted bucket: a partition at b0 is the count of values below it (a binary
        search), group sums come from prefix sums; equal counts => same partition => fixed point.
        (``mean``: no fit to make, the same as the histogram fit.)"""
        if self.threshold == "mean":
            return self._encode_histogram(rows)
        srt = rows.sort(dim=1).values
        n = srt.shape[1]
        csum = prefix_sums(srt)
        b0 = (csum[:, -1:] / n).float()                 # start: the mean
        below = torch.searchsorted(srt, b0)
        lo, hi = split_means(csum, below, n)
        for _ in range(MAX_LLOYD):
            b0 = (lo + hi) / 2
            again = torch.searchsorted(srt, b0)
            if has_data(srt) and torch.equal(again, below):   # (meta: shapes only, no test)
                break
            below = again
            lo, hi = split_means(csum, below, n)
        codes = torch.ge(rows, b0, out=self.scratch_like("codes", rows, torch.bool))
        return codes.view(torch.uint8), torch.cat([lo, hi], dim=1)

    def _decode(self, codes, side, out):
        torch.where(codes.bool(), side[:, 1:], side[:, :1], out=out)   # exact levels, no a + (b - a)
