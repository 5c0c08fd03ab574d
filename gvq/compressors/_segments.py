"""The one balanced splitter: ``[start, stop)`` into ``n`` contiguous segments ending on allowed cuts, of
about equal weight.  Every caller is a thin wrapper: the ring's plain segments
(``aggregators.base.equal_segments``), a codec's segments on whole compression units
(``compressors.base.split_on_cuts``), GradiVeQ's payload-balanced segments and pieces
(``compressors.gradiveq.segments``), PowerSGD's whole-block passes (``compressors.powersgd``).
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence


def balanced_segments(cuts: Sequence[int] | int, n: int, at: Sequence[float] | None = None) -> list[slice]:
    """``n`` slices tiling ``[cuts[0], cuts[-1]]``, every boundary on ``cuts`` (sorted), as equal in
    weight as the cuts allow; slices may be empty (fewer units than pieces).

    ``at[k]``: the cumulative weight before ``cuts[k]`` (non-decreasing; default the offsets themselves,
    weight = length).  Boundary i is the cut whose weight is nearest i/n of the total (the lower one on
    a tie), never before boundary i-1.

    ``cuts`` an int ``numel``: every offset of ``[0, numel]`` is allowed and the lengths differ by at
    most one, the first ``numel % n`` one longer (the exact shares, where the nearest-cut rule would
    spread the longer ones)."""
    if isinstance(cuts, int):
        base, extra = divmod(cuts, n)
        bounds = [i * base + min(i, extra) for i in range(n + 1)]
    else:
        at = cuts if at is None else at
        bounds = [cuts[0]]
        for i in range(1, n):
            bounds.append(max(bounds[-1], cuts[_nearest(at, at[0] + (at[-1] - at[0]) * i / n)]))
        bounds.append(cuts[-1])
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def _nearest(at: Sequence[float], target: float) -> int:
    """Index of the entry of sorted ``at`` nearest ``target``, the lower one on a tie."""
    j = bisect.bisect_left(at, target)
    return min(range(max(0, j - 1), min(j, len(at) - 1) + 1), key=lambda k: abs(at[k] - target))
