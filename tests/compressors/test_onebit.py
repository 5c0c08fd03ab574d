"""1-bit SGD's codec (gvq/compressors/onebit.py): the two means per tensor or row, each group's sum kept.
Its payload's bytes: tests/compressors/test_signs.py."""
from __future__ import annotations

import pytest
import torch

from gvq.compressors._signs import sign_groups
from gvq.compressors.efsignsgd import EFSignSGD
from gvq.compressors.onebit import OneBit
from tests.compressors.test_signs import NUMEL, SHAPES, _blocks, _vector


@pytest.mark.parametrize("scope", ["tensor", "column"])
def test_onebit_sends_the_two_means_and_keeps_each_groups_sum(scope):
    codec = OneBit(scope).grouped(SHAPES)
    x, whole = _vector(2), slice(0, NUMEL)
    out = codec.decompress(codec.compress(x, whole), whole)
    sizes = sign_groups(SHAPES, NUMEL, scope, 0)
    for p, q in zip(_blocks(x.double(), sizes), _blocks(out.double(), sizes)):
        pos, neg = p[p >= 0], p[p < 0]
        want = torch.where(p >= 0, pos.mean() if pos.numel() else 0.0, neg.mean() if neg.numel() else 0.0)
        assert torch.allclose(q, want, rtol=1e-5, atol=1e-7)
        assert abs(float(q.sum() - p.sum())) <= 1e-5 * float(p.abs().sum())   # the property: sum kept
    assert abs(float(out.double().sum() - x.double().sum())) <= 1e-5 * float(x.abs().sum())


def test_onebit_one_sided_and_zero_groups_decode_finitely_and_err_no_more_than_scaled_sign():
    whole = slice(0, 12)
    codec = OneBit().grouped([(4,), (4,), (4,)])
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -6.0])
    out = codec.decompress(codec.compress(x, whole), whole)
    assert torch.equal(out, torch.tensor([2.5] * 4 + [0.0] * 4 + [-3.0] * 4))
    y, whole = _vector(3), slice(0, NUMEL)
    two = OneBit().grouped(SHAPES)
    one = EFSignSGD().grouped(SHAPES)
    err = [float((c.decompress(c.compress(y, whole), whole) - y).pow(2).sum()) for c in (two, one)]
    assert err[0] <= err[1]
