"""The one balanced splitter (gvq/compressors/_segments.py) gives exactly the segments its four former
implementations gave (the expected slices below are theirs: equal_segments, split_on_cuts, GradiVeQ's
payload split, PowerSGD's block split), and tiles its range on allowed cuts."""
from __future__ import annotations

import random

import pytest

from gvq.compressors._segments import balanced_segments


def bounds(segs):
    return [(s.start, s.stop) for s in segs]


@pytest.mark.parametrize("cuts, n, at, expected", [
    # equal_segments(numel, n): lengths differ by at most one, the longer first
    (10, 4, None, [(0, 3), (3, 6), (6, 8), (8, 10)]),
    (3, 5, None, [(0, 1), (1, 2), (2, 3), (3, 3), (3, 3)]),
    # split_on_cuts: the nearest cut, the lower on a tie, never backwards
    ([0, 10], 3, None, [(0, 0), (0, 10), (10, 10)]),
    (list(range(11)), 4, None, [(0, 2), (2, 5), (5, 7), (7, 10)]),
    ([0, 2048, 4096, 6144, 7000], 3, None, [(0, 2048), (2048, 4096), (4096, 7000)]),
    ([0, 3, 4, 9, 10], 2, None, [(0, 4), (4, 10)]),
    # GradiVeQ's payload split: ``at`` the payload before each cut
    ([0, 4, 6, 8, 12], 3, [0.0, 1.0, 1.5, 2.0, 6.0], [(0, 8), (8, 8), (8, 12)]),
    # PowerSGD's block split: cuts on block ends, ``at`` the summed payload lengths before them
    ([0, 10, 14, 30, 31], 3, [0, 5, 6, 14, 16], [(0, 10), (10, 30), (30, 31)]),
])
def test_the_former_splitters_segments(cuts, n, at, expected):
    assert bounds(balanced_segments(cuts, n, at)) == expected


def test_segments_tile_the_range_on_cuts_and_balance_weight():
    rng = random.Random(0)
    for _ in range(500):
        numel, n = rng.randint(1, 400), rng.randint(1, 9)
        cuts = sorted({0, numel} | set(rng.sample(range(numel + 1), rng.randint(0, min(numel, 40)))))
        segs = balanced_segments(cuts, n)
        assert len(segs) == n and segs[0].start == 0 and segs[-1].stop == numel
        assert all(a.stop == b.start for a, b in zip(segs[:-1], segs[1:]))
        assert all(s.start in cuts and s.start <= s.stop for s in segs)
        gap = max(b - a for a, b in zip(cuts[:-1], cuts[1:]))
        assert max(s.stop - s.start for s in segs) <= numel / n + 2 * gap   # within a unit each side
        sizes = [s.stop - s.start for s in balanced_segments(numel, n)]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
