"""Scaled SignSGD (the ORQ paper's Eq. 13), per bucket: Q(G) = ||G||_1 / dim(G) * sign(G).

Deterministic and biased.  Wire: the scale mean|v| (one float32) + 1 bit a value, 8 per byte (ratio 31.5 at
bucket 2048).  sign(0) := +1 (zeros, -0.0 included, are sent as +scale): one bit has no room for a third
symbol, and +1 matches BinGrad-b's rule ``v >= b_0 -> b_1`` (Eq. 16).  An all-zero bucket has scale 0 and
decodes to exact zeros.
"""
from __future__ import annotations

import torch

from gvq.compressors._bucketing import BucketQuantizer
from gvq.compressors._triton import MEAN, TritonSpec


class ScaledSignSGD(BucketQuantizer):
    name = "signsgd"
    stochastic = False
    levels = 2
    n_side = 1
    side_flags_nonfinite = True    # mean|v| is NaN/Inf if any value is
    pads = True                    # the mean counts real values only (encode_padded)

    def __init__(self, bucket: int | None = 2048,   # larger => fewer side floats, one scale for more values
                 clip: float | None = None,        # c: clip to +-c*RMS first (lowers the scale)
                 kernels: str = "auto"):           # auto | triton | torch (gvq/compressors/_kernels.py)
        super().__init__(bucket, clip, kernels)

    def _encode(self, rows):
        scale = rows.abs().mean(dim=1, keepdim=True)
        codes = torch.ge(rows, 0, out=self.scratch_like("codes", rows, torch.bool))
        return codes.view(torch.uint8), scale

    def encode_padded(self, rows, inv_count, weights=None):
        scale = torch.linalg.vector_norm(rows, ord=1, dim=1, keepdim=True).mul_(inv_count)
        codes = torch.ge(rows, 0, out=self.scratch_like("codes", rows, torch.bool))
        return codes.view(torch.uint8), scale

    def triton_spec(self):
        return TritonSpec(stat=MEAN, value=0.0, base=0.0, mult=2.0, sign=True)   # mean|v|; v >= 0

    def decode_batch(self, codes, side):
        return torch.addcmul(side.neg(), codes, side * 2)                       # +-scale

    def _decode(self, codes, side, out):
        torch.mul(codes, 2 * side, out=out).sub_(side)   # 2*side - side == side exactly: no rounding
