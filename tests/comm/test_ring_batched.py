"""The batched ring schedule (gvq/comm/ring_batched.py) and P2P.exchange: what an NCCL group runs (a ring
step's messages in one batch_isend_irecv), exercised on gloo ranks with ``batch=True``: every ring mode
gives the unbatched ring's sums bit for bit and sends the same bytes."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gvq.comm.p2p import P2P
from tests.helpers.dist import run_ranks
from tests.helpers.rings import every_ring_mode


def _modes(rank, world, batch):
    p2p = P2P(rank, world, batch=batch)
    assert p2p.batched == batch
    out = every_ring_mode(rank, world, p2p)
    dist.barrier()
    return out, p2p.bytes_sent


@pytest.mark.slow
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
