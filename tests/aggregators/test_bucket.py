"""The per-bucket contract of gvq/aggregators/base.py (``begin_iteration``, ``average_bucket_``,
``end_iteration``), as gvq.hooks drives it, for every ring option of conf/aggregator/, on 2-3 gloo
ranks with synthetic gradients:

* one bucket holding every parameter (DDP's first iteration) gives post-backward ``aggregate()``'s
  result bitwise, over the whole schedule (same vectors, same operations, same random draws);
* several buckets (a split of the parameters, in DDP's reverse order), re-bucketed between iterations,
  give post-backward's result where the codec's arithmetic does not depend on where the vector is cut
  (rar, fp16, fp16 + error feedback, powersgd, gradiveq with rar sampling; quantizers with per-block
  scales or random draws are cut differently by design): bitwise for rar at N = 2 (each value is one
  two-term sum either way), within float tolerance otherwise (a 3-term sum's order follows the ring
  segment; GEMM shapes and the PCA fit's inputs follow the bucket; fp16 within one fp16 rounding);
  the state left behind (error memory, P / Q, bases) matches too, so a re-bucketing loses nothing;
* GradiVeQ's Eq. (1) holds per bucket (the ring's sum of payloads decodes to the sum of gradients);
* ``state_dict`` / ``load_state_dict`` in the middle of a bucketed run resumes it bitwise.
"""
from __future__ import annotations

import io
import math

import pytest
import torch

from gvq.aggregators.base import RunContext
from gvq.hooks.config import build_aggregator
from tests.helpers.dist import once_per_key, run_cases, run_ranks

# two conv layers (GradiVeQ's groups), their biases, a matrix (PowerSGD's low-rank block) and its bias
SHAPES = [(4, 2, 3, 3), (4,), (6, 4, 3, 3), (6,), (3, 24), (3,)]
NUMELS = [math.prod(s) for s in SHAPES]
ALL = [list(range(len(SHAPES)))]
SCHEDULE = {"warmup": 1, "L_t": 3, "L_c": 3}
POOLED = {"K": "x1", "pool": True, "target_ratio": 8}        # conf/aggregator/gradiveq_pooled.yaml
OPTIONS = {         # conf/aggregator options, with short schedules; EF: fp16 with error feedback
    "rar": ("rar", {}), "fp16": ("fp16", {}), "qsgd": ("qsgd", {}), "terngrad": ("terngrad", {}),
    "signsgd": ("signsgd", {}), "linear": ("linear", {}), "orq": ("orq", {}),
    "bingrad_b": ("bingrad_b", {}), "bingrad_pb": ("bingrad_pb", {}),
    "fp16+ef": ("fp16", {"_target_": "gvq.aggregators.error_feedback.ErrorFeedbackAggregator"}),
    "signsgd+ef": ("signsgd", {"_target_": "gvq.aggregators.error_feedback.ErrorFeedbackAggregator"}),
    "powersgd": ("powersgd", {"start_iter": 2}),
    "powersgd-cold": ("powersgd", {"start_iter": 1, "warm_start": False}),
    "gradiveq": ("gradiveq", SCHEDULE),
    "gradiveq-rar": ("gradiveq", {**SCHEDULE, "sampling": "rar"}),
    "gradiveq_pooled": ("gradiveq", {**SCHEDULE, "compressor": POOLED}),
    "gradiveq_pooled-rar": ("gradiveq", {**SCHEDULE, "sampling": "rar", "compressor": POOLED}),
    "gradiveq-ef": ("gradiveq", {**SCHEDULE, "sampling": "rar", "error_feedback": True}),
    "efsignsgd": ("efsignsgd", {}), "onebit": ("onebit", {}),
    "onebit-column": ("onebit", {"compressor.scope": "column"}),
    "signum": ("signum", {}), "signum-bits": ("signum", {"compressor.vote": "bits", "topology": "allgather"}),
}
CUT_FREE = ["rar", "fp16", "fp16+ef", "powersgd", "powersgd-cold", "gradiveq-rar", "gradiveq_pooled-rar",
            "gradiveq-ef", "efsignsgd", "onebit", "onebit-column", "signum", "signum-bits"]
# fp16's ring rounds a sum to fp16 on every rank but the segment's owner: where the cut moves the owner,
# a value differs by one fp16 rounding
TOLERANCE = {"fp16": {"rtol": 2e-3, "atol": 4e-3}, "fp16+ef": {"rtol": 2e-3, "atol": 4e-3}}
SLOW = pytest.mark.slow            # make test only (make test-fast: the quick loop keeps a sample)


def layout(it: int) -> list[list[int]]:
    """DDP's buckets at iteration ``it``: one bucket first, then rebuilt (reverse order), re-cut later."""
    if it == 0:
        return ALL
    return [[4, 5], [2, 3], [0, 1]] if it < 5 else [[3, 4, 5], [0, 1, 2]]


def grads(rank: int, it: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7919 * it + 31 * rank + 1)
    shared = torch.Generator().manual_seed(it)           # a common part, so PCA has a signal to keep
    return [torch.randn(s, generator=shared) + 0.3 * torch.randn(s, generator=g) for s in SHAPES]


def _build(option: str, rank: int, world: int, overlap: bool):
    """Set up to average after backward, or bound only (``overlap``: DDP's buckets hold the gradients)."""
    name, overrides = OPTIONS[option]
    agg = build_aggregator(name, **overrides)
    bind = agg.bind if overlap else agg.setup
    bind([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES], RunContext(rank, world, seed=3))
    return agg


def post_backward(agg, rank: int, it: int) -> torch.Tensor:
    for p, g in zip(agg.params, grads(rank, it)):
        p.grad.copy_(g)
    agg.aggregate(it)
    return torch.cat([p.grad.reshape(-1) for p in agg.params])


def bucketed(agg, rank: int, it: int, buckets) -> torch.Tensor:
    """One iteration as the hook runs it: ``begin``, each bucket averaged in place, ``end``."""
    g, out = grads(rank, it), torch.empty(sum(NUMELS))
    agg.begin_iteration(it)
    for params in buckets:
        flat = torch.cat([g[i].reshape(-1) for i in params])
        agg.average_bucket_(flat, params, it)
        agg.scatter_(out, params, flat)
    agg.end_iteration(it)
    return out


def _state(agg) -> bytes:
    buf = io.BytesIO()
    torch.save(agg.state_dict(), buf)
    return buf.getvalue()


def _compare(rank, world, option, iterations, split):
    post, buck = _build(option, rank, world, False), _build(option, rank, world, True)
    out = {"post": [], "bucketed": []}
    for it in range(iterations):
        out["post"].append(post_backward(post, rank, it))
        out["bucketed"].append(bucketed(buck, rank, it, layout(it) if split else ALL))
    out["states"] = (post.state_dict(), buck.state_dict())
    post.close(), buck.close()
    return out


def _flat_state(sd) -> list[torch.Tensor]:
    """Every tensor of a state dict, in key order (the generators' states are bytes: compared too)."""
    if isinstance(sd, torch.Tensor):
        return [sd.float() if sd.is_floating_point() else sd]
    if isinstance(sd, dict):
        return [t for k in sorted(sd, key=str) for t in _flat_state(sd[k])]
    if isinstance(sd, (list, tuple)):
        return [t for v in sd for t in _flat_state(v)]
    return []


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    """``spawned(fn, world, batch)[case]``: the per-rank results of ``fn(rank, world, *case)``, every case
    of ``batch`` run in one spawn, once per module (a spawn costs more than a case here); a failed batch
    fails each of its tests with the case that failed."""
    group = once_per_key(lambda fn, world, batch: run_cases(fn, world, tmp_path_factory.mktemp("ranks"), batch))
    return lambda fn, world, batch: group((fn.__name__, world, batch), fn, world, batch)


def batched(cases: list[tuple], quick) -> list:
    """pytest params for ``cases``, each with the batch it runs in: the cases ``quick`` keeps (make
    test-fast's sample) in one, the rest (marked slow: make test only) in another."""
    fast = tuple(c for c in cases if quick(c))
    slow = tuple(c for c in cases if not quick(c))
    return [pytest.param(*c, fast, id="-".join(map(str, c))) if quick(c)
            else pytest.param(*c, slow, id="-".join(map(str, c)), marks=SLOW) for c in cases]


#: the options make test-fast keeps for the one-bucket comparison: one per kind of state (none, residuals,
#: a quantizer's fit, PowerSGD's Q, GradiVeQ's schedule in both sampling modes); make test runs them all
ONE_BUCKET_QUICK = {"rar", "fp16+ef", "qsgd", "orq", "powersgd", "gradiveq", "gradiveq_pooled-rar"}


def _one_bucket(rank, world, option):
    return _compare(rank, world, option, 9, False)


def _rebucketed(rank, world, option):
    return _compare(rank, world, option, 9, True)


@pytest.mark.parametrize("option,batch", batched([(o,) for o in sorted(OPTIONS)], lambda c: c[0] in ONE_BUCKET_QUICK))
def test_one_bucket_is_post_backward_aggregation_bitwise(spawned, option, batch):
    for r in spawned(_one_bucket, 2, batch)[(option,)]:
        for a, b in zip(r["post"], r["bucketed"]):
            assert torch.equal(a, b)
        for a, b in zip(*map(_flat_state, r["states"])):
            assert torch.equal(a, b)


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=SLOW)])
@pytest.mark.parametrize("option", CUT_FREE)
def test_buckets_rebucketed_average_as_post_backward(spawned, option, world):
    exact = world == 2 and option == "rar"
    tol = TOLERANCE.get(option, {"rtol": 1e-4, "atol": 1e-5})
    for r in spawned(_rebucketed, world, tuple((o,) for o in CUT_FREE))[(option,)]:
        for it, (a, b) in enumerate(zip(r["post"], r["bucketed"])):
            if exact:
                assert torch.equal(a, b), it
            else:
                torch.testing.assert_close(b, a, **tol)
        post, buck = map(_flat_state, r["states"])
        assert len(post) == len(buck)
        for a, b in zip(post, buck):              # error memory, P / Q, bases, samples: nothing lost
            if a.is_floating_point():
                torch.testing.assert_close(b, a, **tol)
            else:
                assert torch.equal(a, b)


def _resume(rank, world, option, stop, iterations=10):
    whole, first = _build(option, rank, world, True), _build(option, rank, world, True)
    want = [bucketed(whole, rank, it, layout(it)) for it in range(iterations)]
    for it in range(stop):
        bucketed(first, rank, it, layout(it))
    saved = _state(first)
    first.close()
    again = _build(option, rank, world, True)
    again.load_state_dict(torch.load(io.BytesIO(saved)))
    got = [bucketed(again, rank, it, layout(it)) for it in range(stop, iterations)]
    whole.close(), again.close()
    return want[stop:], got


#: make test-fast keeps one stop per kind of state: error memory, P/Q, the PCA schedule
RESUME_QUICK = {("fp16+ef", 3), ("qsgd", 4), ("powersgd", 3), ("gradiveq", 4)}
RESUMES = [("fp16+ef", 3), ("signsgd+ef", 6), ("qsgd", 4), ("powersgd", 3), ("powersgd-cold", 6), ("gradiveq", 2),
           ("gradiveq-ef", 6),
           ("gradiveq", 4), ("gradiveq", 6)]


@pytest.mark.parametrize("option,stop,batch", batched(RESUMES, lambda c: c in RESUME_QUICK))
def test_checkpoint_resumes_a_bucketed_run_bitwise(spawned, option, stop, batch):
    for want, got in spawned(_resume, 2, batch)[(option, stop)]:
        for it, (a, b) in enumerate(zip(want, got)):
            assert torch.equal(a, b), f"iteration {stop + it}"


def _eq1(rank, world):
    # Eq. 1 on a compressed iteration: the monitor off, so random test gradients cannot end the phase
    agg = build_aggregator("gradiveq", **SCHEDULE, sampling="rar", monitor_threshold=None)
    agg.bind([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES], RunContext(rank, world, seed=3))
    for it in range(5):                           # warm-up, 3 samples (refit), then compressed
        bucketed(agg, rank, it, layout(it))
    assert agg.phase == "compress"
    out = []
    for params in layout(5):
        codec = agg.compressor.restricted_to(params)
        everyone = [codec.flatten([grads(r, 5)[i] for i in params]) for r in range(world)]
        whole = slice(0, everyone[0].numel())
        summed = codec.decompress(sum(codec.compress(g, whole) for g in everyone), whole)
        want = [torch.empty(SHAPES[i]) for i in params]
        codec.unflatten(summed / world, want)
        out.append(torch.cat([w.reshape(-1) for w in want]))
    got = bucketed(agg, rank, 5, layout(5))
    agg.close()
    return got, [agg.gather(got, params) for params in layout(5)], out


def test_gradiveq_eq1_holds_per_bucket(tmp_path):
    """A compressed iteration's bucket, summed as payloads along the ring, is the decoded sum of every
    rank's payload of that bucket (Eq. 1: linear, plus the mean's N shares)."""
    results = run_ranks(_eq1, 3, tmp_path)
    for got, pieces, want in results:
        for a, b in zip(pieces, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got, results[0][0], rtol=0, atol=0)      # replicas identical


def _monitor(rank, world):
    name, overrides = OPTIONS["gradiveq-rar"]
    agg = build_aggregator(name, **overrides, monitor_threshold=1e-12)
    agg.bind([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES], RunContext(rank, world, seed=3))
    phases = []
    for it in range(6):
        agg.start_iteration(it)
        for params in layout(it):
            agg.average_bucket_(torch.cat([grads(rank, it)[i].reshape(-1) for i in params]), params, it)
        phases.append((agg.finish_iteration(it), agg.phase))
    agg.close()
    return phases, agg.monitor_stops


def test_gradiveq_monitor_votes_after_the_last_bucket(tmp_path):
    """Bucketed, the Eq. 7 vote reads the iteration's loss off every bucket's payloads after the last
    one (every rank votes, from the communication thread's side) and stops compression from the next
    iteration on."""
    for phases, stops in run_ranks(_monitor, 2, tmp_path):
        assert [p["phase"] for p, _ in phases] == ["warmup", "sample", "sample", "sample", "compress", "sample"]
        columns, after = phases[4]
        assert after == "sample" and stops == 1
        assert columns["compression_error"] > 1e-12 and columns["monitor_s"] >= 0
        assert math.isnan(phases[3][0]["compression_error"]) and phases[3][0]["fit_s"] >= 0
