"""Error feedback (gvq/aggregators/error_feedback.py): what a rank's compressor lost is fed back next time."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from gvq.aggregators.base import RunContext
from gvq.aggregators.compressed import CompressedAggregator
from gvq.aggregators.error_feedback import ErrorFeedback, ErrorFeedbackAggregator
from gvq.compressors.signsgd import ScaledSignSGD
from tests.helpers.dist import run_ranks
from tests.helpers.toy_compressors import Projection

SLOW = pytest.mark.slow          # a test that starts processes (make test-fast skips it)


def _ef_case(rank, world, make, topology, iters, ef):
    params = [torch.nn.Parameter(torch.zeros(64))]
    cls = ErrorFeedbackAggregator if ef else CompressedAggregator
    agg = cls(make(), topology=topology, hop="auto", ef_decay=1.0, ef_units="gradient")
    agg.setup(params, RunContext(rank, world))
    g = torch.Generator().manual_seed(rank)
    base = torch.linspace(-1, 1, 64) ** 3                       # a persistent, uneven direction
    out = {"sum_agg": torch.zeros(64), "sum_true": torch.zeros(64), "checks": []}
    for it in range(iters):
        grad = base + 0.3 * torch.randn(64, generator=g)
        true = grad.clone()
        dist.all_reduce(true)
        e_prev = agg.feedback.memory.clone() if ef else None
        params[0].grad.copy_(grad)
        agg.aggregate(it)
        out["sum_agg"] += params[0].grad
        out["sum_true"] += true / world
        if ef:
            out["checks"].append((grad, e_prev, agg.transmitted.clone(), agg.feedback.memory.clone(),
                                  params[0].grad.clone()))
    agg.close()
    return out


def _ef_cases(rank, world):
    def sign():                     # biased: the case EF exists for
        return ScaledSignSGD(bucket=16)

    def proj():                     # additive: the pipelined ring, mode b
        return Projection(unit=8, d=3)

    return {"sign_allgather": _ef_case(rank, world, sign, "allgather", 80, True),
            "sign_allgather_plain": _ef_case(rank, world, sign, "allgather", 80, False),
            "sign_ring": _ef_case(rank, world, sign, "ring", 5, True),
            "proj_ring": _ef_case(rank, world, proj, "ring", 5, True)}


@pytest.fixture(scope="module")
def ef_run(tmp_path_factory):
    return run_ranks(_ef_cases, 2, tmp_path_factory.mktemp("ef"))


@SLOW
@pytest.mark.parametrize("case", ["sign_allgather", "sign_ring", "proj_ring"])
def test_error_feedback_original_equals_transmitted_plus_residual(ef_run, case):
    for r in ef_run:
        for grad, e_prev, sent, e, _ in r[case]["checks"]:
            original = grad + e_prev                              # g' as the aggregator forms it
            assert torch.equal(e, original - sent)                # e is g' - t, rounded once
            gap = (sent.double() + e.double() - original.double()).abs()
            assert bool((gap <= 2.0 ** -24 * (original - sent).double().abs()).all())


@SLOW
@pytest.mark.parametrize("case", ["sign_allgather", "proj_ring"])
def test_error_feedback_transmitted_is_what_the_ring_sums(ef_run, case):
    """Deterministic compressors on allgather and on the additive ring send exactly t = Q(g')."""
    n = len(ef_run)
    for k in range(len(ef_run[0][case]["checks"])):
        mean_sent = sum(r[case]["checks"][k][2] for r in ef_run) / n
        assert torch.allclose(ef_run[0][case]["checks"][k][4], mean_sent, atol=1e-5)


@SLOW
def test_error_feedback_bounds_the_accumulated_error_of_a_biased_compressor(ef_run):
    def drift(case):
        r = ef_run[0][case]
        return float((r["sum_agg"] - r["sum_true"]).norm() / r["sum_true"].norm())
    with_ef, without = drift("sign_allgather"), drift("sign_allgather_plain")
    assert with_ef < 0.05 and with_ef < without / 5, (with_ef, without)   # measured: 0.027 vs 0.33



def test_error_feedback_adds_the_memory_before_and_keeps_what_the_payload_left_out():
    x, e = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, -0.5, 0.25])
    ErrorFeedback.feed_(x, e)
    assert torch.equal(x, torch.tensor([1.5, 1.5, 3.25]))
    ErrorFeedback.keep_(e, x, torch.tensor([1.0, 2.0, 3.0]))        # e <- g' - t
    assert torch.equal(e, torch.tensor([0.5, -0.5, 0.25]))
    ErrorFeedback.keep_(e, e, torch.tensor([1.0, 1.0, 1.0]), alpha=0.5)  # in place: e <- e - sent / 2
    assert torch.equal(e, torch.tensor([0.0, -1.0, -0.25]))
    ErrorFeedback.keep_(e, torch.tensor([7.0, 8.0, 9.0]))           # what was left out, given whole
    assert torch.equal(e, torch.tensor([7.0, 8.0, 9.0]))


@pytest.mark.parametrize("option,overrides,key", [
    ("powersgd", {}, "error"),
    ("gradiveq", {"error_feedback": True}, "residual"),
    ("signsgd", {"_target_": "gvq.aggregators.error_feedback.ErrorFeedbackAggregator"}, "error"),
])
def test_every_aggregator_that_feeds_back_holds_one_error_feedback_and_checkpoints_it_under_its_old_key(
        option, overrides, key):
    """GradiVeQ, PowerSGD and error feedback compose the one :class:`ErrorFeedback`: a bucket's state is
    its memory, and a checkpoint keeps it under the key checkpoints written before it had (they load)."""
    from gvq.hooks.config import build_aggregator
    params = [torch.nn.Parameter(torch.zeros(s)) for s in ((6, 2, 3, 3), (6,), (5, 6, 3, 3))]
    a, b = (build_aggregator(option, **overrides) for _ in range(2))
    for agg in (a, b):
        agg.setup(params, RunContext(0, 1))
    try:
        assert isinstance(a.feedback, ErrorFeedback) and a.per_parameter()[key] is a.feedback.memory
        a.feedback.memory.normal_()
        saved = a.state_dict()
        assert torch.equal(saved[key], a.feedback.memory) and saved[key] is not a.feedback.memory
        b.load_state_dict(saved)
        assert torch.equal(b.feedback.memory, a.feedback.memory)
    finally:
        a.close(), b.close()


# -- EF-SignSGD and 1-bit SGD (gvq/compressors/efsignsgd.py, onebit.py): averaged over N, memory invariant --
SIGN_SHAPES = [(4, 3, 2, 2), (4,), (6, 8), (1,)]


def _sign_ef_case(rank, world, make, iters=6):
    """float64 parameters: the memory is float64, so the invariant holds to float64 rounding."""
    from gvq.compressors.efsignsgd import EFSignSGD
    from gvq.compressors.onebit import OneBit
    codec = {"efsignsgd": EFSignSGD, "onebit": OneBit, "onebit_column": lambda: OneBit("column")}[make]()
    params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64)) for s in SIGN_SHAPES]
    agg = ErrorFeedbackAggregator(codec, topology="allgather", hop="auto", ef_decay=1.0, ef_units="gradient")
    agg.setup(params, RunContext(rank, world))
    g = torch.Generator().manual_seed(rank)
    inputs, sent, means = torch.zeros(agg.offsets[-1], dtype=torch.float64), [], []
    for it in range(iters):
        grad = torch.randn(agg.offsets[-1], generator=g, dtype=torch.float64)
        inputs += grad
        agg.bucket.copy_(grad)
        agg.aggregate(it)
        sent.append(agg.transmitted.clone())
        means.append(agg.bucket.clone())
    out = {"inputs": inputs, "sent": sent, "means": means, "error": agg.feedback.memory.clone()}
    agg.close()
    return out


@pytest.fixture(scope="module")
def sign_ef_run(tmp_path_factory):
    return run_ranks(_sign_ef_cases, 3, tmp_path_factory.mktemp("sign_ef"))


def _sign_ef_cases(rank, world):
    return {m: _sign_ef_case(rank, world, m) for m in ("efsignsgd", "onebit", "onebit_column")}


@SLOW
@pytest.mark.parametrize("codec", ["efsignsgd", "onebit", "onebit_column"])
def test_sign_codecs_average_their_decoded_payloads_over_n_ranks(sign_ef_run, codec):
    """The mean, not GRACE's sum: what every rank ends with is (1/N) sum_i Q(g'_i)."""
    n = len(sign_ef_run)
    for it in range(len(sign_ef_run[0][codec]["sent"])):
        want = sum(r[codec]["sent"][it] for r in sign_ef_run) / n
        for r in sign_ef_run:
            assert torch.allclose(r[codec]["means"][it], want, rtol=1e-6, atol=1e-7)


@SLOW
@pytest.mark.parametrize("codec", ["efsignsgd", "onebit", "onebit_column"])
def test_sign_codecs_memory_keeps_what_was_not_sent(sign_ef_run, codec):
    """Sum of what was sent + the memory left = sum of the inputs (float64, to its rounding)."""
    for r in sign_ef_run:
        c = r[codec]
        gap = (sum(c["sent"]) + c["error"] - c["inputs"]).abs().max()
        assert float(gap) <= 1e-12 * float(c["inputs"].abs().max() + 1), gap


def _cnn_shapes():
    from gvq.models import DigitsCNN
    return [tuple(p.shape) for p in DigitsCNN(num_classes=10, in_channels=1, width=16).parameters()]


@SLOW
@pytest.mark.parametrize("option,side,groups", [
    ("efsignsgd", 4, lambda shapes: len(shapes)),
    ("onebit", 8, lambda shapes: len(shapes)),
    ("onebit aggregator.compressor.scope=column", 8, lambda shapes: sum(s[0] if len(s) > 1 else 1 for s in shapes)),
])
@pytest.mark.parametrize("overlap", [False, True])
def test_sign_options_train_the_cnn_and_log_the_bytes_of_their_wire(tmp_path, option, side, groups, overlap):
    """Through the launcher: each rank sends its payload N - 1 times on the allgather (n/8 bytes of bits
    and ``side`` bytes per group); overlapped in small DDP buckets, the groups are still the tensors."""
    from tests.helpers.launch import launch_job
    extra = ["aggregator.overlap=true", "aggregator.bucket_cap_mb=0.004"] if overlap else []
    code, summary = launch_job(tmp_path, f"aggregator={option.split()[0]}", *option.split()[1:], *extra,
                               "logger=csv", "logger.progress=false", "iterations=6", "eval_every=6",
                               "world_size=2", "batch_size=16")
    assert code == 0, summary
    df = pd.read_csv(tmp_path / "metrics.csv")
    shapes = _cnn_shapes()
    numel = sum(math.prod(s) for s in shapes)
    assert math.isfinite(summary["final_test_loss"])
    want = math.ceil(numel / 8) + side * groups(shapes)
    if not overlap:
        assert set(df.bytes_sent) == {want}
    else:                 # each DDP bucket (whole tensors, at most one a tensor) pads its bits to a byte
        assert ((df.bytes_sent >= want) & (df.bytes_sent < want + len(shapes))).all(), (set(df.bytes_sent), want)


def _fed_run(overrides: dict, lrs: list[float], dtype=torch.float64, seed: int = 0):
    """One rank's topk + error feedback over ``len(lrs)`` steps at those learning rates: per step its
    gradient, the memory before, what it transmitted, the memory after, and the mean it returned."""
    from gvq.hooks.config import build_aggregator
    params = [torch.nn.Parameter(torch.zeros(s, dtype=dtype)) for s in ((4, 3, 3), (4,), (30,))]
    agg = build_aggregator("topk", **{"compressor.ratio": 0.1, **overrides})
    lr = iter(lrs)
    now = {}
    agg.setup(params, RunContext(0, 1, lr=lambda: now["lr"]))
    g = torch.Generator().manual_seed(seed)
    steps = []
    try:
        for it, now["lr"] in enumerate(lr):
            grads = [torch.randn(p.shape, generator=g, dtype=dtype) for p in params]
            for p, x in zip(params, grads):
                p.grad.copy_(x)
            before = agg.feedback.memory.clone()
            agg.aggregate(it)
            steps.append({"g": torch.cat([x.reshape(-1) for x in grads]), "e_before": before,
                          "sent": agg.transmitted.clone(), "e": agg.feedback.memory.clone(),
                          "mean": torch.cat([p.grad.reshape(-1) for p in params])})
        codec = agg.codec_for(agg.everything)
    finally:
        agg.close()
    return steps, codec


def test_error_feedback_sent_plus_memory_is_the_sum_of_the_inputs_in_float64():
    """beta = 1: sum_t sent_t + e_T = sum_t g_t, up to float64 rounding (each step adds one rounding)."""
    steps, _ = _fed_run({}, [0.1] * 12)
    total_in = sum(s["g"] for s in steps)
    total_out = sum(s["sent"] for s in steps) + steps[-1]["e"]
    assert steps[-1]["e"].abs().max() > 0.1                      # something was held back
    assert torch.allclose(total_out, total_in, rtol=0, atol=1e-13)


def test_decayed_error_feedback_follows_its_recurrence_by_hand():
    """e <- beta * e before it is added: p = g + beta e, t = C(p), e' = p - t."""
    beta = 0.75
    steps, codec = _fed_run({"ef_decay": beta}, [0.1] * 6, dtype=torch.float32)
    e = torch.zeros_like(steps[0]["g"])
    whole = slice(0, e.numel())
    for s in steps:
        p = s["g"] + beta * e
        t = codec.decompress(codec.compress(p, whole), whole)
        assert torch.equal(s["sent"], t) and torch.equal(s["mean"], t)
        e = p - t
        assert torch.equal(s["e"], e)
    plain, _ = _fed_run({}, [0.1] * 6, dtype=torch.float32)
    assert not torch.equal(plain[-1]["e"], steps[-1]["e"])       # beta changed something


def test_step_units_equal_gradient_units_under_a_constant_lr():
    grad, _ = _fed_run({}, [0.25] * 6, dtype=torch.float32)
    step, _ = _fed_run({"ef_units": "step"}, [0.25] * 6, dtype=torch.float32)
    for a, b in zip(grad, step):
        assert torch.allclose(a["mean"], b["mean"], rtol=1e-6, atol=1e-7)
        assert torch.allclose(0.25 * a["e"], b["e"], rtol=1e-6, atol=1e-7)     # e in units of lr * g


def test_step_units_keep_the_residual_in_units_of_the_update_when_the_lr_changes():
    """p = lr_t g + e, t = C(p), e' = p - t, and the optimizer is handed t / lr_t (it multiplies by lr_t
    again): a residual left at one lr is applied at its own, where gradient units rescale it by
    lr_{t+1} / lr_t."""
    lrs = [0.4, 0.4, 0.1, 0.1, 0.025, 0.8]
    step, codec = _fed_run({"ef_units": "step"}, lrs, dtype=torch.float32)
    grad, _ = _fed_run({}, lrs, dtype=torch.float32)
    e = torch.zeros_like(step[0]["g"])
    whole = slice(0, e.numel())
    for s, lr in zip(step, lrs):
        p = lr * s["g"] + e
        t = codec.decompress(codec.compress(p, whole), whole)
        assert torch.equal(s["sent"], t)
        assert torch.allclose(s["mean"], t / lr, rtol=1e-6)
        e = p - t
        assert torch.equal(s["e"], e)
    assert not torch.allclose(step[3]["mean"], grad[3]["mean"], rtol=1e-3)      # after the lr fell


def test_step_units_without_a_learning_rate_are_refused_in_one_line():
    from gvq.hooks.config import build_aggregator
    agg = build_aggregator("topk", ef_units="step")
    with pytest.raises(ValueError, match="aggregator.ef_units=step") as e:
        agg.setup([torch.nn.Parameter(torch.zeros(3))], RunContext(0, 1))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("decay", [-0.1, 1.5])
def test_a_decay_outside_0_1_is_refused_naming_the_key(decay):
    from gvq.hooks.config import build_aggregator
    with pytest.raises(ValueError, match="aggregator.ef_decay"):
        build_aggregator("topk", ef_decay=decay)
