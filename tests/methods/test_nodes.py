"""method.workers=node (gvq/methods/nodes.py) at 2 x 2 (4 gloo ranks, net.ranks_per_node=2): a node's ranks
identical after every inner step, all four after an outer step, the inner steps on the intra-node links only,
the outer step's inter-node bytes the aggregator's on Δ over 2 nodes split over the node's ranks; H = 1 with
a unit outer SGD step equals every_step through the training loop; one rank a node equals workers=rank;
the flat net refused at validation."""
from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from gvq.aggregators.base import RunContext
from gvq.aggregators.rar import RingAllReduce
from gvq.comm.links import Cluster
from gvq.methods.diloco import DiLoCo
from gvq.run.validate import validate
from gvq.schema.errors import ConfigError
from tests.helpers.dist import run_ranks

SMALL = ["logger=csv", "logger.progress=false", "model.width=4", "batch_size=16"]


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _everyone(flat: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(out, flat)
    return out


def _steps(rank, world, per, workers, iterations=7):
    """A small MLP, AdamW inner, DiLoCo H = 3 (Nesterov outer) on ``per`` ranks a node: per iteration whether
    it synced, every rank's parameters, and this rank's bytes_sent / bytes_inter."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    agg, method = RingAllReduce(topology="ring"), DiLoCo(every=3, workers=workers)
    agg.setup(list(model.parameters()), method.aggregator_context(RunContext(rank, world, cluster=Cluster(per))))
    method.setup(list(model.parameters()), agg)
    rows = []
    for it in range(iterations):
        g = torch.Generator().manual_seed(100 * rank + it)
        x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        stats = {**method.before_step(it)}
        opt.step()
        stats.update(method.after_step(it))
        rows.append((method.syncs(it), _everyone(_flat(model)), stats["bytes_sent"], stats["bytes_inter"]))
    method.close()
    agg.close()
    return rows, _flat(model).numel()


def _variants(rank, world):
    """The three runs in one group of 4 ranks: 2 x 2 with node workers, and 4 x 1 with node and rank workers."""
    return {(per, workers): _steps(rank, world, per, workers) for per, workers in
            ((2, "node"), (1, "node"), (1, "rank"))}


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    return run_ranks(_variants, 4, tmp_path_factory.mktemp("nodes"))


def test_nodes_hold_one_replica_and_an_outer_step_joins_them(variants):
    """2 x 2: after every inner step the two ranks of a node hold bitwise the same parameters and the two
    nodes differ; after the outer steps (iterations 2 and 5) all four agree bitwise.  Inner steps send the
    gradient's ring inside the node (n values x 4 bytes at R = 2) and nothing across; an outer step sends,
    summed over a node's ranks, the ring's bytes on Δ over 2 nodes (n x 4 bytes) across nodes, plus the
    blocks' all-gather and that step's gradient ring inside it."""
    ranks = [v[(2, "node")] for v in variants]
    n = ranks[0][1]
    for it, (synced, params, _, _) in enumerate(ranks[0][0]):
        assert synced == (it in (2, 5))
        assert torch.equal(params[0], params[1]) and torch.equal(params[2], params[3]), it
        assert torch.equal(params[0], params[2]) == synced, it
        inters = [r[0][it][3] for r in ranks]
        if not synced:
            assert inters == [0] * 4 and all(r[0][it][2] == 4 * n for r in ranks), it
        else:
            assert inters[0] + inters[1] == inters[2] + inters[3] == 4 * n and min(inters) > 0, inters
            # its block out across nodes and inside the node, plus the step's own gradient ring in the node
            assert all(r[0][it][2] == 2 * r[0][it][3] + 4 * n for r in ranks), it


def test_one_rank_a_node_is_workers_rank(variants):
    """net.ranks_per_node=1: workers=node (singleton nodes, the outer ring over every rank) trains bitwise
    as workers=rank, bytes included."""
    for v in variants:
        for (sa, pa, ba, ia), (sb, pb, bb, ib) in zip(v[(1, "node")][0], v[(1, "rank")][0]):
            assert sa == sb and ba == bb and ia == ib and all(torch.equal(x, y) for x, y in zip(pa, pb))


def _train_all(rank, world, cfgs, root):
    from gvq.run.train import train
    for name, cfg in cfgs.items():
        train(cfg, rank, world, f"{root}/{name}", {"run_dir": f"{root}/{name}"})


@pytest.mark.slow
def test_h_1_with_a_unit_outer_step_equals_every_step(compose_cfg, tmp_path):
    """Through the training loop at 2 x 2, plain SGD: workers=node with H = 1, outer lr 1, momentum 0 is
    θ − lr·mean over nodes of the node's mean gradient = every_step's θ − lr·mean(g), by another order of
    float32 operations: the losses within 1e-5 relative.  The inner half alone (no outer step) would train
    each node on its own data; a Δ averaged over the wrong ranks would leave the nodes apart (the run's
    replica check fails)."""
    sgd = [*SMALL, "optim.momentum=0", "optim.warmup_iters=0", "iterations=6", "eval_every=3", "world_size=4",
           "net.ranks_per_node=2"]
    runs = {"every_step": sgd, "node": [*sgd, "method=diloco", "method.workers=node", "method.every=1",
                                        "method.outer_lr=1", "method.outer_momentum=0"]}
    cfgs = {}
    for name, overrides in runs.items():
        cfgs[name] = OmegaConf.to_container(compose_cfg(*overrides), resolve=True)
        (tmp_path / name).mkdir()
    run_ranks(_train_all, 4, tmp_path, cfgs, str(tmp_path), timeout=240)
    df = {name: pd.read_csv(tmp_path / name / "metrics.csv") for name in runs}
    for col in ("train_loss", "test_loss"):
        a, b = df["every_step"][col].dropna(), df["node"][col].dropna()
        assert len(a) == len(b) and ((a - b).abs() <= 1e-5 * a.abs()).all(), (col, a, b)
    assert (df["node"].synced == 1).all() and (df["node"].bytes_inter > 0).all()


def test_workers_node_is_refused_on_a_flat_net(compose_cfg):
    """One line at validation: nodes of one rank are the flat net; a mistyped value is refused at compose."""
    with pytest.raises(ConfigError, match="method.workers=node needs nodes of several ranks"):
        validate(compose_cfg("method=diloco", "method.workers=node", "world_size=4"))
    validate(compose_cfg("method=diloco", "method.workers=node", "world_size=4", "net.ranks_per_node=2"))
    with pytest.raises(Exception, match="workers"):
        compose_cfg("method=diloco", "method.workers=nodes")
