"""BinGrad-b, the ORQ paper's biased binary quantizer (Eq. 16-17), per bucket: deterministic,
Q(v) = b_-1 if v < b_0 else b_1, with b_-1 and b_1 the means of the values below / at-or-above b_0.

``threshold`` picks b_0:
* ``lloyd`` (default): Lloyd iterations (1-D 2-means) from b_0 = mean, b_0 <- (b_-1 + b_1) / 2, until the
  partition stops changing in every bucket: the fixed point of Eq. (17), where all three conditions hold
  (the paper's optimality condition; b_0 is then exactly (b_-1 + b_1) / 2 in float32).  Gaussian buckets
  take ~13 rounds, Laplacian ~45, each a binary search on the sorted bucket; capped at ``MAX_LLOYD``.
* ``mean``: b_0 = the bucket mean, the paper's "for ease of implementation" variant (one round).

Biased, the lowest error of the binary quantizers.  Wire: b_-1, b_1 (two float32) + 1 bit a value
(ratio 31.0 at bucket 2048).  A bucket whose values all fall on one side sends that group's mean twice.
"""
from __future__ import annotations

import torch

from gvq.compressors._bucketing import BucketQuantizer, has_data, prefix_sums

MAX_LLOYD = 1000                   # rounds are O(log n) on the sorted bucket: the cap is never the cost
THRESHOLDS = ("lloyd", "mean")


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


class BinGradB(BucketQuantizer):
    name = "bingrad_b"
    stochastic = False
    levels = 2
    n_side = 2
    side_flags_nonfinite = True    # b_+-1 are means: NaN/Inf propagate

    def __init__(self, threshold: str = "lloyd",    # lloyd (Eq. 17 fixed point) | mean (one pass)
                 bucket: int | None = 2048,         # larger => fewer side floats, two levels for more values
                 clip: float | None = None):        # c: clip to +-c*RMS first
        super().__init__(bucket, clip)
        if threshold not in THRESHOLDS:
            raise ValueError(f"threshold={threshold!r}: must be one of {', '.join(THRESHOLDS)}")
        self.threshold = threshold

    def _encode(self, rows):
        """Lloyd on the sorted bucket: a partition at b0 is the count of values below it (a binary
        search), group sums come from prefix sums; equal counts => same partition => fixed point."""
        srt = rows.sort(dim=1).values
        n = srt.shape[1]
        csum = prefix_sums(srt)
        b0 = (csum[:, -1:] / n).float()                 # start: the mean
        below = torch.searchsorted(srt, b0)
        lo, hi = split_means(csum, below, n)
        for _ in range(MAX_LLOYD if self.threshold == "lloyd" else 0):
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
