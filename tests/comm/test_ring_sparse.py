"""The sparse ring (gvq/comm/ring_sparse.py) on 2-4 gloo ranks: its result is the allgather's (the sum of
every rank's decoded payload); a chunk goes dense exactly when its union's density reaches 1/2; the bytes
P2P counts are the wire arithmetic (header + body a message); virtual time charges those sizes; the cost
model's schedule prices the same bytes."""
from __future__ import annotations

import pytest
import torch

from gvq.aggregators.base import equal_segments
from gvq.comm import ring
from gvq.comm.clock import Stopwatch
from gvq.comm.p2p import P2P
from gvq.comm.ring_sparse import Chunk, merged, message_bytes
from gvq.compressors.topk import TopK
from gvq.compressors.topk_chunk import ChunkTopK
from tests.helpers.dist import run_ranks

SHAPES = ((6, 5), (7,), (4, 3, 3), (9,))
NUMEL = sum(torch.Size(s).numel() for s in SHAPES)


def _x(rank: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(500 + rank))


def _codecs():
    return {"tensor": TopK(ratio=0.2).grouped(SHAPES), "global": TopK(ratio=0.3, scope="global"),
            "fp16_packed": TopK(ratio=0.25, scope="bucket", bucket=16, values="float16", indices="packed"),
            "chunk": ChunkTopK(k=3, chunk=16)}


def _sums(rank, world):
    """Per codec: the sparse ring's sum and the allgather's, on the same inputs."""
    out = {}
    for name, comp in _codecs().items():
        x = _x(rank, NUMEL)
        sparse, gathered = x.clone(), x.clone()
        p2p = P2P(rank, world)
        ring.sparse_ring_(sparse, equal_segments(NUMEL, world), comp, p2p, Stopwatch())
        ring.gather_allreduce_(gathered, comp, P2P(rank, world), Stopwatch())
        out[name] = (sparse, gathered)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_sparse_ring_sums_what_the_allgather_sums(tmp_path, world):
    per_rank = run_ranks(_sums, world, tmp_path)
    whole = slice(0, NUMEL)
    for name, comp in _codecs().items():
        want = sum(comp.decompress(comp.compress(_x(r, NUMEL), whole), whole) for r in range(world))
        for r in range(world):
            sparse, gathered = per_rank[r][name]
            assert torch.allclose(sparse, want, rtol=1e-6, atol=1e-6), name
            assert torch.allclose(sparse, gathered, rtol=1e-6, atol=1e-6), name
            assert torch.equal(sparse, per_rank[0][name][0]), name       # every rank the same bits


def _placed(rank: int, world: int, length: int, overlap: bool, m: int = 1) -> torch.Tensor:
    """``m`` entries per segment of ``length``: from offset ``rank * m`` (disjoint supports) or 0 (identical)."""
    x = torch.zeros(world * length)
    for s in range(world):
        at = s * length + (0 if overlap else rank * m)
        x[at: at + m] = 1.0 + rank + 10 * s + torch.arange(m) / m
    return x


def _placed_ring(rank, world, length, overlap, virtual=False, m=1):
    from gvq.comm import clock
    if virtual:
        clock.configure("virtual")
    try:
        x = _placed(rank, world, length, overlap, m)
        comp = TopK(ratio=(world * m + 0.5) / x.numel(), scope="global")     # k = world * m: the placed entries
        p2p = P2P(rank, world, bandwidth_bps=BPS if virtual else None, latency_s=ALPHA if virtual else 0.0)
        t0 = clock.get().now()
        stats = ring.sparse_ring_(x, equal_segments(x.numel(), world), comp, p2p, Stopwatch())
        elapsed = clock.get().now() - t0
        return x, stats, p2p.bytes_sent, p2p.bytes_received, elapsed
    finally:
        clock.configure("wall")


def _message_counts(world, length, overlap, m=1):
    """Bytes a rank sends: N - 1 reduce-scatter chunks of 1 .. N - 1 ranks' entries (one rank's if supports
    are identical), then N - 1 chunks of all N; each a 4-byte header and 8 bytes a pair, or 4 a value once
    2 x pairs >= length."""
    pairs = (lambda h: m) if overlap else (lambda h: h * m)
    def nbytes(p):
        return 4 + (4 * length if 2 * p >= length else 8 * p)
    return sum(nbytes(pairs(h)) for h in range(1, world)) + (world - 1) * nbytes(pairs(world))


def _switch_cases(rank, world):
    return {(length, overlap): _placed_ring(rank, world, length, overlap)
            for length in (2 * world, 2 * world + 1) for overlap in (False, True)}


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_chunk_goes_dense_exactly_at_density_one_half_and_the_bytes_are_the_wire_arithmetic(tmp_path, world):
    """Disjoint supports at segment length 2N: the summed chunk holds N entries, density 1/2, so the
    all-gather forwards it dense (4L + 4 bytes); at 2N + 1 it stays sparse.  Identical supports: one entry."""
    per_rank = run_ranks(_switch_cases, world, tmp_path)
    for (length, overlap), _ in per_rank[0].items():
        want = sum(_placed(r, world, length, overlap) for r in range(world))
        expect = _message_counts(world, length, overlap)
        for r in range(world):
            x, stats, sent, received, _ = per_rank[r][(length, overlap)]
            assert torch.equal(x, want)
            assert sent == received == expect, (length, overlap, sent, received, expect)
            dense = not overlap and length == 2 * world
            assert stats["ring_density"] == (1.0 if dense else (1 if overlap else world) / length)


BPS, ALPHA, LENGTH, M = 1e5, 0.02, 1500, 300     # 3 ranks: 300, 600 pairs, then 900 of 1500: dense


def _virtual(rank, world):
    return _placed_ring(rank, world, LENGTH, False, virtual=True, m=M)


@pytest.mark.slow
def test_virtual_time_charges_the_messages_real_sizes_as_the_cost_model_prices_them(tmp_path):
    """N = 3 on a 100 kbit/s link, 20 ms a message: the ring's virtual time is its messages' bytes on the link
    and their latency (two messages a hop: header and body; the all-gather's dense) as
    :func:`gvq.predict.schedule.sparse_ring` replays them (disjoint supports, as here): a wrong size, a
    chunk sent as pairs instead of dense, or a header left out would show."""
    import numpy as np
    from gvq.predict import schedule as S
    world = 3
    per_rank = run_ranks(_virtual, world, tmp_path)
    kept, lengths = np.full(world, float(M)), np.full(world, float(LENGTH))
    predicted = S.sparse_ring(kept, lengths, 0.0, np.zeros(world), 0.0, S.Link(BPS, ALPHA))
    latency_only = S.sparse_ring(kept, lengths, 0.0, np.zeros(world), 0.0, S.Link(1e15, ALPHA))
    assert S.sparse_traffic(kept, lengths, world)[0] == _message_counts(world, LENGTH, False, M)
    assert 0.05 * predicted.max() < latency_only.max() < 0.25 * predicted.max()     # both terms seen
    for r in range(world):
        x, stats, sent, _, elapsed = per_rank[r]
        assert sent == _message_counts(world, LENGTH, False, M) and stats["ring_density"] == 1.0
        assert elapsed == pytest.approx(predicted[r], rel=0.03)


def test_a_union_sums_the_values_of_both_supports_and_goes_dense_at_one_half():
    a = Chunk(torch.tensor([0, 2]), torch.tensor([1.0, 2.0]), 8)
    b = Chunk(torch.tensor([2, 5]), torch.tensor([3.0, 4.0]), 8)
    u = merged(a, b)
    assert u.pos.tolist() == [0, 2, 5] and u.vals.tolist() == [1.0, 5.0, 4.0]
    d = merged(u, Chunk(torch.tensor([7]), torch.tensor([1.0]), 8))      # 4 of 8: dense
    assert d.pos is None and d.vals.tolist() == [1.0, 0, 5.0, 0, 0, 4.0, 0, 1.0]
    assert merged(d, b).vals.tolist() == [1.0, 0, 8.0, 0, 0, 8.0, 0, 1.0]
    assert merged(Chunk(torch.tensor([1]), torch.tensor([1.0]), 9), Chunk(torch.tensor([3, 4, 6]),
                  torch.ones(3), 9)).pos is not None                      # 4 of 9: still pairs
    assert [message_bytes(p, 8) for p in (0, 3, 4, 8)] == [4, 28, 36, 36]


def test_the_sparse_ring_refuses_a_codec_without_entries():
    from gvq.compressors.qsgd import QSGD
    with pytest.raises(ValueError, match="sparse_ring.*not sparse"):
        ring.sparse_ring_(torch.ones(8), equal_segments(8, 1), QSGD(), P2P(0, 1), Stopwatch())
