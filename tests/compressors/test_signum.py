"""Signum's vote codec (gvq/compressors/signum.py): both wire formats carry the same +-1 votes; int8's add up."""
from __future__ import annotations

import math

import pytest
import torch

from gvq.compressors.signum import SignVote


@pytest.mark.parametrize("n", [1, 8, 13, 1000])
def test_both_votes_decode_to_the_same_signs_zero_voting_up(n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    x[0] = 0.0
    seg = slice(0, n)
    votes = [c.decompress(c.compress(x, seg), seg) for c in (SignVote("int8"), SignVote("bits"))]
    assert torch.equal(votes[0], votes[1])
    assert torch.equal(votes[0], torch.where(x >= 0, 1.0, -1.0))


def test_int8_votes_add_in_the_compressed_domain_and_bits_are_packed():
    seg = slice(0, 20)
    int8, bits = SignVote("int8"), SignVote("bits")
    assert int8.additive and not bits.additive
    xs = [torch.randn(20, generator=torch.Generator().manual_seed(k)) for k in range(5)]
    summed = sum(int8.compress(x, seg) for x in xs)
    assert torch.equal(int8.decompress(summed, seg), sum(torch.where(x >= 0, 1.0, -1.0) for x in xs))
    assert int8.payload_nbytes(seg) == 20 and bits.payload_nbytes(seg) == math.ceil(20 / 8)
    assert bits.compress(xs[0], seg).numel() == 3


def test_unknown_vote_is_refused_in_one_line():
    with pytest.raises(ValueError, match="vote='int4'"):
        SignVote("int4")
