"""The aggregator contract and its shared helpers (gvq/aggregators/base.py)."""
from __future__ import annotations

import re

import pytest

from gvq.aggregators.base import Aggregator, check_int, equal_segments
from gvq.aggregators.gradiveq import GradiVeQAggregator
from gvq.aggregators.powersgd import PowerSGDAggregator
from gvq.compressors.gradiveq.codec import GradiVeQ
from gvq.compressors.qsgd import QSGD

ONE_FORMAT = re.compile(r"^[A-Za-z_.]+=\S+: must be an integer (>= -?\d+|in \[-?\d+, \d+\])")


@pytest.mark.parametrize("numel,n", [(10, 3), (3, 4), (0, 2), (470_004, 6), (7, 7)])
def test_equal_segments_tile_the_vector_and_differ_by_at_most_one(numel, n):
    segs = equal_segments(numel, n)
    assert len(segs) == n and segs[0].start == 0 and segs[-1].stop == numel
    assert all(a.stop == b.start for a, b in zip(segs, segs[1:]))
    sizes = [s.stop - s.start for s in segs]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)   # empty ones last


@pytest.mark.parametrize("make,key", [
    (lambda: GradiVeQAggregator(GradiVeQ(), L_t=1), "L_t"),
    (lambda: GradiVeQAggregator(GradiVeQ(), pieces=0), "aggregator.pieces"),
    (lambda: PowerSGDAggregator(rank=1.5), "aggregator.rank"),
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


def test_the_protocol_rejects_an_object_missing_part_of_the_contract():
    class NoClose:
        name, extra_fields = "x", ()

        def setup(self, params, ctx): ...
        def aggregate(self, iteration): return {}
        def state_dict(self): return {}
        def load_state_dict(self, state): ...

    assert not isinstance(NoClose(), Aggregator)
    NoClose.close = lambda self: None
    assert isinstance(NoClose(), Aggregator)
