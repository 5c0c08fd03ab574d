"""ZeRO++'s qgZ (gvq/comm/alltoall_quant.py) on 4 gloo ranks as 2 x 2, one node of 4 and 4 nodes of 1: with a
lossless codec the sum is the exact one at every shape; with fp32 intra-node and gather phases each value
is off by at most one quantization step of the one encoding it went through; stochastic 4-bit QSGD is
unbiased (Monte Carlo); the bytes per link class are the wire arithmetic of the three phases."""
from __future__ import annotations

import pytest
import torch

from gvq.comm.alltoall_quant import shard_pieces
from gvq.comm.clock import Stopwatch
from gvq.comm.links import Cluster
from gvq.comm.p2p import P2P
from gvq.comm.ring import Ring
from gvq.compressors.base import Compressor
from gvq.compressors.qsgd import QSGD
from tests.helpers.dist import run_ranks

NUMEL, BUCKET, TRIALS = 1024, 64, 48
SHAPES = (2, 4, 1)                                      # ranks a node: 2 x 2, 1 x 4, 4 x 1 (flat)


def _x(rank: int) -> torch.Tensor:
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(1000 + rank))


def _run(p2p, codec, cuts, intra="compressed", gather="compressed", x=None):
    flat = x.clone() if x is not None else _x(p2p.rank)
    p2p.reset()
    Ring("qgz", cuts, codec, inner=intra, gather=gather).run_(flat, p2p, Stopwatch())
    return flat, p2p.bytes_sent, p2p.bytes_inter


def _sums(rank, world):
    """Per shape: the identity codec's sum and bytes (every phase compressed), 4-bit QSGD's with fp32
    intra and gather phases, and its bytes with every phase compressed and with an fp16 intra phase."""
    out = []
    for per in SHAPES:
        p2p = P2P(rank, world, cluster=Cluster(per))
        q = QSGD(bits=4, bucket=BUCKET, norm="max", kernels="torch")
        q.reseed(rank)
        out.append({"exact": _run(p2p, Compressor(), NUMEL), "fp32": _run(p2p, q, q.cuts(NUMEL), "fp32", "fp32"),
                    "qsgd": _run(p2p, q, q.cuts(NUMEL)), "fp16": _run(p2p, q, q.cuts(NUMEL), "fp16")})
    return out


def _step_bound(per: int, world: int) -> torch.Tensor:
    """Per value: one QSGD step (max| | of its bucket / 7) of the node sum of each node but its owner's, the
    one encoding a value goes through with fp32 intra-node and gather phases (the owner adds its own raw)."""
    nodes = world // per
    sums = torch.stack([_x(r) for r in range(world)]).reshape(nodes, per, NUMEL).sum(1)
    step = (sums.reshape(nodes, -1, BUCKET).abs().amax(-1, keepdim=True) / 7).expand(-1, -1, BUCKET)
    step = step.reshape(nodes, NUMEL)
    bound = step.sum(0)
    for shard in shard_pieces(QSGD(bucket=BUCKET).cuts(NUMEL), per, nodes):
        for m, q in enumerate(shard):
            bound[q] -= step[m, q]
    return bound


def _expected_bytes(codec, cuts, per, world, rank, plain_intra: int = 0):
    """(sent, across nodes) by the wire arithmetic: shards to node-mates (the codec's payloads, or
    ``plain_intra`` bytes a value), pieces across, then the gather."""
    parts, nodes = shard_pieces(cuts, per, world // per), world // per
    node, j = divmod(rank, per)
    size = codec.payload_nbytes
    shard = (lambda q: plain_intra * (q.stop - q.start)) if plain_intra else size
    intra = sum(shard(q) for k in range(per) if k != j for q in [slice(parts[k][0].start, parts[k][-1].stop)])
    inter = sum(size(parts[j][m]) for m in range(nodes) if m != node) + (nodes - 1) * size(parts[j][node])
    intra += (per - 1) * sum(size(q) for q in parts[j])
    return intra + inter, inter


def test_the_pieces_tile_the_vector_on_the_codecs_cuts():
    cuts = QSGD(bucket=BUCKET).cuts(NUMEL)
    parts = shard_pieces(cuts, 2, 3)
    flat = [q for shard in parts for q in shard]
    assert flat[0].start == 0 and flat[-1].stop == NUMEL
    assert all(a.stop == b.start for a, b in zip(flat, flat[1:]))
    assert all(q.start in cuts and q.stop in cuts for q in flat)


@pytest.mark.slow
def test_sums_bounds_and_bytes_at_every_shape_of_4_ranks(tmp_path):
    results = run_ranks(_sums, 4, tmp_path)
    ref = torch.stack([_x(r) for r in range(4)]).sum(0)
    for rank, per_shape in enumerate(results):
        for per, got in zip(SHAPES, per_shape):
            flat, sent, inter = got["exact"]
            assert torch.allclose(flat, ref, atol=1e-5, rtol=1e-5), per
            assert (sent, inter) == _expected_bytes(Compressor(), NUMEL, per, 4, rank), per
            assert (got["fp32"][0] - ref).abs().le(_step_bound(per, 4) + 1e-5).all(), per
            q = QSGD(bits=4, bucket=BUCKET, norm="max", kernels="torch")
            assert got["qsgd"][1:] == _expected_bytes(q, q.cuts(NUMEL), per, 4, rank), per
            assert got["fp16"][1:] == _expected_bytes(q, q.cuts(NUMEL), per, 4, rank, plain_intra=2), per
            assert torch.linalg.vector_norm(got["qsgd"][0] - ref) < 0.5 * torch.linalg.vector_norm(ref), per
        assert all(torch.equal(per_shape[i]["qsgd"][0], results[0][i]["qsgd"][0]) for i in range(3))


def _trials(rank, world):
    """2 x 2: TRIALS reseeded 4-bit runs (every phase compressed) of the same inputs."""
    p2p = P2P(rank, world, cluster=Cluster(2))
    q = QSGD(bits=4, bucket=BUCKET, norm="max", kernels="torch")
    runs = []
    for t in range(TRIALS):
        q.reseed(1000 * t + rank)
        runs.append(_run(p2p, q, q.cuts(NUMEL))[0])
    return torch.stack(runs)


@pytest.mark.slow
def test_stochastic_4_bit_is_unbiased(tmp_path):
    """The mean of TRIALS runs is TRIALS^-1/2 as far from the exact sum as one run is, give or take (a
    biased quantizer's mean would stay as far)."""
    runs = run_ranks(_trials, 4, tmp_path)[0]
    ref = torch.stack([_x(r) for r in range(4)]).sum(0)
    one = torch.linalg.vector_norm(runs - ref, dim=1).mean()
    mean = torch.linalg.vector_norm(runs.mean(0) - ref)
    assert mean < 2.0 * one / TRIALS ** 0.5
    assert one > 0
