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
    agg = cls(make(), topology=topology, hop="auto")
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
    agg = ErrorFeedbackAggregator(codec, topology="allgather", hop="auto")
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
