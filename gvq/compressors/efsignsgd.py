"""EF-SignSGD's codec (Karimireddy et al., ICML 2019, ``scaled_sign`` in epfml/error-feedback-SGD):
C(p) = ||p||_1 / d * sign(p) per parameter tensor (the paper's scope) or per bucket of values; the error
feedback around it is :class:`gvq.aggregators.error_feedback.ErrorFeedbackAggregator` (``python cli.py
aggregator=efsignsgd``).

The formula is :class:`gvq.compressors.signsgd.ScaledSignSGD`'s (mean|v| * sign(v), sign(0) := +1);
``scope=bucket`` is that codec exactly (within float rounding of the mean: ``tests/compressors/
test_efsignsgd.py``), so ``aggregator=signsgd`` with the error-feedback aggregator is the same setting.
What is new is the per-tensor scope, whose ragged groups the bucket quantizers cannot carry.  Wire: one
float32 scale per group + 1 bit a value, packed (GRACE sends a byte per sign).
"""
from __future__ import annotations

import torch

from gvq.compressors._signs import GroupedSign


class EFSignSGD(GroupedSign):
    name = "efsignsgd"
    n_side = 1
    scopes = ("tensor", "bucket")

    def __init__(self, scope: str = "tensor",   # tensor (the paper) | bucket (smaller => more side floats, finer scale)
                 bucket: int = 2048,            # values per bucket (scope=bucket only)
                 kernels: str = "auto"):        # auto | triton | torch (gvq/compressors/_kernels.py)
        super().__init__(scope, bucket, kernels)

    def fit(self, x, bits, gid, counts, k):
        # s = mean|p| minimises ||p - s sign(p)||^2 for the signs sent
        return (self.group_sum(x.abs(), gid, k) / counts).reshape(k, 1)

    def decode(self, bits, side):
        scale = side[:, 0]
        return torch.where(bits, scale, scale.neg())
