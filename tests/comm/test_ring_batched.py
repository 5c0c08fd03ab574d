"""The batched ring schedule (gvq/comm/ring_batched.py) and P2P.exchange: what an NCCL group runs (a ring
step's messages in one batch_isend_irecv), exercised on gloo ranks with ``batch=True``: every ring mode
gives the unbatched ring's sums bit for bit and sends the same bytes."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gvq.aggregators.base import equal_segments
from gvq.comm import ring
from gvq.comm.p2p import P2P
from gvq.compressors.base import split_on_cuts
from tests.helpers.dist import run_ranks
from tests.helpers.toy_compressors import Half, Projection


def _x(rank: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(500 + rank))


def _modes(rank, world, batch):
    p2p, out = P2P(rank, world, batch=batch), []
    assert p2p.batched == batch
    flat = _x(rank, 1001)
    ring.allreduce_(flat, equal_segments(1001, world), p2p)
    out.append(flat)
    comp = Projection()
    for pieces in (1, 3):                      # one piece a segment (the paper), then several
        flat = _x(rank, 64 * 3)
        cuts = comp.cuts(64 * 3)
        segs = [[s] if isinstance(s, slice) else list(s) for s in split_on_cuts(cuts, world)]
        if pieces > 1:                         # each segment cut into its cuts' pieces
            segs = [[slice(a, b) for a, b in zip(cuts, cuts[1:]) if seg[0].start <= a < seg[-1].stop]
                    for seg in segs]
        ring.additive_allreduce_(flat, segs, comp, p2p, ring.Clock())
        out.append(flat)
    flat = _x(rank, 64)
    ring.reencode_allreduce_(flat, split_on_cuts(Half().cuts(64), world), Half(), p2p, ring.Clock())
    out.append(flat)
    for topology in ("allgather", "ps"):
        flat = _x(rank, 64)
        ring.gather_allreduce_(flat, Half(), p2p, ring.Clock(), topology)
        out.append(flat)
    dist.barrier()
    return out, p2p.bytes_sent


@pytest.mark.parametrize("world", [2, 3])
def test_batched_steps_give_the_pipelined_rings_sums_bit_for_bit(tmp_path, world):
    plain = run_ranks(_modes, world, tmp_path, False)
    batched = run_ranks(_modes, world, tmp_path, True)
    for (a, bytes_a), (b, bytes_b) in zip(plain, batched):
        assert bytes_a == bytes_b > 0
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_batching_is_nccl_without_a_link_model_only():
    assert not P2P(0, 1).batched                                   # no group (as gloo)
    assert P2P(0, 1, batch=True).batched
    assert not P2P(0, 1, batch=True, bandwidth_bps=1e9).batched    # emulated link: the host's clock
    assert not P2P(0, 1, batch=True, stage=True).batched           # everything through host buffers
