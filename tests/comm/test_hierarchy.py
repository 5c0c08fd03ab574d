"""The hierarchical all-reduce (gvq/comm/hierarchy.py) and the two link classes of P2P (gvq/comm/links.py
Cluster), on 4 and 8 gloo ranks: the sum equals the flat one for every node shape, and the bytes and the
virtual time split by link class as the arithmetic says; through the launcher's entry function,
``aggregator.topology=hierarchical`` trains rar exactly as the flat ring does, a compressed option trains,
the bytes across nodes are logged, and ranks that do not fill whole nodes are refused."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from gvq.comm import clock as rank_clock
from gvq.comm.clock import Stopwatch
from gvq.comm.links import Cluster
from gvq.comm.p2p import P2P
from gvq.comm.ring import Ring
from gvq.compressors.qsgd import QSGD
from tests.helpers.dist import run_ranks
from tests.helpers.launch import launch_job
from tests.helpers.toy_compressors import Projection


def _x(rank: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 + rank))


def _sums(rank, world, shapes, numel):
    """Per node shape (ranks per node): the hierarchical plain sum, a linear projection's summed payloads and
    QSGD's decode-add-encode across nodes; the exact sum and its projection; and the bytes by class."""
    ref = _x(rank, numel)
    dist.all_reduce(ref)
    out = []
    for per in shapes:
        p2p = P2P(rank, world, cluster=Cluster(per))
        got = {}
        for name, inner, codec in (("plain", "plain", None), ("projection", "additive", Projection()),
                                   ("qsgd", "reencode", QSGD(bits=8, norm="max"))):
            flat = _x(rank, numel)
            p2p.reset()
            Ring("hierarchical", numel if codec is None else codec.cuts(numel), codec, inner=inner).run_(
                flat, p2p, Stopwatch())
            got[name] = (flat, p2p.bytes_sent, p2p.bytes_inter)
        again = _x(rank, numel)                # the P2P's kept views and the kept buffers of both layouts
        Ring("hierarchical", numel, inner="plain").run_(again, p2p, Stopwatch())
        got["again"] = again
        out.append(got)
    whole = slice(0, numel)
    return ref, Projection().decompress(Projection().compress(ref, whole), whole), out


def _check(results, shapes, numel, world):
    for ref, projected, per_shape in results:
        for per, got in zip(shapes, per_shape):
            flat, sent, inter = got["plain"]
            assert torch.allclose(flat, ref, atol=1e-4, rtol=1e-5), per
            assert torch.equal(got["again"], flat), per          # a second call sums as the first
            assert torch.allclose(got["projection"][0], projected, atol=1e-4, rtol=1e-4), per
            assert torch.linalg.vector_norm(got["qsgd"][0] - ref) < 0.05 * torch.linalg.vector_norm(ref), per
            nodes = world // per
            # reduce-scatter + all-gather inside the node, a ring across nodes on 1/per of the vector
            expect_inter = 4 * 2 * (nodes - 1) * numel / (per * nodes)
            expect = 4 * 2 * (per - 1) * numel / per + expect_inter
            assert sent == pytest.approx(expect, rel=0.01), per
            assert inter == pytest.approx(expect_inter, rel=0.01, abs=1), per


@pytest.mark.slow
def test_the_sum_equals_the_flat_one_at_every_shape_of_4_ranks(tmp_path):
    """2 x 2, one node of 4 and 4 nodes of 1 (the flat ring)."""
    shapes, numel = [2, 4, 1], 4096
    _check(run_ranks(_sums, 4, tmp_path, shapes, numel), shapes, numel, 4)


@pytest.mark.slow
def test_the_sum_equals_the_flat_one_at_2x4_and_4x2(tmp_path):
    shapes, numel = [4, 2], 4096
    _check(run_ranks(_sums, 8, tmp_path, shapes, numel, timeout=240.0), shapes, numel, 8)


def _timed(rank, world, intra_bps, inter_bps, numel):
    """A hierarchical plain ring in virtual time: (seconds it took this rank, bytes, bytes across nodes)."""
    rank_clock.configure("virtual")
    p2p = P2P(rank, world, bandwidth_bps=inter_bps, cluster=Cluster(2, intra_bps))
    flat = _x(rank, numel)
    t0 = rank_clock.now()
    Ring("hierarchical", numel, inner="plain").run_(flat, p2p, Stopwatch())
    return rank_clock.now() - t0, p2p.bytes_sent, p2p.bytes_inter


@pytest.mark.slow
def test_virtual_time_charges_each_class_at_its_own_link(tmp_path):
    """2 x 2 on a 1 Mbit/s inter-node link: the intra-node phases at 1 Tbit/s add nothing measurable, at
    1 Mbit/s they triple it (twice the inter-node ring's bytes on the same speed)."""
    numel, slow = 20_000, 1e6
    fast = run_ranks(_timed, 4, tmp_path, 1e12, slow, numel)
    same = run_ranks(_timed, 4, tmp_path, slow, slow, numel)
    inter_bytes = 4 * numel / 2                      # 2 (M - 1) / M x 1/R of the vector, M = R = 2
    wire_inter = 8 * inter_bytes / slow
    for (t_fast, sent, inter), (t_same, _, _) in zip(fast, same):
        assert inter == inter_bytes and sent == 3 * inter_bytes      # the node's phases: 1/2 each way
        assert t_fast == pytest.approx(wire_inter, rel=0.2)
        assert t_same == pytest.approx(3 * wire_inter, rel=0.2)


CNN = ("logger=csv", "logger.progress=false", "iterations=4", "eval_every=4", "world_size=4", "batch_size=16")
NODES = ("net=nodes2x4", "net.ranks_per_node=2")


@pytest.mark.slow
def test_hierarchical_rar_trains_as_the_flat_ring_and_logs_the_inter_node_bytes(tmp_path):
    code, _ = launch_job(tmp_path / "flat", "aggregator=rar", *NODES, *CNN)
    assert code == 0
    code, _ = launch_job(tmp_path / "hier", "aggregator=rar", "aggregator.topology=hierarchical", *NODES, *CNN)
    assert code == 0
    flat, hier = (pd.read_csv(tmp_path / d / "metrics.csv") for d in ("flat", "hier"))
    assert hier.train_loss.to_numpy() == pytest.approx(flat.train_loss.to_numpy(), rel=1e-5)
    assert hier.test_loss.dropna().to_numpy() == pytest.approx(flat.test_loss.dropna().to_numpy(), rel=1e-5)
    # 2 x 2: the same bytes in all as the flat ring at N = 4 (1.5 vectors), a third of them across nodes
    # (the flat ring: 2 of its 4 links cross, rank 0's among them)
    assert hier.bytes_sent.to_numpy() == pytest.approx(flat.bytes_sent.to_numpy(), rel=1e-3)
    assert (3 * hier.bytes_inter).to_numpy() == pytest.approx(hier.bytes_sent.to_numpy(), rel=1e-3)
    assert (flat.bytes_inter == 0).all() or (flat.bytes_inter == flat.bytes_sent).all()


@pytest.mark.slow
def test_hierarchical_qsgd_trains_on_virtual_time(tmp_path):
    code, summary = launch_job(tmp_path, "aggregator=qsgd", "aggregator.topology=hierarchical", *NODES, *CNN)
    assert code == 0, summary
    df = pd.read_csv(tmp_path / "metrics.csv")
    assert set(df.clock) == {"virtual"} and math.isfinite(summary["final_test_loss"])
    assert (df.bytes_inter > 0).all() and (df.bytes_inter < df.bytes_sent).all()


def test_ranks_that_do_not_fill_whole_nodes_are_refused(tmp_path):
    code, summary = launch_job(tmp_path, "aggregator=rar", "net=nodes2x4", "world_size=6", *CNN[:4])
    assert code == 2 and summary is None


def _half_inside(rank, world, numel):
    """The hierarchical plain sum at 2 x 2 with the node phases in fp32 and in fp16: (sum, bytes, across)."""
    out = []
    for dtype in ("fp32", "fp16"):
        p2p = P2P(rank, world, cluster=Cluster(2, intra_dtype=dtype))
        flat = _x(rank, numel)
        Ring("hierarchical", numel, inner="plain").run_(flat, p2p, Stopwatch())
        out.append((flat, p2p.bytes_sent, p2p.bytes_inter))
    return out


@pytest.mark.slow
def test_fp16_inside_the_node_halves_the_intra_node_bytes_only(tmp_path):
    numel = 4096
    results = run_ranks(_half_inside, 4, tmp_path, numel)
    sums = [r[1][0] for r in results]
    for (full, sent32, inter32), (half, sent16, inter16) in results:
        assert torch.allclose(half, full, rtol=2e-3, atol=1e-2)        # partial sums rounded to float16
        assert inter16 == inter32 == 4 * numel / 2                       # the ring across nodes: fp32 as before
        assert sent32 - inter32 == 4 * numel and sent16 - inter16 == 2 * numel
    assert all(torch.equal(s, sums[0]) for s in sums)                   # every rank the same bits


def test_a_view_among_the_same_ranks_is_made_once_and_buffers_of_two_layouts_are_kept():
    """A hierarchical all-reduce asks for its two views and cuts two segment layouts at every call: both are
    made once (the views share the parent's counters), so a call rebuilds neither."""
    from gvq.comm.ring_plain import _scratch
    p2p = P2P(1, 4, cluster=Cluster(2))
    inside = p2p.among([0, 1])
    assert p2p.among([0, 1]) is inside and p2p.among([1, 3]) is not inside
    assert (inside.rank, inside.world_size, inside.peer(0)) == (1, 2, 0)
    inside._tally.sent += 5
    assert p2p.bytes_sent == 5
    flat = torch.zeros(12)
    node, across = [slice(0, 6), slice(6, 12)], [slice(0, 3), slice(3, 6)]
    first = _scratch(flat, node)
    _scratch(flat, across)
    assert _scratch(flat, node) is first


def test_a_codec_cutting_everywhere_is_given_as_its_length_and_its_shards_are_cut_alike():
    """fp16 (the base codec's cuts: every offset) reaches the two-level rings as its length, so no call scans
    a list of N + 1 offsets; a list of cuts finds a shard's by bisection, the same segments a scan finds."""
    from gvq.comm.hierarchy import compact_cuts, node_shards, shard_segments
    from gvq.compressors._segments import balanced_segments
    from gvq.predict.structure import build_on_one_rank
    assert compact_cuts(list(range(11))) == 10 and compact_cuts([0, 4, 10]) == [0, 4, 10]
    for option, cut in (("fp16", int), ("qsgd", list)):
        agg, numel = build_on_one_rank(f"{option}:topology=hierarchical", "cnn", 10)
        (ring,) = agg.rings(agg.everything, 4)
        assert ring.kind == "hierarchical" and isinstance(ring.segs, cut)
        assert ring.segs == numel if cut is int else ring.segs[-1] == numel
    cuts = sorted({0, 1000, *range(7, 1000, 13), *range(400, 460)})
    for shard in node_shards(cuts, 4):
        scanned = balanced_segments([c for c in cuts if shard.start <= c <= shard.stop], 3)
        assert shard_segments(cuts, shard, 3) == scanned
