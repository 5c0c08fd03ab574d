"""QSGD-s (Alistarh et al. 2017), bucketed, as the ORQ paper and GradiVeQ use it.

See docs/design.md#gvqcompressorsqsgdpy for how it works and why.
"""
from __future__ import annotations

import torch

from gvq.compressors._bucketing import BucketQuantizer, max_abs_rows
from gvq.compressors._triton import L2, MAX, TritonSpec
from gvq.compressors.base import check_int


class QSGD(BucketQuantizer):
    name = "qsgd"
    stochastic = True
    n_side = 1
    side_flags_nonfinite = True    # the L2 norm is NaN/Inf if any value is
    pads = True                    # norms / maxima: zero padding changes nothing

    def __init__(self, bits: int | None = 4,        # fewer => more compression, more error
                 levels: int | None = None,         # QSGD-s by level count (odd >= 3); overrides bits
                 bucket: int | None = 2048,         # larger => fewer side floats, coarser scale
                 clip: float | None = None,         # c: clip to +-c*RMS first (biased; less range)
                 norm: str = "l2",                 # level scale: l2 (papers) | max (less error)
                 kernels: str = "auto"):           # auto | triton | torch (gvq/compressors/_kernels.py)
        super().__init__(bucket, clip, kernels)
        self.norm = norm
        if levels is None:
            check_int("bits", bits, 2, 16, " (QSGD: 1 sign bit + >= 1 magnitude bit; 1 bit is signsgd)")
            self.levels, self.dense = (1 << bits) - 1, False
        else:
            check_int("levels", levels, 3, (1 << 16) - 1)
            if levels % 2 == 0:
                raise ValueError(f"levels={levels}: QSGD needs an odd level count (symmetric, 0 included: "
                                 "3, 5, 9, ...)")
            self.levels, self.dense = levels, True
        self.half = (self.levels - 1) // 2
        self.dither_base = float(self.half)           # code = level index + L, in [0, s-1]

    def _encode(self, rows):
        if self.norm == "l2":
            norm = torch.linalg.vector_norm(rows, ord=2, dim=1, keepdim=True)
        else:   # max|v|: cheaper than torch's inf-norm
            norm = max_abs_rows(rows)
        scale = torch.where(norm > 0, self.half / norm, 0.0)     # all-zero bucket -> every code is 0
        return self.dither_floor_(rows, scale=scale), norm      # rows * scale in [-L, L]; + L in the dither

    def encode_padded(self, rows, inv_count, weights=None):
        if self.norm == "l2":
            norm = torch.linalg.vector_norm(rows, ord=2, dim=1, keepdim=True)
        else:
            norm = torch.linalg.vector_norm(rows, ord=float("inf"), dim=1, keepdim=True)
        return self.dither_div(rows, norm, value=float(self.half)), norm     # L v / norm, + L in the dither

    def triton_spec(self):
        return TritonSpec(stat=L2 if self.norm == "l2" else MAX, value=float(self.half), base=float(self.half),
                          mult=1.0 / self.half)

    def decode_batch(self, codes, side):
        return torch.addcmul(side.neg(), codes, side * (1.0 / self.half))   # (code - L) * norm / L

    def _decode(self, codes, side, out):
        step = side / self.half
        torch.mul(codes, step, out=out).sub_(step * self.half)
