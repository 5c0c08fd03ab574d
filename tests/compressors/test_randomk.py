"""Random-k (gvq/compressors/randomk.py): k positions per bucket without replacement, drawn alike on every
rank from (seed, iteration, vector) and never from torch's global generator; the scaled form unbiased;
its summing ring equal to its allgather; the bytes 4k per bucket, as logged."""
from __future__ import annotations

import math
import pickle

import pytest
import torch

from gvq.aggregators.base import RunContext
from gvq.aggregators.compressed import CompressedAggregator
from gvq.aggregators.error_feedback import ErrorFeedbackAggregator
from gvq.compressors.randomk import GOLDEN, RandomK, _mix64, shared_key
from tests.helpers.dist import run_ranks

SLOW = pytest.mark.slow          # starts processes (make test-fast skips it)


def _buckets(n: int, b: int) -> list[tuple[int, int]]:
    return [(s, min(s + b, n)) for s in range(0, n, b)]


@pytest.mark.parametrize("n,bucket,ratio", [(1000, 128, 0.05), (1000, None, 0.01), (77, 16, 0.3), (5, 4096, 0.01),
                                            (300, 100, 1.0)])
def test_positions_are_k_per_bucket_without_replacement(n, bucket, ratio):
    c = RandomK(ratio=ratio, bucket=bucket)
    c.begin_vector(3, 7, 0)
    pos = c.positions(slice(0, n), "cpu")
    assert pos.unique().numel() == pos.numel() and int(pos.min()) >= 0 and int(pos.max()) < n
    for a, b in _buckets(n, bucket or n):
        inside = int(((pos >= a) & (pos < b)).sum())
        assert inside == max(1, math.floor(ratio * (b - a))), (a, b)
    assert c.payload_spec(slice(0, n)) == (torch.float32, pos.numel())
    assert c.payload_nbytes(slice(0, n)) == 4 * pos.numel()
    assert c.ratio(n) == n / pos.numel()                    # the seam's achieved ratio, not the knob


def test_positions_differ_between_iterations_vectors_and_seeds_and_repeat_for_the_same_key():
    c, whole = RandomK(ratio=0.05, bucket=256), slice(0, 4096)

    def draw(seed, it, vec):
        c.begin_vector(seed, it, vec)
        return set(c.positions(whole, "cpu").tolist())
    base = draw(0, 5, 0)
    for other in (draw(0, 6, 0), draw(0, 5, 1), draw(1, 5, 0), draw(5, 0, 0)):
        assert len(base & other) < len(base) // 2          # independent draws share ~5%
    fresh = RandomK(ratio=0.05, bucket=256)                 # a resumed run: a new codec, the same key
    fresh.begin_vector(0, 5, 0)
    assert set(fresh.positions(whole, "cpu").tolist()) == base == draw(0, 5, 0)
    restored = pickle.loads(pickle.dumps(c))
    restored.begin_vector(0, 5, 0)
    assert set(restored.positions(whole, "cpu").tolist()) == base


def test_positions_are_each_buckets_k_smallest_hashes_of_its_counters_for_every_key_in_turn():
    """The draw is a wire format (every rank, and a resumed run, must pick the same): murmur3's finaliser of
    position * GOLDEN + key, the k smallest per bucket, whatever the codec caches between keys."""
    c = RandomK(ratio=0.05, bucket=100)
    seg = slice(300, 950)
    for key in ((1, 2, 0), (1, 3, 0), (1, 2, 0)):
        c.begin_vector(*key)
        h = _mix64(torch.arange(seg.start, seg.stop, dtype=torch.int64).mul_(GOLDEN).add_(shared_key(*key)))
        want = [torch.topk(h[lo:hi], c.count(hi - lo), largest=False).indices + lo
                for lo, hi in _buckets(seg.stop - seg.start, 100)]
        assert torch.equal(c.positions(seg, "cpu").sort().values, torch.cat(want).sort().values)


def test_a_segment_of_whole_buckets_draws_what_the_whole_vector_draws():
    c = RandomK(ratio=0.1, bucket=64)
    c.begin_vector(0, 1, 0)
    whole = c.positions(slice(0, 1000), "cpu")
    part = c.positions(slice(320, 1000), "cpu") + 320
    assert set(part.tolist()) == {p for p in whole.tolist() if p >= 320}


def test_compress_copies_the_drawn_values_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before, x, seg = torch.get_rng_state(), torch.randn(999), slice(0, 999)
    c = RandomK(ratio=0.1, bucket=100)
    c.begin_vector(0, 2, 0)
    torch.set_rng_state(before)
    y = c.decompress(c.compress(x, seg), seg)
    assert torch.equal(torch.get_rng_state(), before)
    kept = y != 0
    assert torch.equal(y[kept], x[kept]) and int(kept.sum()) == c.payload_spec(seg)[1]
    everything = RandomK(ratio=1.0, bucket=100)
    assert torch.equal(everything.decompress(everything.compress(x, seg), seg), x)


def test_scaled_form_is_unbiased_and_unscaled_is_not():
    """T draws (iterations) of C(g), n/k = 4: ||mean - g|| <= 3 sqrt((n/k - 1) / T) ||g|| (its expected value
    is a third of that; fixed keys, so the test is deterministic), and E||C(g)||^2 = (n/k) ||g||^2."""
    g = torch.linspace(-1, 1, 96) ** 3 + 0.1
    seg, T, bound_factor = slice(0, 96), 2000, 3.0
    for scale in (True, False):
        c = RandomK(ratio=0.25, bucket=32, scale=scale)
        total, energy = torch.zeros(96, dtype=torch.float64), 0.0
        for it in range(T):
            c.begin_vector(0, it, 0)
            y = c.decompress(c.compress(g, seg), seg).double()
            total += y
            energy += float(y.square().sum())
        err = float((total / T - g.double()).norm())
        bound = bound_factor * math.sqrt((4 - 1) / T) * float(g.norm())
        if scale:
            assert err < bound, (err, bound)
            assert energy / T == pytest.approx(4 * float(g.square().sum()), rel=0.05)
        else:
            assert err > 4 * bound        # the mean is 3g / 4 away: far outside (the bound catches a bias)


def test_a_resumed_aggregator_draws_the_indices_the_run_would_have():
    """The key is (seed, iteration, vector): the checkpoint's iteration is all a resume needs (no stream
    in the state_dict), so a fresh aggregator at iteration t draws what the run drew at t."""
    def positions(agg, it):
        agg.bucket_of(torch.zeros(500), agg.everything, it)
        return agg.compressor.positions(slice(0, 500), "cpu")
    params = [torch.nn.Parameter(torch.zeros(500))]
    run = CompressedAggregator(RandomK(ratio=0.1, bucket=100), topology="ring", hop="auto",
                               ef_decay=1.0, ef_units="gradient")
    run.setup(params, RunContext(0, 1, seed=4))
    drawn = {it: positions(run, it) for it in range(3)}
    resumed = CompressedAggregator(RandomK(ratio=0.1, bucket=100), topology="ring", hop="auto",
                               ef_decay=1.0, ef_units="gradient")
    resumed.setup(params, RunContext(0, 1, seed=4))
    resumed.load_state_dict(run.state_dict())
    assert torch.equal(positions(resumed, 2), drawn[2]) and not torch.equal(drawn[1], drawn[2])
    run.close()
    resumed.close()


def test_each_vector_of_an_iteration_draws_its_own_positions():
    """A DDP bucket is named by its first parameter (the vectors of one iteration hold disjoint parameters),
    so two buckets of one size in one iteration draw apart; the same bucket next iteration draws anew."""
    params = [torch.nn.Parameter(torch.zeros(300)) for _ in range(4)]
    agg = CompressedAggregator(RandomK(ratio=0.05, bucket=100), topology="ring", hop="auto",
                               ef_decay=1.0, ef_units="gradient")
    agg.setup(params, RunContext(0, 1, seed=1))

    def drawn(vector, it):
        agg.bucket_of(torch.zeros(600), vector, it)
        return set(agg.compressor.positions(slice(0, 600), "cpu").tolist())
    seen = [drawn((0, 1), 3), drawn((2, 3), 3), drawn((2, 3), 4)]
    assert all(len(a & b) < len(a) // 2 for i, a in enumerate(seen) for b in seen[i + 1:])
    assert drawn((2, 3), 3) == seen[1]
    agg.close()


def test_nan_input_is_caught_at_the_check():
    c, x = RandomK(ratio=0.5, bucket=8), torch.ones(16)
    c.compress(x, slice(0, 16))
    c.check_health()
    x[3] = float("nan")
    c.compress(x, slice(0, 16))
    with pytest.raises(ValueError, match="NaN or Inf"):
        c.check_health()


def test_ratio_outside_zero_one_is_refused():
    for bad in (0, 1.5, -0.1, True):
        with pytest.raises(ValueError, match="ratio="):
            RandomK(ratio=bad)


# -- on ranks: equal positions everywhere, ring == allgather, the bytes logged --------------------------
NUMEL, BUCKET, RATIO = 1000, 64, 0.1


def _grad(rank, it):
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(100 * rank + it))


def _ranks(rank, world):
    params = [torch.nn.Parameter(torch.zeros(NUMEL))]
    out = {}
    for topology in ("ring", "allgather"):
        for cls in (CompressedAggregator, ErrorFeedbackAggregator):
            agg = cls(RandomK(ratio=RATIO, bucket=BUCKET, scale=cls is CompressedAggregator), topology=topology,
                      hop="auto", ef_decay=1.0, ef_units="gradient")
            agg.setup(params, RunContext(rank, world, seed=9))
            rows = []
            for it in range(3):
                before = torch.get_rng_state()
                params[0].grad.copy_(_grad(rank, it))
                stats = agg.aggregate(it)
                pos = agg.compressor.positions(slice(0, NUMEL), "cpu")
                sent = agg.transmitted.clone() if cls is ErrorFeedbackAggregator else None
                rows.append({"mean": params[0].grad.clone(), "bytes": stats["bytes_sent"], "sent": sent,
                             "pos": pos.sort().values, "rng_kept": torch.equal(before, torch.get_rng_state()),
                             "segs": [(s.start, s.stop) for s in agg.segments(NUMEL, world)]})
            out[(topology, cls.__name__)] = rows
            agg.close()
    return out


@pytest.fixture(scope="module", params=[2, 3, 4])
def ranks(request, tmp_path_factory):
    return request.param, run_ranks(_ranks, request.param, tmp_path_factory.mktemp("randomk"))


def _mean_of_decoded(world, it, segs, scale):
    """The mean every rank's decoded payload gives, segment by segment as the ring codes them."""
    c, total = RandomK(ratio=RATIO, bucket=BUCKET, scale=scale), torch.zeros(NUMEL, dtype=torch.float64)
    c.begin_vector(9, it, 0)
    for a, b in segs:
        for r in range(world):
            s = slice(a, b)
            total[s] += c.decompress(c.compress(_grad(r, it)[s], s), s).double()
    return total / world


@SLOW
def test_positions_are_equal_on_every_rank_and_the_global_rng_is_untouched(ranks):
    world, out = ranks
    for case in out[0]:
        for it in range(3):
            assert all(torch.equal(r[case][it]["pos"], out[0][case][it]["pos"]) for r in out), (case, it)
            assert all(r[case][it]["rng_kept"] for r in out)
        assert not torch.equal(out[0][case][0]["pos"], out[0][case][1]["pos"])


@SLOW
def test_the_summing_ring_equals_allgather_and_the_mean_of_decoded_payloads(ranks):
    world, out = ranks
    for it in range(3):
        ring, gathered = out[0][("ring", "CompressedAggregator")][it], out[0][("allgather", "CompressedAggregator")][it]
        assert torch.allclose(ring["mean"], gathered["mean"], rtol=1e-5, atol=1e-6)
        exact = _mean_of_decoded(world, it, ring["segs"], scale=True)
        assert torch.allclose(ring["mean"].double(), exact, rtol=1e-5, atol=1e-6)
        for r in out:                                    # every rank ends with the same mean
            assert torch.equal(r[("ring", "CompressedAggregator")][it]["mean"], ring["mean"])


@SLOW
def test_error_feedback_sends_what_it_kept_back_from_its_residual(ranks):
    """Error feedback's own pass and the ring draw the same positions (one key per vector): the mean is
    the mean of every rank's transmitted Q(g + e), on the ring and on allgather."""
    world, out = ranks
    for topology in ("ring", "allgather"):
        for it in range(3):
            rows = [r[(topology, "ErrorFeedbackAggregator")][it] for r in out]
            assert torch.allclose(rows[0]["mean"], sum(row["sent"] for row in rows) / world, rtol=1e-5, atol=1e-6)


@SLOW
def test_logged_bytes_are_the_wire_arithmetic(ranks):
    """4k bytes per bucket's payload; the summing ring sends N - 1 payloads of the reduce-scatter (segments
    r, r - 1, ...) and N - 1 of the allgather (r + 1, r, ...); allgather sends the whole payload N - 1 times."""
    world, out = ranks
    c = RandomK(ratio=RATIO, bucket=BUCKET)
    whole = c.payload_nbytes(slice(0, NUMEL))
    assert whole == 4 * sum(max(1, math.floor(RATIO * (b - a))) for a, b in _buckets(NUMEL, BUCKET))
    for rank, r in enumerate(out):
        for cls in ("CompressedAggregator", "ErrorFeedbackAggregator"):
            segs = [slice(a, b) for a, b in r[("ring", cls)][0]["segs"]]
            sent = sum(c.payload_nbytes(segs[(rank - j) % world]) + c.payload_nbytes(segs[(rank + 1 - j) % world])
                       for j in range(world - 1))
            assert all(row["bytes"] == sent for row in r[("ring", cls)]), (rank, cls)
            assert all(row["bytes"] == (world - 1) * whole for row in r[("allgather", cls)])
