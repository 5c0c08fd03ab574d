"""BinGrad-pb, the ORQ paper's partially biased binary quantizer (Eq. 14-15), per bucket.

Levels {-b1, +b1}.  Values beyond them are clipped (v < -b1 -> -b1, v >= b1 -> b1: the bias); values inside
are rounded at random between the two (Eq. 14), so E[Q(v)] = clamp(v, -b1, b1): unbiased inside.

b1 follows Eq. (15), derived in the paper for a zero-mean *symmetric* density:
b1 * P(v >= 0) = E[v ; v >= b1].  Real buckets are not exactly symmetric, so we estimate the one-sided
quantities from both sides, on |v|: b1 * P(|v| >= 0) = E[|v| ; |v| >= b1], i.e. b1 = mean(|v| * [|v| >= b1]).
(Under symmetry the two are the same equation; for any bucket this one is the exact stationary point of
the error of the levels +-b1, and it uses every value rather than half of them.)  On the discrete values
f(b) = b - sum_{|v| >= b} |v| / n is increasing with upward jumps at the data, so, as the paper says, we
minimise |f(b)|: with |v| sorted descending a_1 >= a_2 >= ... and S_k = a_1 + ... + a_k, f = b - S_k / n on
(a_{k+1}, a_k]; the best b on that piece is S_k / n clamped to it, and b1 is the best over k (one sort
and one cumulative sum per bucket).

Wire: b1 (one float32) + 1 bit a value (ratio 31.5 at bucket 2048).  An all-zero bucket has b1 = 0.
"""
from __future__ import annotations

import torch

from gvq.compressors._bucketing import BucketQuantizer


def pb_level(rows: torch.Tensor) -> torch.Tensor:
    """b1 (m, 1) minimising |b1 - mean(|v| * [|v| >= b1])| per bucket."""
    a = rows.abs().sort(dim=1, descending=True).values
    n = a.shape[1]
    fit = a.double().cumsum(dim=1) / n                        # S_k / n: the root on piece k
    below = torch.nn.functional.pad(a[:, 1:], (0, 1)).double()  # a_{k+1}, a_{n+1} = 0
    best = torch.minimum(torch.maximum(fit, below), a.double())
    k = (best - fit).abs().argmin(dim=1, keepdim=True)
    return best.gather(1, k).float()


class BinGradPB(BucketQuantizer):
    name = "bingrad_pb"
    stochastic = True
    levels = 2
    n_side = 1
    dither_base = 0.5              # code 1 <=> +b1, with probability (v + b1) / 2b1

    def __init__(self, bucket: int | None = 2048,   # larger => fewer side floats, one b1 for more values
                 clip: float | None = None,       # c: clip to +-c*RMS first (rarely useful: b1 clips)
                 dither: str = "fresh"):            # fresh (independent every call) | bank (faster, correlated)
        super().__init__(bucket, clip, dither)

    def _encode(self, rows):
        b1 = pb_level(rows)
        inv = torch.where(b1 > 0, 0.5 / b1, 0.0)
        y = torch.mul(rows, inv, out=self.scratch_like("y", rows)).clamp_(-0.5, 0.5)   # Eq. 14 clip
        return self.dither_floor_(y), b1

    def _decode(self, codes, side, out):
        torch.mul(codes, 2 * side, out=out).sub_(side)
