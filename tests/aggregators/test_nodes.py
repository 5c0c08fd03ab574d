"""``aggregator.topology=hierarchical`` for the aggregators with a natural form of their own (PowerSGD, DGC:
the node is the worker, gvq/aggregators/nodes.py; GradiVeQ: its compressed ring across nodes on whole codec
units; Signum: the nodes vote), on 4 gloo ranks as 2 nodes x 2: each equals its flat algorithm run at 2
ranks on the nodes' inputs (PowerSGD, DGC: the node's mean gradient; GradiVeQ, Signum: the node's sum),
over iterations that carry state; the bytes across nodes are the flat run's (summed over a node's ranks,
whose shards tile the vector) and the bytes inside a node a dense reduce-scatter and all-gather's."""
from __future__ import annotations

import math

import pytest
import torch

from gvq.aggregators.base import RunContext
from gvq.aggregators.dgc import DGCAggregator
from gvq.aggregators.gradiveq import GradiVeQAggregator
from gvq.aggregators.powersgd import PowerSGDAggregator
from gvq.aggregators.signum import SignumAggregator
from gvq.comm.links import Cluster
from gvq.compressors.dgc import DGC
from gvq.compressors.gradiveq.codec import GradiVeQ
from gvq.compressors.signum import SignVote
from gvq.schema.options import GradiVeQAggregatorSchema, PowerSGDSchema, knobs
from tests.helpers.dist import run_ranks

SHAPES = [(8, 4, 3, 3), (6, 8), (4,), (12, 10), (3,)]     # a conv layer (GradiVeQ's), matrices, 1-D tensors
SIZES = [math.prod(s) for s in SHAPES]
NUMEL, ITERS, PER = sum(SIZES), 3, 2
NO_EF = {"ef_decay": 1.0, "ef_units": "gradient"}


def _make(name: str, topology: str):
    if name == "powersgd":
        return PowerSGDAggregator(**knobs(PowerSGDSchema, rank=2, start_iter=0, topology=topology))
    if name == "gradiveq":
        return GradiVeQAggregator(GradiVeQ(lam=0.01), **knobs(GradiVeQAggregatorSchema, L_t=4, topology=topology))
    if name == "dgc":
        return DGCAggregator(DGC(0.1), topology=topology if topology != "ring" else "allgather", hop="auto",
                             momentum=0.9, masking=True, clip=None, **NO_EF)
    return SignumAggregator(SignVote("int8"), topology=topology, hop="auto", beta=0.9, **NO_EF)


def _grad(rank: int, it: int) -> torch.Tensor:
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(100 * it + rank)) * (1 + rank % 3)


def _input(name: str, rank: int, world: int, it: int) -> torch.Tensor:
    """This rank's gradient; at the flat reference (world 2) its node's: the mean of the node's two ranks'
    (the worker of PowerSGD and DGC), or their sum (GradiVeQ's and Signum's nodes send sums)."""
    if world == 2 * PER:
        return _grad(rank, it)
    node = _grad(PER * rank, it) + _grad(PER * rank + 1, it)
    return node / PER if name in ("powersgd", "dgc") else node


def _run(rank, world, name, topology, per):
    agg = _make(name, topology)
    agg.setup([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES], RunContext(rank, world, cluster=Cluster(per)))
    if name == "gradiveq":
        agg.prepare_benchmark([])           # a fitted basis (the same on every rank), the compressed phase
    out = []
    for it in range(ITERS):
        for p, g in zip(agg.params, torch.split(_input(name, rank, world, it), SIZES)):
            p.grad = g.view_as(p).clone()
        stats = agg.aggregate(it)
        out.append((torch.cat([p.grad.reshape(-1) for p in agg.params]).clone(), stats["bytes_sent"],
                    stats["bytes_inter"]))
    agg.close()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["powersgd", "gradiveq", "dgc", "signum"])
def test_hierarchical_at_2x2_is_the_flat_algorithm_among_the_nodes(tmp_path, name):
    hier = run_ranks(_run, 4, tmp_path, name, "hierarchical", PER)
    flat = run_ranks(_run, 2, tmp_path, name, "ring", 1)
    # the flat run's mean is over 2 workers; GradiVeQ's node sums (world 2) are divided by 2, not 4
    scale = 2.0 if name == "gradiveq" else 1.0
    for rank, per_it in enumerate(hier):
        node = rank // PER
        for it, (mean, sent, inter) in enumerate(per_it):
            ref = flat[node][it][0] / scale
            assert torch.allclose(mean, ref, rtol=1e-4, atol=1e-5), (name, rank, it)
            assert sent - inter == 4 * NUMEL * 2 * (PER - 1) / PER          # dense fp32, in and out of the node
    for node in range(2):
        for it in range(ITERS):
            inter = sum(hier[PER * node + j][it][2] for j in range(PER))
            assert inter == flat[node][it][1], (name, node, it)           # the shards tile the flat payload


def test_error_feedback_is_refused_on_gradiveq_hierarchical():
    with pytest.raises(ValueError, match="topology=hierarchical"):
        GradiVeQAggregator(GradiVeQ(), **knobs(GradiVeQAggregatorSchema, error_feedback=True,
                                               topology="hierarchical"))
