"""gvq/report/intervals.py: the bootstrap interval of a median, and a winner only where intervals separate."""
from __future__ import annotations

import pytest

from gvq.report.intervals import Interval, median_interval, ratio_range, tied_with_best

SECONDS = [0.51, 0.49, 0.50, 0.53, 0.48, 0.52, 0.50, 0.61, 0.47, 0.50, 0.51, 0.49]   # scripted, one outlier


def test_the_interval_contains_the_median_and_is_reproducible_with_the_seed():
    ci = median_interval(SECONDS)
    assert ci.median == pytest.approx(0.50)
    assert min(SECONDS) <= ci.lo <= ci.median <= ci.hi <= max(SECONDS) and ci.lo < ci.hi
    assert median_interval(SECONDS) == ci                              # same iterations, same interval
    assert median_interval(SECONDS, seed=1).median == ci.median


def test_a_higher_confidence_gives_a_wider_interval():
    narrow, wide = median_interval(SECONDS, confidence=0.5), median_interval(SECONDS, confidence=0.99)
    assert wide.lo <= narrow.lo and narrow.hi <= wide.hi


def test_one_iteration_has_no_interval_and_identical_ones_a_point():
    one = median_interval([0.7])
    assert one == Interval(0.7, None, None) and not one.bounded and one.text() == "n/a"
    assert median_interval([0.7] * 5) == Interval(0.7, 0.7, 0.7)


def test_separated_intervals_name_a_winner():
    cands = {"qsgd": Interval(1.0, 0.95, 1.05), "fp16": Interval(1.2, 1.1, 1.3), "rar": Interval(2.0, 1.9, 2.1)}
    assert tied_with_best(cands) == ["qsgd"]


def test_overlapping_intervals_are_a_tie_listing_exactly_those_that_reach_the_best():
    """c overlaps b, which overlaps the best, but not the best itself: it is not tied."""
    cands = {"c": Interval(1.35, 1.25, 1.45), "a": Interval(1.0, 0.9, 1.1), "b": Interval(1.15, 1.05, 1.3),
             "d": Interval(1.02, 0.98, 1.2)}
    assert tied_with_best(cands) == ["a", "d", "b"]                     # best first, then by median
    touching = {"a": Interval(1.0, 0.9, 1.1), "b": Interval(1.2, 1.1, 1.3)}
    assert tied_with_best(touching) == ["a", "b"]                       # ends that meet: not separated


def test_a_mode_without_an_interval_ties_with_the_best():
    cands = {"a": Interval(1.0, 0.99, 1.01), "b": Interval(5.0, None, None)}
    assert tied_with_best(cands) == ["a", "b"]


def test_the_ratio_spans_what_the_two_intervals_allow():
    r = ratio_range(Interval(2.0, 1.8, 2.4), Interval(1.0, 0.9, 1.2))
    assert r.median == 2.0 and r.lo == pytest.approx(1.8 / 1.2) and r.hi == pytest.approx(2.4 / 0.9)
    assert not ratio_range(Interval(2.0, 1.8, 2.4), Interval(1.0, None, None)).bounded
    assert r.text(".3g") == "[1.5, 2.67]"
