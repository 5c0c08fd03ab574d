"""DGC (gvq/aggregators/dgc.py) on 2-3 gloo ranks: at ratio 1 with masking off it is momentum SGD, with
masking on plain SGD (the 1-D tensors, sent dense, keep their momentum); what v sent plus what it keeps is
what u put in; local clipping at C N^(-1/2) by hand; a resume from the state_dict continues bitwise; bytes
are the wire's; through the launcher it trains the CNN at N = 2, equals rar with SGD's momentum at ratio 1,
and refuses an optimizer with momentum."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from gvq.aggregators.base import RunContext
from gvq.aggregators.dgc import DGCAggregator
from gvq.compressors.dgc import DGC
from tests.helpers.dist import run_ranks

SLOW = pytest.mark.slow
SHAPES = [(6, 8), (4,), (5, 3, 20), (3,)]        # 48 + 4 + 300 + 3: two sparse tensors, two dense
SIZES = [math.prod(s) for s in SHAPES]
NUMEL, ITERS, M = sum(SIZES), 5, 0.9
DENSE = torch.cat([torch.full((n,), len(s) <= 1) for s, n in zip(SHAPES, SIZES)])
NO_EF = {"ef_decay": 1.0, "ef_units": "gradient"}


def _grad(rank, it):
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(100 * it + rank)) * (1 + rank)


def _make(ratio, masking=True, clip=None):
    return DGCAggregator(DGC(ratio), topology="allgather", hop="auto", momentum=M, masking=masking, clip=clip,
                         **NO_EF)


def _run(agg, rank, world, its):
    if not hasattr(agg, "ctx"):
        agg.setup([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES], RunContext(rank, world))
    out = []
    for it in its:
        for p, g in zip(agg.params, torch.split(_grad(rank, it), SIZES)):
            p.grad = g.view_as(p).clone()
        stats = agg.aggregate(it)
        out.append((torch.cat([p.grad.reshape(-1) for p in agg.params]).clone(), agg.u.clone(), agg.v.clone(),
                    stats["bytes_sent"], stats["bytes_received"]))
    return out


def _ranks(rank, world):
    res = {}
    for name, agg in (("off", _make(1.0, masking=False)), ("on", _make(1.0)), ("sparse", _make(0.1)),
                      ("sparse_off", _make(0.1, masking=False)), ("clip", _make(1.0, masking=False, clip=0.5))):
        res[name] = _run(agg, rank, world, range(ITERS))
        agg.close()
    first = _make(0.1)
    _run(first, rank, world, range(3))
    resumed = _make(0.1)
    resumed.setup([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES], RunContext(rank, world))
    resumed.load_state_dict(first.state_dict())
    res["resumed"] = _run(resumed, rank, world, range(3, ITERS))
    first.close()
    resumed.close()
    return res


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request, tmp_path_factory):
    return run_ranks(_ranks, request.param, tmp_path_factory.mktemp("dgc"))


def _mean(world, it):
    return sum(_grad(r, it) for r in range(world)) / world


@SLOW
def test_at_ratio_one_without_masking_it_is_momentum_sgd(ranks):
    world, buf = len(ranks), torch.zeros(NUMEL)
    for it in range(ITERS):
        buf = M * buf + _mean(world, it)                        # torch SGD's buffer (dampening 0)
        for r in ranks:
            assert torch.allclose(r["off"][it][0], buf, rtol=1e-5, atol=1e-5)


@SLOW
def test_at_ratio_one_with_masking_it_is_plain_sgd_but_on_the_dense_tensors(ranks):
    world, buf = len(ranks), torch.zeros(NUMEL)
    for it in range(ITERS):
        g = _mean(world, it)
        buf = M * buf + g
        for r in ranks:
            step = r["on"][it][0]
            assert torch.allclose(step[~DENSE], g[~DENSE], rtol=1e-5, atol=1e-6)
            assert torch.allclose(step[DENSE], buf[DENSE], rtol=1e-5, atol=1e-5)


@SLOW
def test_what_v_sent_and_kept_is_what_the_momentum_put_in(ranks):
    """Momentum correction, masking off: sum_t u_t = v_T + sum_t sent_t, over the ranks (sent: N x the mean)."""
    world = len(ranks)
    put = sum(sum(r["sparse_off"][it][1] for it in range(ITERS)) for r in ranks)
    kept = sum(r["sparse_off"][-1][2] for r in ranks)
    sent = world * sum(ranks[0]["sparse_off"][it][0] for it in range(ITERS))
    assert torch.allclose(put, kept + sent, atol=1e-4)
    for rank, r in enumerate(ranks):                           # u is m u + g there, never masked
        assert torch.allclose(r["sparse_off"][1][1], M * r["sparse_off"][0][1] + _grad(rank, 1), atol=1e-6)


@SLOW
def test_masking_clears_the_momentum_where_v_was_sent_and_only_there(ranks):
    for rank, r in enumerate(ranks):
        u_prev = torch.zeros(NUMEL)
        for it in range(ITERS):
            _, u, v, _, _ = r["sparse"][it]
            cleared = (v == 0) & ~DENSE                        # sent this step: v is 0 there
            assert torch.equal(u[cleared], torch.zeros(int(cleared.sum())))
            assert torch.allclose(u[~cleared], (M * u_prev + _grad(rank, it))[~cleared], atol=1e-6)
            u_prev = u


@SLOW
def test_local_clipping_bounds_each_ranks_gradient_norm_by_c_over_sqrt_n(ranks):
    world = len(ranks)
    bound = 0.5 / math.sqrt(world)
    for rank, r in enumerate(ranks):
        g = _grad(rank, 0)
        clipped = g * min(1.0, bound / float(g.norm()))
        assert torch.allclose(r["clip"][0][1], clipped, atol=1e-6)       # u_0 = the clipped g
        assert float(r["clip"][0][1].norm()) <= bound * (1 + 1e-6)


@SLOW
def test_a_resume_from_the_state_dict_continues_bitwise(ranks):
    for r in ranks:
        for a, b in zip(r["sparse"][3:], r["resumed"]):
            assert all(torch.equal(x, y) for x, y in zip(a[:3], b[:3]))


@SLOW
def test_bytes_are_the_wire_arithmetic(ranks):
    world = len(ranks)
    for ratio, name in ((0.1, "sparse"), (1.0, "off")):
        sparse_k = sum(max(1, math.floor(ratio * n)) for s, n in zip(SHAPES, SIZES) if len(s) > 1)
        payload = 8 * sparse_k + 4 * sum(n for s, n in zip(SHAPES, SIZES) if len(s) <= 1)
        for r in ranks:
            assert {(b, rb) for *_, b, rb in r[name]} == {((world - 1) * payload, (world - 1) * payload)}


def test_a_ring_a_server_and_bad_knobs_are_refused_in_one_line():
    for topology in ("ring", "ps"):
        with pytest.raises(ValueError, match=f"topology={topology}: .*use topology=allgather"):
            DGCAggregator(DGC(), topology=topology, hop="auto", momentum=M, masking=True, clip=None, **NO_EF)
    with pytest.raises(ValueError, match="momentum"):
        DGCAggregator(DGC(), topology="allgather", hop="auto", momentum=1.0, masking=True, clip=None, **NO_EF)
    with pytest.raises(ValueError, match="clip"):
        DGCAggregator(DGC(), topology="allgather", hop="auto", momentum=M, masking=True, clip=0.0, **NO_EF)


def test_an_optimizer_with_momentum_is_refused_before_any_rank_starts(tmp_path):
    from tests.helpers.launch import launch_job
    code, summary = launch_job(tmp_path, "aggregator=dgc", "iterations=2")      # optim.momentum=0.9, the default
    assert code == 2 and summary is None
    assert not list(tmp_path.glob("metrics.csv"))


CNN = ("logger=csv", "logger.progress=false", "iterations=6", "eval_every=6", "world_size=2", "batch_size=16",
       "optim.weight_decay=0")


@SLOW
def test_dgc_trains_the_cnn_and_logs_the_bytes_of_its_wire(tmp_path):
    from gvq.models import DigitsCNN
    from tests.helpers.launch import launch_job
    code, summary = launch_job(tmp_path, "aggregator=dgc", "aggregator.compressor.ratio=0.01", "optim.momentum=0",
                               *CNN)
    assert code == 0, summary
    shapes = [p.shape for p in DigitsCNN(num_classes=10, in_channels=1, width=16).parameters()]
    payload = sum(8 * max(1, math.floor(0.01 * s.numel())) if len(s) > 1 else 4 * s.numel() for s in shapes)
    df = pd.read_csv(tmp_path / "metrics.csv")
    assert set(df.bytes_sent) == set(df.bytes_received) == {payload}                 # N - 1 = 1 payload
    assert math.isfinite(summary["final_test_loss"]) and (df.compression_error < 1).all()


@SLOW
def test_at_ratio_one_without_masking_the_run_equals_rar_with_sgds_momentum(tmp_path):
    from tests.helpers.launch import launch_job
    code, _ = launch_job(tmp_path / "dgc", "aggregator=dgc", "aggregator.compressor.ratio=1",
                         "aggregator.masking=false", "optim.momentum=0", *CNN)
    assert code == 0
    code, _ = launch_job(tmp_path / "rar", "aggregator=rar", "optim.momentum=0.9", *CNN)
    assert code == 0
    dgc, rar = (pd.read_csv(tmp_path / d / "metrics.csv") for d in ("dgc", "rar"))
    assert len(dgc) == len(rar) == 6
    assert dgc.train_loss.to_numpy() == pytest.approx(rar.train_loss.to_numpy(), rel=1e-4)
    assert dgc.test_loss.dropna().to_numpy() == pytest.approx(rar.test_loss.dropna().to_numpy(), rel=1e-4)
