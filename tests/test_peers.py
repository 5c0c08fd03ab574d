"""The peers users would pick instead: PowerSGD on our ring, error feedback, torch DDP (+ its hooks)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from dist_helpers import run_ranks
from gvq.aggregate import CompressedAggregator, RunContext
from gvq.compressors.powersgd import orthogonalize, plan
from gvq.compressors.signsgd import ScaledSignSGD
from gvq.ddp_agg import DDPAggregator
from gvq.error_feedback import ErrorFeedbackAggregator
from gvq.powersgd_agg import PowerSGDAggregator
from toy_compressors import Projection

# conv 6x3x3x3 -> 6x27 (rank 2), a bias, conv 8x6x3x3, fc 10x32, and a 3x3 that goes raw (no gain)
SHAPES = [(6, 3, 3, 3), (6,), (8, 6, 3, 3), (8,), (10, 32), (10,), (3, 3)]
ITERS = 3                       # iteration 0 uncompressed (start_iter=1), then 2 PowerSGD iterations


def _grads(rank: int, it: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * it + rank)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _set(params, grads):
    for p, x in zip(params, grads):
        p.grad.copy_(x)


def _flat(grads):
    return torch.cat([x.reshape(-1) for x in grads])


def _powersgd_run(rank, world):
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    agg = PowerSGDAggregator(rank=2, start_iter=1)
    agg.setup(params, RunContext(rank, world, seed=7))
    q0 = {i: q.clone() for i, q in agg.lr.q.items()}
    out = {"q0": q0, "stats": [], "result": [], "phat": [], "segs": [[(s.start, s.stop) for s in segs] for segs in (agg.p_segs, agg.q_segs)]}
    for it in range(ITERS):
        _set(params, _grads(rank, it))
        out["stats"].append(agg.aggregate(it))
        out["result"].append(agg.bucket.clone())
        out["phat"].append({i: t.clone() for i, t in agg.lr.phat.items()})
    agg.close()
    return out


@pytest.fixture(scope="module", params=[2, 3])
def powersgd_run(request, tmp_path_factory):
    world = request.param
    return world, run_ranks(_powersgd_run, world, tmp_path_factory.mktemp(f"psgd{world}"))


def _reference(world, q0):
    """PowerSGD on the summed gradients in one process, with the same initial Q and error feedback."""
    blocks = plan(SHAPES, 2, 2.0)
    q, err, outs, phats = dict(q0), torch.zeros(blocks[-1].stop), [], []
    outs.append(sum(_flat(_grads(r, 0)) for r in range(world)) / world)    # start_iter: plain mean
    for it in range(1, ITERS):
        m = sum(_flat(_grads(r, it)) for r in range(world)) + err        # sum_w M_w = sum g + sum e
        out, phat = m.clone(), {}
        for i, b in enumerate(blocks):
            if not b.rank:
                continue
            mb = m[b.start: b.stop].view(b.rows, b.cols)
            phat[i] = orthogonalize(mb @ q[i])
            qsum = mb.t() @ phat[i]
            out[b.start: b.stop] = (phat[i] @ qsum.t()).reshape(-1)
            q[i] = orthogonalize(qsum)
        err = m - out                                   # sum over ranks of their residuals
        outs.append(out / world)
        phats.append(phat)
    return outs, phats


def test_powersgd_through_the_ring_equals_powersgd_on_the_summed_gradients(powersgd_run):
    world, ranks = powersgd_run
    outs, phats = _reference(world, ranks[0]["q0"])
    for r in ranks:
        for it in range(ITERS):
            assert torch.allclose(r["result"][it], outs[it], rtol=1e-4, atol=1e-5), (world, it)
        for it in range(1, ITERS):
            for i, ref in phats[it - 1].items():
                assert torch.allclose(r["phat"][it][i], ref, atol=1e-4), (world, it, i)
    assert [s["phase"] for s in ranks[0]["stats"]] == ["allreduce", "powersgd", "powersgd"]


def test_powersgd_p_hat_and_result_are_bitwise_identical_on_all_ranks(powersgd_run):
    _, ranks = powersgd_run
    for r in ranks[1:]:
        for it in range(ITERS):
            assert torch.equal(r["result"][it], ranks[0]["result"][it])
            assert all(torch.equal(r["phat"][it][i], t) for i, t in ranks[0]["phat"][it].items())


def _sent(segs, payload_len, rank, n):
    """What additive_allreduce_ sends: every segment but r+1 (reduce-scatter), but r+2 (all-gather)."""
    sizes = [payload_len(slice(*s)) for s in segs]
    return 2 * sum(sizes) - sizes[(rank + 1) % n] - sizes[(rank + 2) % n]


def test_powersgd_bytes_are_both_passes_payloads_as_the_ring_sends_them(powersgd_run):
    world, ranks = powersgd_run
    blocks = plan(SHAPES, 2, 2.0)
    numel = blocks[-1].stop

    def length(which):
        return lambda s: sum(getattr(b, which) for b in blocks if s.start <= b.start < s.stop)
    total = sum(b.p_len + b.q_len for b in blocks)
    for rank, r in enumerate(ranks):
        p_segs, q_segs = r["segs"]
        want = 4 * (_sent(p_segs, length("p_len"), rank, world) + _sent(q_segs, length("q_len"), rank, world))
        assert [s["bytes_sent"] for s in r["stats"][1:]] == [want, want]
        assert want <= 4 * total * 2 * (world - 1) / world * 1.5        # ~2(N-1)/N of both payloads
        assert r["stats"][0]["bytes_sent"] >= 4 * numel * (world - 1) / world   # uncompressed ring


def test_powersgd_compression_error_is_the_local_projection_error(powersgd_run):
    world, ranks = powersgd_run
    blocks = plan(SHAPES, 2, 2.0)
    m = _flat(_grads(0, 1))                       # rank 0's M at its first compressed iteration (e = 0)
    lost = sum(float((mb - ph @ (ph.t() @ mb)).pow(2).sum())
               for i, b in enumerate(blocks) if b.rank
               for mb, ph in [(m[b.start: b.stop].view(b.rows, b.cols), ranks[0]["phat"][1][i])])
    assert ranks[0]["stats"][1]["compression_error"] == pytest.approx(lost / float(m.pow(2).sum()),
                                                                     rel=1e-3)
    assert ranks[0]["stats"][0]["compression_error"] == 0.0


# -- error feedback --------------------------------------------------------------------------------

def _ef_case(rank, world, make, topology, iters, ef):
    params = [torch.nn.Parameter(torch.zeros(64))]
    cls = ErrorFeedbackAggregator if ef else CompressedAggregator
    agg = cls(make(), topology=topology)
    agg.setup(params, RunContext(rank, world))
    g = torch.Generator().manual_seed(rank)
    base = torch.linspace(-1, 1, 64) ** 3                       # a persistent, uneven direction
    out = {"sum_agg": torch.zeros(64), "sum_true": torch.zeros(64), "checks": []}
    for it in range(iters):
        grad = base + 0.3 * torch.randn(64, generator=g)
        true = grad.clone()
        dist.all_reduce(true)
        e_prev = agg.error.clone() if ef else None
        params[0].grad.copy_(grad)
        agg.aggregate(it)
        out["sum_agg"] += params[0].grad
        out["sum_true"] += true / world
        if ef:
            out["checks"].append((grad, e_prev, agg.transmitted.clone(), agg.error.clone(),
                                  params[0].grad.clone()))
    agg.close()
    return out


def _ef_cases(rank, world):
    sign = lambda: ScaledSignSGD(bucket=16)     # noqa: E731  (biased: the case EF exists for)
    proj = lambda: Projection(unit=8, d=3)      # noqa: E731  (additive: the pipelined ring, mode b)
    return {"sign_allgather": _ef_case(rank, world, sign, "allgather", 80, True),
            "sign_allgather_plain": _ef_case(rank, world, sign, "allgather", 80, False),
            "sign_ring": _ef_case(rank, world, sign, "ring", 5, True),
            "proj_ring": _ef_case(rank, world, proj, "ring", 5, True)}


@pytest.fixture(scope="module")
def ef_run(tmp_path_factory):
    return run_ranks(_ef_cases, 2, tmp_path_factory.mktemp("ef"))


@pytest.mark.parametrize("case", ["sign_allgather", "sign_ring", "proj_ring"])
def test_error_feedback_original_equals_transmitted_plus_residual(ef_run, case):
    for r in ef_run:
        for grad, e_prev, sent, e, _ in r[case]["checks"]:
            original = grad + e_prev                              # g' as the aggregator forms it
            assert torch.equal(e, original - sent)                # e is g' - t, rounded once
            gap = (sent.double() + e.double() - original.double()).abs()
            assert bool((gap <= 2.0 ** -24 * (original - sent).double().abs()).all())


@pytest.mark.parametrize("case", ["sign_allgather", "proj_ring"])
def test_error_feedback_transmitted_is_what_the_ring_sums(ef_run, case):
    """Deterministic compressors on allgather and on the additive ring send exactly t = Q(g')."""
    n = len(ef_run)
    for k in range(len(ef_run[0][case]["checks"])):
        mean_sent = sum(r[case]["checks"][k][2] for r in ef_run) / n
        assert torch.allclose(ef_run[0][case]["checks"][k][4], mean_sent, atol=1e-5)


def test_error_feedback_bounds_the_accumulated_error_of_a_biased_compressor(ef_run):
    def drift(case):
        r = ef_run[0][case]
        return float((r["sum_agg"] - r["sum_true"]).norm() / r["sum_true"].norm())
    with_ef, without = drift("sign_allgather"), drift("sign_allgather_plain")
    assert with_ef < 0.05 and with_ef < without / 5, (with_ef, without)   # measured: 0.027 vs 0.33


# -- torch DDP and training ------------------------------------------------------------------------

def _mean_grad_check(rank, world):
    """After backward through DDP, p.grad is the mean over ranks of the local gradients."""
    out = {}
    for hook in ("allreduce", "fp16"):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
        x = torch.randn(8, 5, generator=torch.Generator().manual_seed(rank))
        local = torch.autograd.grad(net(x).square().sum(), list(net.parameters()))
        agg = DDPAggregator(hook=hook)
        agg.setup(list(net.parameters()), RunContext(rank, world))
        model = agg.wrap(net)
        model(x).square().sum().backward()
        stats = agg.aggregate(0)
        means = [g.clone() for g in local]
        for m in means:
            dist.all_reduce(m)
        out[hook] = ([p.grad.clone() for p in net.parameters()], [m / world for m in means], stats)
    return out


def test_ddp_leaves_the_mean_gradient_in_p_grad(tmp_path):
    for r in run_ranks(_mean_grad_check, 2, tmp_path):
        for hook, tol in (("allreduce", 1e-6), ("fp16", 2e-3)):
            grads, means, stats = r[hook]
            assert all(torch.allclose(g, m, rtol=tol, atol=tol) for g, m in zip(grads, means)), hook
            numel = sum(m.numel() for m in means)
            assert stats["bytes_sent"] == numel * (4 if hook == "allreduce" else 2)   # 2(N-1)/N = 1
            assert stats["ddp_comm_s"] >= stats["ddp_wait_s"] >= 0 and stats["ddp_comm_s"] > 0


TRAINED = ("rar", "ddp", "ddp_fp16", "ddp_powersgd", "powersgd")


def _train_all(rank, world, cfgs, root):
    from gvq.train import train
    out = {}
    for name, cfg in cfgs.items():
        summary = train(cfg, rank, world, f"{root}/{name}", {"run_dir": f"{root}/{name}"})
        out[name] = None if summary is None else summary["final_test_acc"]
    return out


def test_ddp_aggregators_and_powersgd_train_digits_to_the_rar_band(compose_cfg, tmp_path):
    cfgs = {}
    for name in TRAINED:
        cfg = compose_cfg(f"aggregator={name}", "iterations=150", "eval_every=150", "logger=csv",
                          "logger.progress=false")
        cfgs[name] = OmegaConf.to_container(cfg, resolve=True)
        (tmp_path / name).mkdir()
    acc = run_ranks(_train_all, 2, tmp_path, cfgs, str(tmp_path), timeout=240)[0]
    assert acc["rar"] >= 0.9, acc
    for name in TRAINED[1:]:
        assert abs(acc[name] - acc["rar"]) <= 0.04, acc     # replicas equal: train() checks it


@pytest.mark.parametrize("make,key", [
    (lambda: PowerSGDAggregator(rank=0), "aggregator.rank"),
    (lambda: PowerSGDAggregator(rank=1.5), "aggregator.rank"),
    (lambda: PowerSGDAggregator(start_iter=-1), "aggregator.start_iter"),
    (lambda: PowerSGDAggregator(min_compression_rate=0), "aggregator.min_compression_rate"),
    (lambda: DDPAggregator(hook="powersgd", rank=0), "aggregator.rank"),
    (lambda: DDPAggregator(hook="powersgd", start_iter=1), "aggregator.start_iter"),
    (lambda: DDPAggregator(hook="nope"), "aggregator.hook"),
])
def test_bad_knobs_raise_value_error_naming_the_key(make, key):
    with pytest.raises(ValueError, match=key):
        make()


def test_powersgd_state_roundtrips_for_a_bitwise_resume():
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    a, b = PowerSGDAggregator(rank=2), PowerSGDAggregator(rank=2)
    a.setup(params, RunContext(0, 2, seed=1))
    b.setup(params, RunContext(0, 2, seed=2))
    a.error.normal_()
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.error, b.error)
    assert all(torch.equal(a.lr.q[i], b.lr.q[i]) for i in a.lr.q)
