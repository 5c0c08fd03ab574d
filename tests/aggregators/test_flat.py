"""``aggregate_error`` (gvq/aggregators/flat.py), opt-in through ``RunContext.aggregate_error``: the error of
the mean the ranks end with, ||mean - exact||^2 / ||exact||^2, against the exact mean of the raw gradients
they were given, on 2-3 gloo ranks with gradients the test can rebuild, so it computes the same figure on
its own from every rank's gradient and the mean the aggregator left:

* rar's mean is the exact mean within float rounding; 2-bit QSGD's is not, and the figure is the test's;
* re-encoding the partial sum at every ring hop costs the mean more than encoding each gradient once
  (``topology=allgather``): the question ZeRO++ raises (issue 60);
* off, the column is NaN, no collective is added, and bytes and the mean are those of a run with it on;
* gvq's hook (several DDP buckets an iteration) sums the error over the buckets: the whole gradient's.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gvq.aggregators.base import RunContext
from gvq.hooks import GvqHookState, gvq_hook
from gvq.hooks.config import build_aggregator
from tests.helpers.dist import once_per_key, run_cases, run_ranks

SHAPES = [(5, 4, 3, 3), (5,), (7, 20), (7,)]
ITERATIONS = 4
WORLD = 3
OPTIONS = {
    "rar": ("rar", {}),
    "qsgd-ring": ("qsgd", {"compressor.bits": 2}),                           # re-encoded at every hop
    "qsgd-allgather": ("qsgd", {"compressor.bits": 2, "topology": "allgather"}),   # encoded once
}


def grads(rank: int, it: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * it + rank)
    return [torch.randn(s, generator=g) for s in SHAPES]


def error_of(mean: torch.Tensor, raw: list[torch.Tensor]) -> float:
    """The figure computed here, from every rank's raw gradient (float64, as an exact reference)."""
    exact = torch.stack([r.double() for r in raw]).mean(0)
    return float((mean.double() - exact).square().sum() / exact.square().sum())


def _post_backward(rank, world, option, on):
    """Every iteration's mean, column and bytes, and how many all-reduces the aggregator called."""
    name, overrides = OPTIONS[option]
    agg = build_aggregator(name, **overrides)
    agg.setup([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES], RunContext(rank, world, seed=3, aggregate_error=on))
    calls, real = [], dist.all_reduce
    dist.all_reduce = lambda *a, **k: (calls.append(1), real(*a, **k))[1]    # counted, then done
    try:
        out = []
        for it in range(ITERATIONS):
            for p, g in zip(agg.params, grads(rank, it)):
                p.grad.copy_(g)
            stats = agg.aggregate(it)
            out.append({"mean": torch.cat([p.grad.reshape(-1) for p in agg.params]).clone(),
                        "error": stats["aggregate_error"], "bytes": stats["bytes_sent"]})
    finally:
        dist.all_reduce = real
        agg.close()
    return {"rows": out, "all_reduces": len(calls)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(option, on)``: every rank's result; every case in one group of 3 ranks."""
    cases = tuple((o, on) for o in OPTIONS for on in (True, False))
    group = once_per_key(lambda: run_cases(_post_backward, WORLD, tmp_path_factory.mktemp("flat"), cases))
    return lambda option, on: group("all")[(option, on)]


def _checked(runs, option):
    """Per iteration (the column on rank 0, the one computed here); every rank's figure is the same."""
    ranks = runs(option, True)
    out = []
    for it in range(ITERATIONS):
        mine = [r["rows"][it]["error"] for r in ranks]
        assert max(mine) - min(mine) <= 1e-12 * max(1.0, max(mine)), mine
        flat_raw = [torch.cat([g.reshape(-1) for g in grads(r, it)]) for r in range(WORLD)]
        out.append((mine[0], error_of(ranks[0]["rows"][it]["mean"], flat_raw)))
    return out


def test_rar_mean_is_the_exact_mean_within_float_rounding(runs):
    for logged, here in _checked(runs, "rar"):
        assert 0 <= logged < 1e-12 and logged == pytest.approx(here, abs=1e-13)


def test_qsgd_ring_error_is_the_error_of_the_mean_every_rank_ends_with(runs):
    for logged, here in _checked(runs, "qsgd-ring"):
        assert logged > 1e-3 and logged == pytest.approx(here, rel=1e-6)


def test_reencoding_at_every_ring_hop_costs_the_mean_more_than_encoding_once(runs):
    """At N = 3 and 2 bits the ring encodes each segment's partial sum twice more; the all-gather encodes
    each gradient once and the mean divides the independent errors by N."""
    ring = sum(logged for logged, _ in _checked(runs, "qsgd-ring"))
    once = sum(logged for logged, _ in _checked(runs, "qsgd-allgather"))
    assert once > 0 and ring > 1.5 * once, (ring, once)


@pytest.mark.parametrize("option", list(OPTIONS))
def test_off_logs_nan_adds_no_collective_and_changes_neither_bytes_nor_mean(runs, option):
    on, off = runs(option, True), runs(option, False)
    for r_on, r_off in zip(on, off):
        assert r_on["all_reduces"] == ITERATIONS and r_off["all_reduces"] == 0   # one per vector, when on
        for a, b in zip(r_on["rows"], r_off["rows"]):
            assert math.isnan(b["error"]) and not math.isnan(a["error"])
            assert a["bytes"] == b["bytes"] > 0 and torch.equal(a["mean"], b["mean"])


# -- inside backward: gvq's hook averages DDP's buckets, several an iteration --------------------------
def _hooked(rank, world):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8),
                              torch.nn.ReLU(), torch.nn.Linear(8, 4))
    ddp = DistributedDataParallel(net, bucket_cap_mb=0.0005)           # a bucket a layer or so
    state = GvqHookState.from_config("qsgd", ddp, {"compressor.bits": 2}, seed=3, aggregate_error=True)
    ddp.register_comm_hook(state, gvq_hook)
    out = []
    for it in range(3):
        g = torch.Generator().manual_seed(10 * it + rank)
        x, y = torch.randn(6, 12, generator=g), torch.randint(0, 4, (6,), generator=g)
        loss = torch.nn.functional.cross_entropy
        local = torch.autograd.grad(loss(net(x), y), list(net.parameters()))
        loss(ddp(x), y).backward()
        stats = state.iteration_stats()
        out.append({"local": torch.cat([t.reshape(-1) for t in local]),
                    "mean": torch.cat([p.grad.reshape(-1) for p in net.parameters()]),
                    "error": stats["aggregate_error"], "buckets": stats["buckets"]})
        net.zero_grad(set_to_none=True)
    state.close()
    return out


def test_the_hook_sums_the_error_over_an_iterations_buckets(tmp_path):
    """DDP's first iteration is one bucket; its rebuilt buckets after it are several."""
    ranks = run_ranks(_hooked, 2, tmp_path)
    assert all(row["buckets"] >= 2 for row in ranks[0][1:]), [row["buckets"] for row in ranks[0]]
    for it in range(3):
        rows = [r[it] for r in ranks]
        here = error_of(rows[0]["mean"], [row["local"] for row in rows])
        assert rows[0]["error"] > 1e-3 and rows[0]["error"] == pytest.approx(here, rel=1e-6)
