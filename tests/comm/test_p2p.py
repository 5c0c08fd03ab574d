"""Emulated links (timing model, generous bounds only) and lost peers (bounded, named)."""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from gvq.aggregators.compressed import CompressedAggregator
from gvq.comm.p2p import P2P, PeerLostError
from tests.helpers.dist import run_ranks
from tests.helpers.toy_compressors import Half, Projection


def _one_megabyte(rank, world, bw):
    p2p = P2P(rank, world, timeout_s=30, bandwidth_bps=bw)
    buf = torch.zeros(250_000)                       # 1 MB of fp32
    dist.barrier()
    t0 = time.perf_counter()
    h = p2p.isend(buf, 1) if rank == 0 else p2p.irecv(buf, 0)
    p2p.wait(h)
    elapsed = time.perf_counter() - t0
    p2p.close()
    return elapsed, p2p.bytes_sent


@pytest.mark.slow
def test_emulated_link_takes_at_least_the_serialisation_time(tmp_path):
    (t_send, sent), (t_recv, _) = run_ranks(_one_megabyte, 2, tmp_path, 1e8)
    assert sent == 1_000_000
    assert t_send >= 0.08            # 8 Mbit at 100 Mbit/s = 80 ms before the link has let it all go
    assert t_recv >= 0.07            # the receiver's clock starts a little later (barrier exit skew)


def test_emulated_link_queues_messages_fifo():
    from gvq.comm.p2p import EmulatedLink
    link = EmulatedLink(8e6)                    # 1 MB/s
    link.close()                                # stop the sender thread: only the model is checked
    t = torch.zeros(2500)                       # 10 kB = 10 ms each
    now = time.perf_counter()
    link.submit(t, 1, 0)
    link.submit(t, 1, 0)
    assert link.free_at - now >= 0.02 - 1e-3    # the second waits for the first


def _silent_peer(rank, world, timeout):
    p2p = P2P(rank, world, timeout_s=timeout)
    if rank == 1:
        time.sleep(timeout + 3)                 # alive but never sends
        return None
    t0 = time.perf_counter()
    try:
        p2p.wait(p2p.irecv(torch.zeros(10), 1), 1)
    except PeerLostError as e:
        return str(e), time.perf_counter() - t0
    return "no error", 0.0


@pytest.mark.slow
def test_lost_peer_is_named_within_the_timeout(tmp_path):
    msg, waited = run_ranks(_silent_peer, 2, tmp_path, 2.0)[0]
    assert "lost rank 1" in msg
    assert 1.5 <= waited < 10


def test_forcing_a_non_additive_compressor_to_sum_is_a_config_error():
    with pytest.raises(ValueError, match="aggregator.hop=sum"):
        CompressedAggregator(Half(), topology="ring", hop="sum", ef_decay=1.0, ef_units="gradient")
    assert CompressedAggregator(Projection(), topology="ring", hop="reencode", ef_decay=1.0,
                                ef_units="gradient").sum_hop is False
