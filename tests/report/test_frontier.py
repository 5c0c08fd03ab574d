"""gvq/report/frontier.py and ``python -m gvq.report --frontier`` on scripted runs: dominance beyond the
seed bands, a setting that never reached the target, one with a collapsed seed."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gvq.report import frontier
from gvq.report.__main__ import main
from gvq.report.intervals import Interval


def _run(root: Path, setting: str, seed: int, mb: float, accs: dict[int, float], status="completed") -> None:
    """A finished run of ``setting`` (its overrides) sending ``mb`` MB an iteration, test accuracy at the
    iterations in ``accs`` (evaluated every 20)."""
    d = root / f"{setting.replace('=', '-').replace(',', '_')}_seed{seed}"
    d.mkdir(parents=True)
    overrides = setting.split(",") + [f"seed={seed}"]
    agg = overrides[0].split("=")[1]
    (d / "summary.json").write_text(json.dumps({
        "status": status, "reason": "train loss back at chance" if status == "collapsed" else "",
        "config": {"world_size": 4, "seed": seed, "aggregator": {}, "net": {"clock": "wall"}},
        "job_type": agg, "overrides": overrides}))
    with open(d / "metrics.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["iteration", "phase", "compute_s", "aggregate_s", "bytes_sent", "wall_s", "test_acc"])
        for i in range(200):
            w.writerow([i, agg, 0.01, 0.01, mb * 1e6, i * 0.02, accs.get(i, "")])


def _accs(final: float, hit: int | None) -> dict[int, float]:
    """Evaluations every 20 iterations: 0.5 until ``hit`` (first >= 0.8), then ``final``."""
    return {i: (final if hit is not None and i >= hit else min(final, 0.5)) for i in range(19, 200, 20)}


@pytest.fixture
def scripted(tmp_path):
    root = tmp_path / "sweep"
    for seed, (cheap, mid, best, flaky, never) in enumerate(zip(
            [(0.80, 99), (0.82, 119), (0.81, 99)], [(0.81, 119), (0.80, 99), (0.82, 119)],
            [(0.88, 59), (0.89, 59), (0.885, 79)], [(0.82, 99), (0.81, 99), (0.10, None)],
            [(0.50, None), (0.55, None), (0.52, None)])):
        _run(root, "aggregator=qsgd,aggregator.compressor.bits=2", seed, 0.1, _accs(*cheap))
        _run(root, "aggregator=qsgd,aggregator.compressor.bits=4", seed, 0.2, _accs(*mid))
        _run(root, "aggregator=rar", seed, 1.0, _accs(*best))
        _run(root, "aggregator=signsgd", seed, 0.05, _accs(*flaky), status="collapsed" if seed == 2 else "completed")
        _run(root, "aggregator=terngrad", seed, 0.3, _accs(*never))
    return root


def test_the_frontier_keeps_what_no_cheaper_setting_matches_beyond_the_seed_spread(scripted, tmp_path):
    assert main([str(scripted), "--frontier", "--target-acc", "0.8", "--out", str(tmp_path / "out")]) == 0
    df = pd.read_csv(tmp_path / "out" / "frontier.csv")
    by = {(r["aggregator"], round(r["MB_per_iter"], 3)): r for r in df.to_dict("records")}
    rows = {k: (r["frontier_acc"], r["frontier_iters"]) for k, r in by.items()}
    assert len(df) == 5 and list(df["MB_per_iter"]) == sorted(df["MB_per_iter"])
    assert rows[("qsgd", 0.1)] == (True, True)                  # 2-bit: nothing cheaper reaches it
    # 4-bit QSGD costs twice 2-bit's and its bands overlap 2-bit's: dominated on both axes
    assert rows[("qsgd", 0.2)] == (False, False)
    assert rows[("rar", 1.0)] == (True, True)                   # dearest, but wholly better on both
    assert rows[("terngrad", 0.3)] == (False, False)            # never reached, and cheaper ones do better
    flaky = by[("signsgd", 0.05)]                               # a collapsed seed stays in its band
    assert flaky["at_chance"] == 1 and flaky["reached"] == "2/3" and flaky["final_acc"] == pytest.approx(
        np.mean([0.82, 0.81, 0.10]))
    assert flaky["frontier_acc"] and not flaky["frontier_iters"]   # cheapest; but a seed never reached 0.8
    text = (tmp_path / "out" / "frontier.md").read_text()
    assert "never (0/3)" in text and (tmp_path / "out" / "frontier.png").stat().st_size > 0


def test_dominance_needs_a_difference_beyond_both_bands():
    acc = [Interval(0.80, 0.79, 0.81), Interval(0.805, 0.795, 0.815), Interval(0.85, 0.84, 0.86)]
    assert frontier.dominated([1.0, 2.0, 3.0], acc, higher=True) == [False, True, False]
    # equal cost: only a band wholly better dominates
    assert frontier.dominated([1.0, 1.0], [Interval(0.8, 0.79, 0.81), Interval(0.9, 0.89, 0.91)], True) == [True, False]
    # one seed (no band): nothing is wholly better at equal cost; a cheaper one as good dominates it
    one_seed = [Interval(0.8, None, None), Interval(0.9, 0.89, 0.91)]
    assert frontier.dominated([1.0, 1.0], one_seed, True) == [False, False]
    assert frontier.dominated([2.0, 1.0], one_seed, True) == [True, False]
    # a cheap setting with a wide band (a collapsed seed) does not dominate a dearer one with a better mean
    wide = [Interval(0.58, 0.17, 0.98), Interval(0.81, 0.80, 0.82)]
    assert frontier.dominated([1.0, 2.0], wide, True) == [False, False]
    never = Interval(np.inf, np.inf, np.inf)
    assert frontier.dominated([1.0, 2.0], [Interval(100, 90, 110), never], higher=False) == [False, True]


def test_a_one_seed_screen_is_shown_but_neither_ranked_nor_ranks_others(scripted, tmp_path):
    """A setting run at one seed has no band: its lucky mean (cheapest, best) would push every banded
    setting off the frontier, and its own place on it would be a guess. It is listed, marked unranked,
    and the frontier of the banded settings is as without it."""
    _run(scripted, "aggregator=qsgd,aggregator.compressor.bits=1", 0, 0.04, _accs(0.95, 39))
    assert main([str(scripted), "--frontier", "--target-acc", "0.8", "--out", str(tmp_path / "out")]) == 0
    df = pd.read_csv(tmp_path / "out" / "frontier.csv")
    screen = df[df["MB_per_iter"].round(3) == 0.04].iloc[0]
    assert screen["seeds"] == 1 and not screen["ranked"]
    assert not screen["frontier_acc"] and not screen["frontier_iters"]
    banded = df[df["ranked"]]
    rows = {(r["aggregator"], round(r["MB_per_iter"], 3)): (r["frontier_acc"], r["frontier_iters"])
            for r in banded.to_dict("records")}
    assert rows[("qsgd", 0.1)] == (True, True) and rows[("rar", 1.0)] == (True, True)   # as without the screen
    assert rows[("signsgd", 0.05)] == (True, False)
    text = (tmp_path / "out" / "frontier.md").read_text()
    assert "unranked" in text and f"fewer than {frontier.MIN_SEEDS} seeds" in text


def test_a_setting_every_seed_of_which_ended_at_chance_is_never_on_the_frontier(scripted, tmp_path):
    """2-bit QSGD at chance (0.100 ± 0, both seeds collapsed) is the cheapest setting: nothing cheaper
    matches it, yet it learned nothing, so it is no trade-off; the frontier of the rest is as without it."""
    for seed in (0, 1, 2):
        _run(scripted, "aggregator=qsgd,aggregator.compressor.bits=1", seed, 0.02, _accs(0.10, None),
             status="collapsed")
    assert main([str(scripted), "--frontier", "--target-acc", "0.8", "--out", str(tmp_path / "out")]) == 0
    df = pd.read_csv(tmp_path / "out" / "frontier.csv")
    chance = df[df["MB_per_iter"].round(3) == 0.02].iloc[0]
    assert chance["all_at_chance"] and chance["at_chance"] == 3 and chance["final_acc"] == pytest.approx(0.10)
    assert not chance["frontier_acc"] and not chance["frontier_iters"]
    rows = {(r["aggregator"], round(r["MB_per_iter"], 3)): (r["frontier_acc"], r["frontier_iters"])
            for r in df.to_dict("records")}
    assert rows[("qsgd", 0.1)] == (True, True) and rows[("signsgd", 0.05)] == (True, False)   # as without it
    line = next(ln for ln in (tmp_path / "out" / "frontier.md").read_text().splitlines() if "bits=1" in ln)
    assert line.count("no: every seed at chance") == 2
