"""The two-level cost model (gvq/predict/two_level.py, cost_model.replay_two_level): one rank a node is the
flat model exactly, 2 x 2 plain rar equals its closed form, and the model matches gvq/comm/hierarchy.py run
under the virtual clock on 4 gloo ranks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gvq.comm import clock as rank_clock
from gvq.comm.clock import Stopwatch
from gvq.comm.links import Cluster
from gvq.comm.p2p import P2P
from gvq.comm.ring import Ring
from gvq.predict import cost_model as M
from gvq.predict import schedule as S
from gvq.predict.two_level import hierarchical_ring
from tests.helpers.dist import run_ranks

RECORDS = "tests/records/predict/cnn"


def _plain_two_level(numel: int, per: int, nodes: int, intra: S.Link, inter: S.Link) -> np.ndarray:
    """Hierarchical plain rar, adds free: R shards in the node, each shard's flat ring across M nodes."""
    shard = 4.0 * numel / per
    return hierarchical_ring(np.full(per, shard), np.zeros(per), intra, nodes,
                             lambda _, s: S.plain_ring(np.full(nodes, shard / nodes), np.zeros(nodes), inter, s))


def test_one_rank_a_node_is_the_flat_ring():
    inter = S.Link(1e8, 1e-4, 2e-6, 1e-10)
    flat = S.plain_ring(np.full(6, 4e5 / 6), np.full(6, 1e-5), inter)
    one = hierarchical_ring(np.array([4e5]), np.zeros(1), S.Link(1e12), 6,
                            lambda _, s: S.plain_ring(np.full(6, 4e5 / 6), np.full(6, 1e-5), inter, s))
    assert np.array_equal(one, flat)


def test_the_cost_model_at_one_rank_a_node_prices_as_the_flat_one():
    m = M.Calibrated.load(__import__("pathlib").Path(RECORDS))
    for name in m.aggregators:
        for n in (4, 8):
            assert M.aggregation(m, name, n, 1e9, cluster=Cluster(1, 1e12)) == M.aggregation(m, name, n, 1e9)
            two = M.aggregation(m, name, n, 1e9, cluster=Cluster(2, 1e12))
            assert two != M.aggregation(m, name, n, 1e9) and np.isfinite(two)


def test_2x2_plain_rar_is_the_closed_form():
    """V bytes: a V/2 shard each way inside the node (one step each phase), the shard's ring across 2 nodes
    (two steps of V/4 each half); every step its wire time and its latency."""
    V, Bi, ai, B, a = 4e6, 1e9, 1e-5, 1e8, 1e-3
    t = _plain_two_level(int(V / 4), 2, 2, S.Link(Bi, ai), S.Link(B, a))
    assert np.allclose(t, 2 * (8 * V / 2 / Bi + ai) + 2 * (8 * V / 4 / B + a))


def test_the_inter_node_link_is_its_own_fifo_per_class():
    """The intra-node phases on a link as slow as the inter-node one cost 2 x (R - 1) / R of the vector on it:
    the model separates the classes (a faster intra link takes exactly that away)."""
    numel, B = 10_000, 1e7
    slow = _plain_two_level(numel, 4, 2, S.Link(B), S.Link(B))
    fast = _plain_two_level(numel, 4, 2, S.Link(1e15), S.Link(B))
    assert np.allclose(slow - fast, 2 * 3 / 4 * 8 * 4 * numel / B, rtol=1e-9)


def _virtual(rank, world, intra_bps, inter_bps, latency, numel):
    rank_clock.configure("virtual")
    p2p = P2P(rank, world, bandwidth_bps=inter_bps, latency_s=latency, cluster=Cluster(2, intra_bps, latency))
    flat = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    Ring("hierarchical", numel, inner="plain").run_(flat.clone(), p2p, Stopwatch())     # warm the transport
    rank_clock.sync()
    t0 = rank_clock.now()
    Ring("hierarchical", numel, inner="plain").run_(flat, p2p, Stopwatch())
    return rank_clock.now() - t0


@pytest.mark.slow
def test_the_model_matches_the_hierarchical_ring_in_virtual_time(tmp_path):
    """2 x 2 gloo ranks, the real hierarchical all-reduce on the virtual clock: its slowest rank within 15%
    of the model (wire-bound: the ring's own CPU, unmodelled here, is a small share)."""
    numel, intra, inter, latency = 50_000, 1e8, 1e7, 1e-3
    got = max(run_ranks(_virtual, 4, tmp_path, intra, inter, latency, numel))
    model = _plain_two_level(numel, 2, 2, S.Link(intra, latency), S.Link(inter, latency)).max()
    assert got == pytest.approx(model, rel=0.15)


def _bytes_across(rank, world, entry, per):
    """This rank's bytes to other nodes in one hierarchical all-reduce of option ``entry`` on the CNN's
    gradient (its own declared ring), and its index in its node."""
    from gvq.predict.structure import build_on_one_rank
    agg, numel = build_on_one_rank(f"{entry}:topology=hierarchical", "cnn", 10)
    (ring,) = agg.rings(agg.everything, world)
    p2p = P2P(rank, world, cluster=Cluster(per))
    ring.run_(torch.randn(numel), p2p, Stopwatch())
    agg.close()
    return p2p.bytes_inter, rank % per


@pytest.mark.slow
@pytest.mark.parametrize("world,per", [(4, 2), (8, 4)])
def test_the_models_shards_carry_the_bytes_the_code_sends_across_nodes(tmp_path, world, per):
    """2 x 2 and 2 x 4, rar and 4-bit QSGD (2048-value buckets: the node's shards are unequal): the model's
    shards, laid out on the stored round's units, each carry what the rank holding it sends to the other
    node (at M = 2 a rank sends every segment of its shard once: one in the reduce-scatter, one in the
    all-gather)."""
    from gvq.predict.structure import build_on_one_rank, rounds
    from gvq.predict.two_level import shard_rounds
    for entry in ("rar", "qsgd"):
        agg, _ = build_on_one_rank(entry, "cnn", 10)
        (rnd,) = rounds(entry, agg, world // per)
        agg.close()
        vals, inner = shard_rounds(rnd, per, world // per)
        model = [sum(b for seg in r["bytes"] for b in seg) for r in inner]
        if entry == "qsgd":
            assert len(set(model)) > 1                  # unequal shards: equal 1/R slices would be wrong
        for sent, local in run_ranks(_bytes_across, world, tmp_path, entry, per):
            assert sent == model[(local + 1) % per]     # reduce_scatter_ leaves shard local + 1 with it
        assert vals.sum() == sum(sum(v) for v in rnd["vals"])
