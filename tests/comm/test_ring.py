"""The ring engine's four modes against direct references, on 2-4 gloo ranks."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gvq.aggregators.base import equal_segments
from gvq.comm import ring
from gvq.comm.clock import Stopwatch
from gvq.comm.p2p import P2P
from gvq.compressors.base import split_on_cuts
from tests.helpers.clock_lock import clock_lock_free
from tests.helpers.dist import run_ranks
from tests.helpers.toy_compressors import Half, Projection, Sign


def _x(rank: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 + rank))


def _uncompressed(rank, world, numel):
    flat = _x(rank, numel)
    ref = flat.clone()
    dist.all_reduce(ref)
    segs = equal_segments(numel, world)
    ring.allreduce_(flat, segs, P2P(rank, world))
    return flat, ref


def _uncompressed_cases(rank, world, sizes):
    return [_uncompressed(rank, world, n) for n in sizes]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_rar_equals_dist_all_reduce(tmp_path, world):
    """Sizes N does not divide, smaller than N, and empty."""
    sizes = [0, 1, world - 1, 7, 10, 1001]
    for per_rank in run_ranks(_uncompressed_cases, world, tmp_path, sizes):
        for numel, (flat, ref) in zip(sizes, per_rank):
            assert flat.shape == (numel,)
            assert torch.allclose(flat, ref, atol=1e-5, rtol=1e-5)


def _cases(rank, world, cases):
    return [_compressed(rank, world, comp, numel, mode) for comp, numel, mode in cases]


def _compressed(rank, world, comp, numel, mode):
    flat = _x(rank, numel)
    p2p, clock = P2P(rank, world), Stopwatch()
    if mode in ("allgather", "ps"):
        ring.gather_allreduce_(flat, comp, p2p, clock, mode)
    else:
        segs = split_on_cuts(comp.cuts(numel), world)
        fn = ring.additive_allreduce_ if mode == "additive" else ring.reencode_allreduce_
        fn(flat, segs, comp, p2p, clock)
    return flat


def _decode_sum(comp, world, numel, seg):
    return sum(comp.decompress(comp.compress(_x(r, numel)[seg], seg), seg) for r in range(world))


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_additive_ring_equals_compressing_the_sum(tmp_path, world):
    """Eq. (1): sum of payloads decompressed once == compressor applied to the summed gradient;
    unit counts below, at and not divisible by N."""
    comp, unit_counts = Projection(unit=8, d=3), [1, 5, 13]
    per_rank = run_ranks(_cases, world, tmp_path, [(comp, 8 * u, "additive") for u in unit_counts])
    for k, u in enumerate(unit_counts):
        numel, whole = 8 * u, slice(0, 8 * u)
        total = sum(_x(r, numel) for r in range(world))
        expect = comp.decompress(comp.compress(total, whole), whole)
        for outs in per_rank:
            assert torch.allclose(outs[k], expect, atol=1e-4)
            assert torch.allclose(outs[k], _decode_sum(comp, world, numel, whole), atol=1e-4)
            assert torch.equal(outs[k], per_rank[0][k])


def _reencode_reference(comp, world, numel):
    """Replays the decode-add-encode ring hop by hop in one process."""
    segs = split_on_cuts(comp.cuts(numel), world)
    out = torch.empty(numel)
    for j, seg in enumerate(segs):
        p = comp.compress(_x(j, numel)[seg], seg)
        for k in range(1, world):
            p = comp.compress(comp.decompress(p, seg) + _x((j + k) % world, numel)[seg], seg)
        out[seg] = comp.decompress(p, seg)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_reencode_ring_matches_hop_by_hop_reference(tmp_path, world):
    cases = [(Half(), 11, "reencode"), (Sign(unit=4), 23, "reencode"), (Sign(unit=4), 2, "reencode")]
    per_rank = run_ranks(_cases, world, tmp_path, cases)
    for k, (comp, numel, _) in enumerate(cases):
        expect = _reencode_reference(comp, world, numel)
        for outs in per_rank:
            assert torch.equal(outs[k], expect)
    total = sum(_x(r, 11) for r in range(world))   # fp16 partial sums stay close to the true sum
    assert torch.allclose(per_rank[0][0], total, atol=1e-2, rtol=1e-2)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_gather_modes_equal_direct_decode_and_sum(tmp_path, world):
    comp, numel, whole = Sign(unit=4), 19, slice(0, 19)
    per_rank = run_ranks(_cases, world, tmp_path, [(comp, numel, "allgather"), (comp, numel, "ps")])
    direct = _decode_sum(comp, world, numel, whole)
    # the parameter server re-encodes the sum before sending it back
    expect = [direct, comp.decompress(comp.compress(direct, whole), whole)]
    for outs in per_rank:
        for k in range(2):
            assert torch.allclose(outs[k], expect[k], atol=1e-5)
            assert torch.equal(outs[k], per_rank[0][k])


def test_additive_mode_rejects_non_additive_compressor():
    with pytest.raises(ValueError, match="not additive"):
        ring.additive_allreduce_(torch.zeros(4), [slice(0, 4)], Half(), P2P(0, 1), Stopwatch())


def test_split_on_cuts_respects_units_and_balances():
    cuts = list(range(0, 101, 10))
    segs = split_on_cuts(cuts, 3)
    assert [s.start for s in segs] == [0, 30, 70] or [s.start for s in segs] == [0, 30, 60]
    assert all(s.start in cuts and s.stop in cuts for s in segs)
    assert segs[-1].stop == 100
    tiny = split_on_cuts([0, 5], 4)   # fewer units than ranks: empty segments
    assert sum(s.stop - s.start for s in tiny) == 5 and len(tiny) == 4


def test_equal_segments_cover_the_vector_contiguously():
    for numel in (0, 1, 3, 7, 470004):
        for n in (1, 2, 3, 4):
            segs = equal_segments(numel, n)
            assert len(segs) == n and segs[0].start == 0 and segs[-1].stop == numel
            assert all(a.stop == b.start for a, b in zip(segs, segs[1:]))
            sizes = [s.stop - s.start for s in segs]
            assert max(sizes) - min(sizes) <= 1


def _pieced(rank, world, comp, numel, k, bandwidth):
    """The additive ring with every segment cut into k pieces (cut-through), and with one piece."""
    cuts = comp.cuts(numel)
    fine = split_on_cuts(cuts, world * k)
    out = []
    for segs in ([fine[i * k: (i + 1) * k] for i in range(world)], split_on_cuts(cuts, world)):
        flat, p2p = _x(rank, numel), P2P(rank, world, 30.0, bandwidth)
        ring.additive_allreduce_(flat, segs, comp, p2p, Stopwatch())
        p2p.close()
        out.append((flat, p2p.bytes_sent))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world, bandwidth", [(2, None), (3, None), (4, None), (3, 2e8)])
def test_pieces_sum_the_same_and_send_the_same_bytes(tmp_path, world, bandwidth):
    """Cut-through pieces change only the pipelining: same sum (Eq. 1), same bytes, same bits on all
    ranks; pieces may be empty (more pieces than units in a segment)."""
    comp, numel = Projection(unit=8, d=3), 8 * 29
    per_rank = run_ranks(_pieced, world, tmp_path, comp, numel, 3, bandwidth)
    total = sum(_x(r, numel) for r in range(world))
    whole = slice(0, numel)
    expect = comp.decompress(comp.compress(total, whole), whole)
    for (pieced, b1), (plain, b2) in per_rank:
        assert torch.allclose(pieced, expect, atol=1e-4) and torch.allclose(pieced, plain, atol=1e-5)
        assert b1 == b2 > 0
        assert torch.equal(pieced, per_rank[0][0][0])


class _Echo:
    """One process as rank 0 of a 2-rank ring whose left neighbour sends back what it received; records
    whether the host's clock lock was held at each send and each wait."""
    rank, world_size, left, right = 0, 2, 1, 1

    def __init__(self):
        self.pending, self.seen = [], []

    def irecv(self, tensor, src):
        self.pending.append(tensor)
        return tensor

    def isend(self, tensor, dst):
        self.seen.append(("send", clock_lock_free()))
        self.pending.pop(0).copy_(tensor)
        return tensor

    def exchange(self, send, dst, recv, src):           # unbatched: P2P.exchange's own order
        return self.irecv(recv, src), self.isend(send, dst)

    def wait(self, handle, peer=None):
        from gvq.comm import clock
        with clock.get().blocked():
            self.seen.append(("wait", clock_lock_free()))


def test_a_rings_own_cpu_is_timed_one_rank_at_a_time(private_clock_lock):
    """Virtual clock, exclusive: the ring holds the host's lock while it posts and adds (no co-running
    rank's cache refills billed to it) and gives it away in every wait, so no ring deadlocks."""
    from gvq.comm import clock
    clock.configure("virtual", exclusive=True)
    try:
        echo = _Echo()
        ring.allreduce_(torch.ones(6), equal_segments(6, 2), echo)
        assert clock_lock_free()
        assert {op for op, _ in echo.seen} == {"send", "wait"}
        assert all(free == (op == "wait") for op, free in echo.seen), echo.seen
    finally:
        clock.configure("wall")
    echo = _Echo()                                      # the wall clock never takes it
    ring.allreduce_(torch.ones(6), equal_segments(6, 2), echo)
    assert all(free for _, free in echo.seen)
