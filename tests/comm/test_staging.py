"""Host staging (gvq/comm/staging.py) as P2P uses it: which tensors are staged, and the staged path
exercised on CPU (``stage=True``) through every ring mode on 2-3 gloo ranks -- what a GPU shared by
several ranks runs, without needing one."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gvq.comm.p2p import P2P
from gvq.comm.staging import HostStage, Staged
from tests.helpers.dist import run_ranks
from tests.helpers.rings import every_ring_mode


def test_a_non_nccl_group_stages_device_tensors_only():
    p2p = P2P(0, 1)                                  # no process group: not NCCL, as gloo
    assert p2p._staged(torch.empty(3, device="meta"))            # a device tensor never reaches gloo
    assert not p2p._staged(torch.empty(3))
    assert P2P(0, 1, stage=True)._staged(torch.empty(3))          # forced: host tensors too
    assert not P2P(0, 1, stage=False)._staged(torch.empty(3, device="meta"))


def test_staged_receive_lands_on_wait_and_buffers_are_reused():
    stage, dst = HostStage(), torch.zeros(2, 3)

    class Done:
        def wait(self, timeout=None):
            return True

        def is_completed(self):
            return True

    buf = stage.acquire(dst)
    buf.copy_(torch.arange(6.0))                     # what the network delivered
    h = Staged(Done(), stage, buf, dst=dst)
    assert torch.equal(dst, torch.zeros(2, 3))       # nothing before the wait's finish
    h.finish()
    h.finish()                                       # once only
    assert torch.equal(dst, torch.arange(6.0).view(2, 3)) and stage.seconds > 0
    assert stage.acquire(dst) is buf                 # back in the pool, reused
    out = stage.outgoing(torch.ones(6))
    assert out is not buf and torch.equal(out, torch.ones(6))


def _modes(rank, world, stage):
    """Every ring mode on the same inputs; returns the results and the staging time."""
    p2p = P2P(rank, world, stage=stage)
    out = every_ring_mode(rank, world, p2p)
    dist.barrier()
    return out, p2p.stage_s


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_every_ring_mode_gives_the_same_sums_staged_through_host_buffers(tmp_path, world):
    plain = run_ranks(_modes, world, tmp_path, False)
    staged = run_ranks(_modes, world, tmp_path, True)
    for (a, s_a), (b, s_b) in zip(plain, staged):
        assert s_a == 0.0 and s_b > 0.0
        for x, y in zip(a, b):
            assert torch.equal(x, y)                 # same bytes, same order: bitwise equal
