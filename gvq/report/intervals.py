"""Each measured figure with its interval, and a winner named only where the intervals say so.

A bench figure is the median of its timed iterations; its interval is a percentile bootstrap interval of
that median (``scipy.stats.bootstrap``, seeded, so the same iterations always print the same interval).
Candidates are compared by their intervals: one wins only when its interval lies wholly below every
other's; otherwise every candidate whose interval reaches the best's is tied with it.  A figure from a
single iteration has no interval (``lo``/``hi`` None), and is tied with everything it is compared with.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 9999     # more => an interval steadier against the seed, slower
SEED = 0             # fixed: a table re-printed from the same iterations shows the same intervals
#: seeds a setting needs to be ranked at all (the frontier, time to the target): with fewer it has no seed
#: band, so a lucky seed's figure would win over settings measured with their spread (a one-seed screen
#: row is shown, marked, never ranked); more => fewer settings ranked, each on firmer ground
MIN_SEEDS = 2
UNRANKED = f"unranked (< {MIN_SEEDS} seeds)"      # how every table and figure marks such a setting


@dataclass(frozen=True)
class Interval:
    """A median and its bootstrap interval (None at either end: no interval, a single iteration)."""
    median: float
    lo: float | None
    hi: float | None

    @property
    def bounded(self) -> bool:
        return self.lo is not None and self.hi is not None

    def overlaps(self, other: Interval) -> bool:
        """True unless one interval lies wholly below the other (an unbounded one overlaps all)."""
        if not (self.bounded and other.bounded):
            return True
        return self.lo <= other.hi and other.lo <= self.hi

    def text(self, fmt: str = ".4g") -> str:
        """``[lo, hi]`` for a table cell; ``n/a`` without an interval."""
        return f"[{self.lo:{fmt}}, {self.hi:{fmt}}]" if self.bounded else "n/a"


def median_interval(values, confidence: float = CONFIDENCE, seed: int = SEED,
                    resamples: int = RESAMPLES) -> Interval:
    """The median of ``values`` and the ``confidence`` percentile bootstrap interval of the median.

    Percentile, not BCa: BCa's jackknife of a median over a dozen iterations is itself unstable, and it
    refuses (NaN) identical values, which a scripted or idle mode produces."""
    from scipy.stats import bootstrap
    data = np.asarray(values, dtype=float)
    median = float(np.median(data))
    if data.size < 2:
        return Interval(median, None, None)
    ci = bootstrap((data,), np.median, n_resamples=resamples, confidence_level=confidence,
                   method="percentile", random_state=np.random.default_rng(seed)).confidence_interval
    return Interval(median, float(ci.low), float(ci.high))


def tied_with_best(candidates: dict[str, Interval]) -> list[str]:
    """The best candidate (lowest median) first, then every other whose interval overlaps the best's,
    by median: one name is a winner (its interval wholly below every other's), several a tie."""
    ranked = sorted(candidates, key=lambda k: candidates[k].median)
    best = candidates[ranked[0]]
    return [ranked[0]] + [k for k in ranked[1:] if candidates[k].overlaps(best)]


def ratio_range(num: Interval, den: Interval) -> Interval:
    """``num / den`` at the medians, from the least to the most their intervals allow (conservative: the
    two intervals' ends taken together, not a bootstrap of the ratio)."""
    mid = num.median / den.median
    if not (num.bounded and den.bounded) or den.lo <= 0:
        return Interval(mid, None, None)
    return Interval(mid, num.lo / den.hi, num.hi / den.lo)


def best_of(candidates: dict[str, Interval], reference: str | None = None) -> dict:
    """The one comparison every table makes (the overlap bench's cells per iteration, the report's
    time to accuracy over seeds): ``best`` (lowest median), ``tied`` (:func:`tied_with_best`),
    ``winner`` (the best, or ``tie: ...``), and ``reference``'s figure over the best's (``gain``: how
    many times faster the best is) with the range the two intervals allow and whether they overlap
    (``gain_within_noise``); the gain keys are None without that reference."""
    tied = tied_with_best(candidates)
    best = candidates[tied[0]]
    out = {"best": tied[0], "tied": tied, "winner": tied[0] if len(tied) == 1 else "tie: " + ", ".join(tied),
           "gain": None, "gain_lo": None, "gain_hi": None, "gain_within_noise": None}
    ref = candidates.get(reference) if reference is not None else None
    if ref is not None and best.median > 0:
        g = ratio_range(ref, best)
        out.update(gain=g.median, gain_lo=g.lo, gain_hi=g.hi, gain_within_noise=ref.overlaps(best))
    return out
