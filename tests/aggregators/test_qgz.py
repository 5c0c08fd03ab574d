"""aggregator=qgz (gvq/aggregators/qgz.py): built from its option file as the CLI builds it, at 2 x 2 on
gloo ranks its mean is the exact mean with fp32 phases and the codec's lossless setting (16 bits: within
fp32 rounding of a step), 4-bit QSGD's within its error, the bytes per link class logged; its knobs are refused
outside their choices; the CLI trains it on a two-level net in virtual time."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from gvq.aggregators.base import RunContext
from gvq.comm.links import Cluster
from tests.helpers.dist import run_ranks
from tests.helpers.launch import launch_job

SHAPES = ((6, 2, 3, 3), (6,), (10, 7), (10,))


def _grads(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _mean_of(rank, world, overrides):
    """This rank's mean through ``aggregator=qgz`` with ``overrides`` at 2 x 2, and its byte columns."""
    from gvq.hooks.config import build_aggregator
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    agg = build_aggregator("qgz", **overrides)
    agg.setup(params, RunContext(rank, world, cluster=Cluster(2)))
    try:
        for p, g in zip(params, _grads(rank)):
            p.grad.copy_(g)
        stats = agg.aggregate(0)
        return torch.cat([p.grad.reshape(-1) for p in params]), stats["bytes_sent"], stats["bytes_inter"]
    finally:
        agg.close()


def _cases(rank, world):
    fine = {"intra": "fp32", "gather": "fp32", "compressor.bits": 16, "compressor.bucket": 16}
    return {"fine": _mean_of(rank, world, fine), "four": _mean_of(rank, world, {"compressor.bucket": 16})}


@pytest.mark.slow
def test_the_mean_at_2x2_is_the_exact_one_up_to_the_quantizer(tmp_path):
    results = run_ranks(_cases, 4, tmp_path)
    exact = torch.stack([torch.cat([g.reshape(-1) for g in _grads(r)]) for r in range(4)]).mean(0)
    numel = exact.numel()
    for got in results:
        mean, sent, inter = got["fine"]
        assert torch.allclose(mean, exact, atol=1e-3)               # 16 bits: a step is 2^-15 of a block's max
        # fp32 gather: each rank's piece (1/4 of the vector) to the other node, its shard to its node-mate
        assert inter > 4 * numel / 4 and sent > inter
        mean, sent, inter = got["four"]
        assert 0 < torch.linalg.vector_norm(mean - exact) < 0.5 * torch.linalg.vector_norm(exact)
        assert 0 < inter < sent < 4 * numel                           # 4 bits: under one fp32 vector in all
        assert torch.equal(mean, results[0]["four"][0])               # every rank the same bits


CNN = ("logger=csv", "logger.progress=false", "iterations=4", "eval_every=4", "world_size=4", "batch_size=16")


@pytest.mark.slow
def test_qgz_trains_on_two_nodes_in_virtual_time_and_logs_the_inter_node_bytes(tmp_path):
    code, summary = launch_job(tmp_path, "aggregator=qgz", "net=nodes2x4", "net.ranks_per_node=2", *CNN)
    assert code == 0, summary
    df = pd.read_csv(tmp_path / "metrics.csv")
    assert set(df.clock) == {"virtual"} and math.isfinite(summary["final_test_loss"])
    assert (df.bytes_inter > 0).all() and (df.bytes_inter < df.bytes_sent).all()


@pytest.mark.parametrize("key", ["intra=fp8", "gather=fp16"])
def test_a_wire_outside_its_choices_is_refused_at_compose_time(compose_cfg, key):
    from tests.schema.test_options import _refusal
    line = _refusal(compose_cfg, "aggregator=qgz", f"aggregator.{key}")
    assert line.startswith(f"aggregator.{key}: expected one of"), line
