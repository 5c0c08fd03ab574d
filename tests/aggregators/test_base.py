"""The aggregator contract and its shared helpers (gvq/aggregators/base.py)."""
from __future__ import annotations

import math
import pickle
import re
from pathlib import Path

import pytest
import torch

from gvq.aggregators.base import Aggregator, Bucket, RunContext, check_int, equal_segments
from gvq.aggregators.rar import RingAllReduce
from gvq.compressors.base import Compressor
from gvq.aggregators.gradiveq import GradiVeQAggregator
from gvq.aggregators.powersgd import PowerSGDAggregator
from gvq.compressors.gradiveq.codec import GradiVeQ
from gvq.compressors.qsgd import QSGD
from gvq.hooks.builder import aggregator_from
from gvq.schema.options import DDPSchema, GradiVeQAggregatorSchema, PowerSGDSchema, knobs

ONE_FORMAT = re.compile(r"^[A-Za-z_.]+=\S+: must be an integer (>= -?\d+|in \[-?\d+, \d+\])")


@pytest.mark.parametrize("numel,n", [(10, 3), (3, 4), (0, 2), (470_004, 6), (7, 7)])
def test_equal_segments_tile_the_vector_and_differ_by_at_most_one(numel, n):
    segs = equal_segments(numel, n)
    assert len(segs) == n and segs[0].start == 0 and segs[-1].stop == numel
    assert all(a.stop == b.start for a, b in zip(segs, segs[1:]))
    sizes = [s.stop - s.start for s in segs]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)   # empty ones last


@pytest.mark.parametrize("make,key", [
    (lambda: GradiVeQAggregator(GradiVeQ(), **knobs(GradiVeQAggregatorSchema, L_t=1)), "L_t"),
    (lambda: GradiVeQAggregator(GradiVeQ(), **knobs(GradiVeQAggregatorSchema, pieces=0)), "aggregator.pieces"),
    (lambda: PowerSGDAggregator(**knobs(PowerSGDSchema, rank=1.5)), "aggregator.rank"),
    (lambda: QSGD(bits=17), "bits"),
    (lambda: check_int("warmup", True, 0), "warmup"),          # a bool is not an integer here
])
def test_integer_arguments_fail_in_one_format_naming_the_key(make, key):
    with pytest.raises(ValueError) as e:
        make()
    msg = str(e.value)
    assert msg.startswith(f"{key}=") and ONE_FORMAT.match(msg), msg


def test_check_int_returns_the_value_within_range():
    assert check_int("K", 5, 1) == 5 and check_int("bits", 4, 2, 16) == 4


def test_the_base_class_declares_every_part_with_its_default():
    """What the runner, benchmarks and tools call on an aggregator exists on the base class with the
    default a featureless aggregator needs; only setup and aggregate must be written."""
    agg = Aggregator()
    model = torch.nn.Linear(2, 2)
    assert agg.wrap(model) is model and agg.inside_backward is False and agg.virtual_time is False
    assert agg.bucket is None and agg.compressor is None and agg.max_abs == math.inf
    assert agg.summary() == {} and agg.state_dict() == {} and agg.benchmark_warmup() == 0
    bucket = Bucket(torch.zeros(3), (0,), 0, {})
    assert agg.measure(bucket) == {} and agg.measure_after(bucket) == {} and agg.rings((0,), 2) is None
    assert agg.preflight([]) is None and agg.prepare_benchmark([], None) is None and agg.close() is None
    assert agg.load_state_dict({}) is None
    with agg.codec_session(torch.zeros(3)):
        pass
    for call in (lambda: agg.setup([], RunContext(0, 1)), lambda: agg.aggregate(0)):
        with pytest.raises(NotImplementedError):
            call()


AGGREGATOR_OPTIONS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "aggregator")
                            .glob("*.yaml"))


@pytest.mark.parametrize("option", AGGREGATOR_OPTIONS)
def test_every_aggregator_option_is_an_aggregator_with_sane_runner_facing_parts(compose_cfg, option):
    """Every conf/aggregator option, bound to a one-rank run: the parts gvq/run, gvq/bench and
    gvq/predict call are there with values of the declared kinds."""
    agg = aggregator_from(compose_cfg(f"aggregator={option}").aggregator)     # as the runner builds it
    assert isinstance(agg, Aggregator), f"{option}: {type(agg).__name__} does not inherit Aggregator"
    assert isinstance(agg.name, str) and agg.name and isinstance(agg.extra_fields, tuple)
    assert isinstance(agg.inside_backward, bool) and isinstance(agg.virtual_time, bool)
    assert agg.inside_backward == (agg.virtual_time is False) == option.startswith("ddp")
    assert agg.compressor is None or isinstance(agg.compressor, Compressor)
    assert agg.max_abs > 0 and isinstance(agg.benchmark_warmup(), int) and agg.benchmark_warmup() >= 0
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 36, 3))
    agg.preflight(list(model.parameters()))
    if agg.inside_backward:                   # torch DDP: wrapping needs a process group
        return
    agg.setup(list(model.parameters()), RunContext(0, 1))
    try:
        assert agg.wrap(model) is model
        assert agg.bucket is not None and agg.bucket.numel() == sum(p.numel() for p in model.parameters())
        assert isinstance(agg.summary(), dict) and isinstance(agg.state_dict(), dict)
        assert isinstance(agg.any_bucket, bool)
    finally:
        agg.close()


def test_average_bucket_averages_a_vector_of_any_parameters_in_place():
    """The per-bucket entry point (what a DDP comm hook calls): one rank's mean is the tensor itself;
    counters hold the iteration's bytes and codec times until reset."""
    agg = RingAllReduce(topology="ring")
    params = [torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(2))]
    agg.bind(params, RunContext(0, 1))
    try:
        bucket = torch.arange(2.0)
        agg.reset_counters()
        stats = agg.average_bucket_(bucket, [1], 0)
        assert torch.equal(bucket, torch.arange(2.0)) and stats["aggregate_s"] >= 0
        assert set(agg.counters()) == {"compress_s", "decompress_s", "wire_s", "stage_s", "bytes_sent",
                                      "bytes_received", "bytes_inter"}
        assert agg.any_bucket is True
    finally:
        agg.close()


def test_post_backward_aggregation_runs_the_iteration_frame_the_hook_runs():
    """aggregate = begin_iteration, one average_bucket_ of every parameter, end_iteration (whose columns and
    counters it returns): the frame gvq.hooks.state runs DDP's buckets in."""
    calls = []

    class Recording(RingAllReduce):
        def begin_iteration(self, iteration):
            calls.append(("begin", iteration))
            super().begin_iteration(iteration)

        def average_bucket_(self, flat, params, iteration):
            calls.append(("bucket", tuple(params)))
            return super().average_bucket_(flat, params, iteration)

        def end_iteration(self, iteration):
            calls.append(("end", iteration))
            return {**super().end_iteration(iteration), "framed": 1.0}

    agg = Recording(topology="ring")
    agg.setup([torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(2))], RunContext(0, 1))
    try:
        for p in agg.params:
            p.grad.fill_(2.0)
        stats = agg.aggregate(3)
        assert calls == [("begin", 3), ("bucket", (0, 1)), ("end", 3)]
        assert stats["framed"] == 1.0 and set(agg.counters()) <= set(stats) and stats["aggregate_s"] >= 0
        assert all(bool((p.grad == 2.0).all()) for p in agg.params)       # one rank: the mean is its own
    finally:
        agg.close()


def test_a_set_up_aggregator_pickles_without_its_transport():
    """Sockets and threads stay with the process that opened them: unpickled, ``p2p`` is None (a hook
    state opens a new one on first use), the original keeps its own, and the state travels whole."""
    agg = GradiVeQAggregator(GradiVeQ(), **knobs(GradiVeQAggregatorSchema, L_t=2))
    agg.setup([torch.nn.Parameter(torch.zeros(4, 2, 3, 3)), torch.nn.Parameter(torch.zeros(4))], RunContext(0, 1))
    try:
        copy = pickle.loads(pickle.dumps(agg))
        assert copy.p2p is None and agg.p2p is not None
        want, got = agg.state_dict(), copy.state_dict()
        assert got["compressor"]["shapes"] == want["compressor"]["shapes"] and got["phase"] == want["phase"]
        copy.close()                                   # nothing held: nothing to release
    finally:
        agg.close()


@pytest.mark.parametrize("bad", [0, -1.5, True, "big"])
def test_bucket_cap_is_checked_in_one_place_for_torch_ddp_and_the_gvq_hook(bad):
    from gvq.aggregators.ddp import DDPAggregator
    from gvq.hooks.overlapped import Overlapped
    lines = []
    for build in (lambda: DDPAggregator(**knobs(DDPSchema, bucket_cap_mb=bad)),
                  lambda: Overlapped(RingAllReduce(topology="ring"), bad)):
        with pytest.raises(ValueError) as e:
            build()
        lines.append(str(e.value))
    assert lines[0] == lines[1] == f"aggregator.bucket_cap_mb={bad!r}: must be > 0 (or unset)"
    assert Overlapped(RingAllReduce(topology="ring"), 2).bucket_cap_mb == 2.0
    assert DDPAggregator(**knobs(DDPSchema)).bucket_cap_mb is None
