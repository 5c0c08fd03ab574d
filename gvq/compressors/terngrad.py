"""TernGrad (Wen et al. 2017), bucketed: levels {-s_t, 0, s_t} with s_t = max|v| of the bucket, each value
rounded at random to a neighbouring level (Eq. 7; s_t * sign(v) * Bernoulli(|v| / s_t)): unbiased.
Wire: s_t (one float32) + base-3 codes, 5 per byte (1.6 bits a value; ratio 19.8 at bucket 2048).

TernGrad's gradient clipping, ``clip=c`` (c = 2.5 in its paper): values clipped to +-c*RMS of the bucket
first (see :mod:`.bucketing`), which shrinks s_t and the error at the price of a bias on the outliers.
The ORQ paper's CIFAR runs ("TernGrad-noclip") use no clipping: the default here.
"""
from __future__ import annotations

import torch

from gvq.compressors._bucketing import BucketQuantizer, max_abs_rows
from gvq.compressors._triton import MAX, TritonSpec


class TernGrad(BucketQuantizer):
    name = "terngrad"
    stochastic = True
    levels = 3
    n_side = 1
    dither_base = 1.0              # code = level index + 1, in {0, 1, 2}
    side_flags_nonfinite = True
    pads = True                    # norms / maxima: zero padding changes nothing    # max|v| is NaN/Inf if any value is

    def __init__(self, bucket: int | None = 2048,   # larger => fewer side floats, larger s_t, more error
                 clip: float | None = None,       # c: clip to +-c*RMS first; smaller => more bias
                 kernels: str = "auto"):          # auto | triton | torch (gvq/compressors/_kernels.py)
        super().__init__(bucket, clip, kernels)

    def _encode(self, rows):
        st = max_abs_rows(rows)
        return self.dither_floor_(rows, scale=torch.where(st > 0, 1.0 / st, 0.0)), st

    def encode_padded(self, rows, inv_count, weights=None):
        """One reduction for s_t and one op for v / s_t + dither (``dither_div``)."""
        st = torch.linalg.vector_norm(rows, ord=float("inf"), dim=1, keepdim=True)
        return self.dither_div(rows, st), st

    def triton_spec(self):
        return TritonSpec(stat=MAX, value=1.0, base=1.0, mult=1.0)         # v / s_t, + 1 in the dither

    def decode_batch(self, codes, side):
        return torch.addcmul(side.neg(), codes, side)                         # (code - 1) * s_t

    def _decode(self, codes, side, out):
        torch.mul(codes, side, out=out).sub_(side)
