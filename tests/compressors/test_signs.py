"""The grouped 1-bit codecs' shared layer (gvq/compressors/_signs.py): bits packed 8 per byte, the groups a
vector's tensors make, and EF-SignSGD's and 1-bit SGD's payloads (gvq/compressors/efsignsgd.py,
onebit.py): their values, their bytes, and what they preserve."""
from __future__ import annotations

import math

import pytest
import torch

from gvq.compressors._signs import pack_signs, sign_groups, unpack_signs
from gvq.compressors.efsignsgd import EFSignSGD
from gvq.compressors.onebit import OneBit

SHAPES = [(6, 2, 3, 3), (6,), (5, 6, 3, 3), (1,), (10, 7)]
NUMEL = sum(math.prod(s) for s in SHAPES)


def _vector(seed=0):
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(seed))


def _blocks(x, sizes):
    return list(torch.split(x, sizes))


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000])
def test_bits_pack_eight_per_byte_and_round_trip(n):
    bits = torch.rand(n, generator=torch.Generator().manual_seed(n)) > 0.5
    packed = pack_signs(bits)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(n / 8)
    assert torch.equal(unpack_signs(packed, n), bits)
    if n >= 8:          # value i at bit i % 8 of byte i // 8
        assert int(packed[0]) == sum(int(b) << i for i, b in enumerate(bits[:8]))


def test_groups_are_tensors_rows_of_weights_or_buckets():
    assert sign_groups(SHAPES, NUMEL, "tensor", 0) == [108, 6, 270, 1, 70]
    assert sign_groups(SHAPES, NUMEL, "column", 0) == [18] * 6 + [6] + [54] * 5 + [1] + [7] * 10
    assert sign_groups(SHAPES, NUMEL, "bucket", 100) == [100] * 4 + [55]
    assert sign_groups(None, 12, "tensor", 0) == [12]            # shapes unknown: the vector is one tensor


@pytest.mark.parametrize("make,n_side,scope", [(EFSignSGD, 1, "tensor"), (OneBit, 2, "tensor"),
                                               (OneBit, 2, "column"), (EFSignSGD, 1, "bucket")])
def test_payload_is_one_bit_a_value_plus_side_floats_per_group(make, n_side, scope):
    codec = make(scope).grouped(SHAPES)
    groups = len(sign_groups(SHAPES, NUMEL, scope, 2048))
    whole = slice(0, NUMEL)
    want = math.ceil(NUMEL / 8) + 4 * n_side * groups
    payload = codec.compress(_vector(), whole)
    assert payload.dtype == torch.uint8 and payload.numel() == want == codec.payload_nbytes(whole)
    part = slice(100, 400)            # a segment cuts its groups: only those it holds are sent
    ends = torch.tensor(sign_groups(SHAPES, NUMEL, scope, 2048)).cumsum(0)
    held = int(((ends > part.start) & (ends - torch.tensor(sign_groups(SHAPES, NUMEL, scope, 2048)) < part.stop)).sum())
    assert codec.payload_nbytes(part) == math.ceil(300 / 8) + 4 * n_side * held
    assert codec.compress(_vector()[part], part).numel() == codec.payload_nbytes(part)
