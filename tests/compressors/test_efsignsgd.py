"""EF-SignSGD's codec (gvq/compressors/efsignsgd.py): ||p||_1 / d * sign(p) per tensor or bucket, and at bucket
scope the scaled SignSGD codec it reuses the formula of.  Its payload's bytes: tests/compressors/test_signs.py."""
from __future__ import annotations

import pytest
import torch

from gvq.compressors._signs import sign_groups
from gvq.compressors.efsignsgd import EFSignSGD
from gvq.compressors.signsgd import ScaledSignSGD
from tests.compressors.test_signs import NUMEL, SHAPES, _blocks, _vector


@pytest.mark.parametrize("scope,bucket", [("tensor", 2048), ("bucket", 64)])
def test_efsignsgd_is_l1_over_d_times_sign_per_scope(scope, bucket):
    codec = EFSignSGD(scope, bucket).grouped(SHAPES)
    x = _vector()
    x[3] = 0.0                                                    # sign(0) := +1
    whole = slice(0, NUMEL)
    out = codec.decompress(codec.compress(x, whole), whole)
    sizes = sign_groups(SHAPES, NUMEL, scope, bucket)
    for p, q in zip(_blocks(x, sizes), _blocks(out, sizes)):
        scale = p.abs().sum() / p.numel()
        want = torch.where(p >= 0, scale, -scale)
        assert torch.allclose(q, want, rtol=1e-6, atol=0)
    assert out[3] > 0


def test_efsignsgd_at_bucket_scope_is_scaled_signsgds_codec():
    """scope=bucket is ScaledSignSGD per bucket (the same formula, summed in another order)."""
    x, whole = _vector(1), slice(0, NUMEL)
    ours, theirs = EFSignSGD("bucket", 128), ScaledSignSGD(bucket=128, kernels="torch")
    a = ours.decompress(ours.compress(x, whole), whole)
    b = theirs.decompress(theirs.compress(x, whole), whole)
    assert torch.allclose(a, b, rtol=1e-6, atol=0)
