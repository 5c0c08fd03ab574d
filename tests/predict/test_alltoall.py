"""qgZ's all-to-alls on the cost model's links (gvq/predict/alltoall.py) against times computed by hand: 2 x 2
wire-bound is its closed form, codec calls add on the critical path as the code makes them, the intra and
inter links are separate FIFOs, and the time falls as the inter-node link speeds up; and against
gvq/comm/alltoall_quant.py run under the virtual clock on 4 gloo ranks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gvq.comm import clock as rank_clock
from gvq.comm.alltoall_quant import shard_pieces
from gvq.comm.clock import Stopwatch
from gvq.comm.links import Cluster
from gvq.comm.p2p import P2P
from gvq.comm.ring import Ring
from gvq.compressors.base import Compressor
from gvq.predict import alltoall as A
from gvq.predict import schedule as S
from tests.helpers.dist import run_ranks


def _layout(per: int, nodes: int, vals: float = 1000.0, nbytes: float = 500.0) -> A.Layout:
    return A.Layout(np.full((per, nodes), vals), np.full((per, nodes), nbytes))


def _costs(per: int, nodes: int, **given) -> A.Costs:
    zero = {k: np.zeros((per, nodes)) for k in ("compress", "decompress", "add", "encode3", "decode3")}
    zero |= {"encode1": np.zeros(per), "decode1": np.zeros(per)}
    return A.Costs(**{**zero, **{k: np.full(zero[k].shape, v) for k, v in given.items()}})


def test_2x2_wire_bound_is_the_closed_form():
    """b bytes a piece: the shard (2b) to the node-mate, a piece across, the summed piece across, the shard's
    two pieces (2b, one FIFO) to the node-mate; each its wire time and its latency."""
    b, Bi, ai, B, a = 5e5, 1e9, 1e-5, 1e8, 1e-3
    t = A.qgz_allreduce(_layout(2, 2, nbytes=b), _costs(2, 2), "compressed", "compressed", S.Link(Bi, ai), S.Link(B, a))
    assert t == pytest.approx(np.full(4, 2 * (8 * 2 * b / Bi + ai) + 2 * (8 * b / B + a)), rel=1e-12)


def test_plain_wires_carry_four_or_two_bytes_a_value():
    v, B = 1000.0, 1e6
    fast = S.Link(1e15)
    for wire, per_value in (("fp32", 4), ("fp16", 2)):
        t = A.qgz_allreduce(_layout(2, 1, vals=v), _costs(2, 1), wire, "fp32", S.Link(B), fast)
        # one node: the shard (v values) to the node-mate, then the shard's piece back in fp32
        assert t == pytest.approx(np.full(2, 8 * per_value * v / B + 8 * 4 * v / B), rel=1e-12)


def test_the_codec_calls_are_paid_where_the_code_makes_them():
    """2 x 2, links free: encode the other shard (e1), decode and add the received one (d1); compress the other
    piece (c), decompress and add the received one (d + a), encode the summed piece (c); decode all 4 pieces."""
    e1, d1, c, d, a = 1.0, 0.5, 0.3, 0.2, 0.05
    costs = _costs(2, 2, encode1=e1, decode1=d1, compress=c, decompress=d, add=a, encode3=c, decode3=d)
    t = A.qgz_allreduce(_layout(2, 2), costs, "compressed", "compressed", S.Link(1e15), S.Link(1e15))
    assert t == pytest.approx(np.full(4, e1 + d1 + c + d + a + c + 4 * d))


def test_one_rank_alone_is_the_codecs_round_trip():
    t = A.qgz_allreduce(_layout(1, 1), _costs(1, 1, compress=2.0, decompress=1.0), "compressed", "compressed",
                        None, S.Link(1e6), start=[3.0])
    assert t == pytest.approx([6.0])


def test_the_classes_are_separate_fifos_and_one_rank_a_node_uses_only_the_inter_link():
    lay, costs, B = _layout(4, 2), _costs(4, 2), 1e8
    fast = A.qgz_allreduce(lay, costs, "compressed", "compressed", S.Link(1e15), S.Link(B))
    slow = A.qgz_allreduce(lay, costs, "compressed", "compressed", S.Link(B), S.Link(B))
    # inside: 3 shards of 2 pieces each way, then 3 x 2 pieces of the gather; none of it on the inter link
    assert (slow - fast) == pytest.approx(np.full(8, 8 * (3 * 2 + 3 * 2) * 500.0 * (1 / B - 1e-15)), rel=1e-9)
    flat = A.qgz_allreduce(_layout(1, 4), _costs(1, 4), "compressed", "compressed", None, S.Link(B))
    assert flat == pytest.approx(np.full(4, 2 * 3 * 8 * 500.0 / B), rel=1e-12)   # 3 pieces out, 3 summed ones


def test_the_time_falls_as_the_inter_node_link_speeds_up():
    lay = A.Layout(np.array([[900.0, 1100, 1000, 1000]] * 2), np.array([[450.0, 550, 500, 500]] * 2))
    costs = _costs(2, 4, encode1=1e-4, decode1=1e-4, compress=1e-5, decompress=1e-5, add=1e-6, encode3=1e-5,
                   decode3=1e-5)
    intra = S.Link(1e11, 1e-6, 1e-6)
    times = [A.qgz_allreduce(lay, costs, "compressed", "compressed", intra, S.Link(b, 1e-4, 1e-6)).max()
             for b in (1e6, 1e7, 1e8, 1e9, 1e10)]
    assert all(x > y for x, y in zip(times, times[1:]))


def test_traffic_per_class_is_the_wire_arithmetic():
    lay = A.Layout(np.array([[10.0, 20.0], [30.0, 0.0]]), np.array([[6.0, 11.0], [16.0, 0.0]]))
    got = A.qgz_traffic(lay, "fp16", "compressed")          # 2 nodes x 2 ranks; shard 1's second piece empty
    # rank (m, j): its other shard (fp16: 2 bytes a value) to the node-mate; the other piece of its shard
    # across; its summed piece across; its shard's pieces to the node-mate
    assert got["inter"].tolist() == [11 + 6, 0 + 16, 6 + 11, 16 + 0]
    assert got["sent"].tolist() == [60 + 17 + 17, 60 + 16 + 16, 60 + 17 + 17, 60 + 16 + 16]
    assert got["inter_msgs"].tolist() == [2, 1, 2, 1] and got["intra_msgs"].tolist() == [3, 2, 3, 2]


def _virtual(rank, world, intra_bps, inter_bps, latency, numel):
    """This rank's virtual seconds in one qgZ (lossless codec, fp16 inside the node) after a warm-up."""
    rank_clock.configure("virtual")
    p2p = P2P(rank, world, bandwidth_bps=inter_bps, latency_s=latency, cluster=Cluster(2, intra_bps, latency))
    flat = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    ring = Ring("qgz", numel, Compressor(), inner="fp16", gather="compressed")
    ring.run_(flat.clone(), p2p, Stopwatch())                    # warm the transport
    rank_clock.sync()
    t0 = rank_clock.now()
    ring.run_(flat, p2p, Stopwatch())
    return rank_clock.now() - t0


@pytest.mark.slow
def test_the_model_matches_qgz_in_virtual_time(tmp_path):
    """2 x 2 gloo ranks, the real qgZ on the virtual clock: its slowest rank within 10% of the replay with free
    codec calls (wire-bound: the code's own CPU, unmodelled here, is a small share)."""
    numel, intra, inter, latency = 50_003, 1e8, 1e7, 1e-3
    got = max(run_ranks(_virtual, 4, tmp_path, intra, inter, latency, numel))
    vals = np.array([[q.stop - q.start for q in shard] for shard in shard_pieces(numel, 2, 2)], float)
    lay = A.Layout(vals, 4 * vals)                               # the lossless codec's payload: fp32 values
    model = A.qgz_allreduce(lay, _costs(2, 2), "fp16", "compressed", S.Link(intra, latency), S.Link(inter, latency))
    assert got == pytest.approx(model.max(), rel=0.10)
