"""PowerSGD on our pipelined ring (gvq/aggregators/powersgd.py) against PowerSGD on the summed gradients."""
from __future__ import annotations

import pytest
import torch

from gvq.aggregators.base import RunContext
from gvq.aggregators.powersgd import PowerSGDAggregator
from gvq.compressors.powersgd import orthogonalize, plan
from gvq.schema.options import PowerSGDSchema, knobs
from tests.helpers.dist import run_ranks
from tests.helpers.grads import SHAPES, flat, grads_at, set_grads

ITERS = 3                       # iteration 0 uncompressed (start_iter=1), then 2 PowerSGD iterations


def _powersgd_run(rank, world):
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    agg = PowerSGDAggregator(**knobs(PowerSGDSchema, rank=2, start_iter=1))
    agg.setup(params, RunContext(rank, world, seed=7))
    q0 = {i: q.clone() for i, q in agg.low_rank.q.items()}
    out = {"q0": q0, "stats": [], "result": [], "phat": []}
    for it in range(ITERS):
        set_grads(params, grads_at(rank, it))
        out["stats"].append(agg.aggregate(it))
        out["result"].append(agg.bucket.clone())
        out["phat"].append({i: t.clone() for i, t in agg.low_rank.phat.items()})
    # the two rings it declares in its compressed phase (the ones it ran, and the cost model prices)
    out["segs"] = [[(s.start, s.stop) for s in r.segs] for r in agg.rings(agg.everything, world)]
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
    outs.append(sum(flat(grads_at(r, 0)) for r in range(world)) / world)    # start_iter: plain mean
    for it in range(1, ITERS):
        m = sum(flat(grads_at(r, it)) for r in range(world)) + err        # sum_w M_w = sum g + sum e
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_powersgd_compression_error_is_the_local_projection_error(powersgd_run):
    world, ranks = powersgd_run
    blocks = plan(SHAPES, 2, 2.0)
    m = flat(grads_at(0, 1))                       # rank 0's M at its first compressed iteration (e = 0)
    lost = sum(float((mb - ph @ (ph.t() @ mb)).pow(2).sum())
               for i, b in enumerate(blocks) if b.rank
               for mb, ph in [(m[b.start: b.stop].view(b.rows, b.cols), ranks[0]["phat"][1][i])])
    assert ranks[0]["stats"][1]["compression_error"] == pytest.approx(lost / float(m.pow(2).sum()),
                                                                     rel=1e-3)
    assert ranks[0]["stats"][0]["compression_error"] == 0.0


def test_compression_error_is_a_public_untimed_measurement_of_the_local_projection_error():
    """compression_error(bucket): this rank's ||M - P^ P^T M||^2 / ||M||^2 on the vector just averaged,
    the CSV column's value, read without touching the stopwatch, the wire or the state (one rank)."""
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    agg = PowerSGDAggregator(**knobs(PowerSGDSchema, rank=2, start_iter=0))
    agg.setup(params, RunContext(0, 1, seed=3))
    try:
        m = flat(grads_at(0, 0))                    # M = g: the error memory starts at zero
        agg.reset_counters()
        agg.start_iteration(0)
        bucket = agg.bucket_of(m.clone(), agg.everything, 0)          # the whole-model vector
        agg.measure(bucket)
        agg.average(bucket)
        blocks = plan(SHAPES, 2, 2.0)
        lost = sum(float((mb - ph @ (ph.t() @ mb)).pow(2).sum())
                   for i, b in enumerate(blocks) if b.rank
                   for mb, ph in [(m[b.start: b.stop].view(b.rows, b.cols), agg.low_rank.phat[i])])
        counters, error = agg.counters(), agg.feedback.memory.clone()
        got = agg.compression_error(bucket)
        assert got == pytest.approx(lost / float(m.pow(2).sum()), rel=1e-3) and 0 < got < 1
        assert got == agg.measure_after(bucket)["compression_error"]
        assert agg.counters() == counters and torch.equal(agg.feedback.memory, error)
        assert agg.compression_error(bucket) == pytest.approx(got, rel=1e-12)   # reading twice: same value
    finally:
        agg.close()


def test_prepare_benchmark_pins_the_compressed_phase_so_measurements_run():
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    agg = PowerSGDAggregator(**knobs(PowerSGDSchema, rank=2, start_iter=10))
    agg.setup(params, RunContext(0, 1))
    agg.prepare_benchmark([torch.zeros(s) for s in SHAPES])
    assert agg.compressing and agg.start_iter == 0
    bucket = agg.bucket_of(flat(grads_at(0, 0)), agg.everything, 0)
    agg.measure(bucket)
    assert agg.measure_after(bucket)["compression_error"] >= 0.0
    agg.close()


# -- error feedback --------------------------------------------------------------------------------

@pytest.mark.parametrize("make,key", [
    (lambda: PowerSGDAggregator(**knobs(PowerSGDSchema, rank=0)), "aggregator.rank"),
    (lambda: PowerSGDAggregator(**knobs(PowerSGDSchema, rank=1.5)), "aggregator.rank"),
    (lambda: PowerSGDAggregator(**knobs(PowerSGDSchema, start_iter=-1)), "aggregator.start_iter"),
    (lambda: PowerSGDAggregator(**knobs(PowerSGDSchema, min_compression_rate=0)), "aggregator.min_compression_rate"),
])
def test_bad_knobs_raise_value_error_naming_the_key(make, key):
    with pytest.raises(ValueError, match=key):
        make()



def test_powersgd_state_roundtrips_for_a_bitwise_resume():
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    a, b = (PowerSGDAggregator(**knobs(PowerSGDSchema, rank=2)) for _ in range(2))
    a.setup(params, RunContext(0, 2, seed=1))
    b.setup(params, RunContext(0, 2, seed=2))
    a.feedback.memory.normal_()
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.feedback.memory, b.feedback.memory)
    assert all(torch.equal(a.low_rank.q[i], b.low_rank.q[i]) for i in a.low_rank.q)


def test_built_directly_a_knob_of_the_wrong_type_is_refused_naming_it():
    """Built without the schema (a user's own code), PowerSGD refuses what the schema would: a warm start
    that is not a boolean."""
    good = knobs(PowerSGDSchema)
    with pytest.raises(ValueError, match="aggregator.warm_start='yes': must be true or false"):
        PowerSGDAggregator(**{**good, "warm_start": "yes"})
