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
from gvq.report.target import Target


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
    assert main(["frontier", str(scripted), "target_acc=0.8", "--out", str(tmp_path / "out")]) == 0
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
    assert main(["frontier", str(scripted), "target_acc=0.8", "--out", str(tmp_path / "out")]) == 0
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
    assert main(["frontier", str(scripted), "target_acc=0.8", "--out", str(tmp_path / "out")]) == 0
    df = pd.read_csv(tmp_path / "out" / "frontier.csv")
    chance = df[df["MB_per_iter"].round(3) == 0.02].iloc[0]
    assert chance["all_at_chance"] and chance["at_chance"] == 3 and chance["final_acc"] == pytest.approx(0.10)
    assert not chance["frontier_acc"] and not chance["frontier_iters"]
    rows = {(r["aggregator"], round(r["MB_per_iter"], 3)): (r["frontier_acc"], r["frontier_iters"])
            for r in df.to_dict("records")}
    assert rows[("qsgd", 0.1)] == (True, True) and rows[("signsgd", 0.05)] == (True, False)   # as without it
    line = next(ln for ln in (tmp_path / "out" / "frontier.md").read_text().splitlines() if "bits=1" in ln)
    assert line.count("no: every seed at chance") == 2


# -- a language model's frontier: validation bits per byte, lower is better -----------------------------
def _lm_run(root: Path, setting: str, seed: int, mb: float, bpb: float, hit: int | None) -> None:
    """A finished LM run of ``setting``: validation every 20 iterations, its loss (nats per token) 3.0 until
    ``hit`` and 2.3 from there (never under 2.4 where ``hit`` is None), its bits per byte ``bpb`` at the end
    (0.5 above before ``hit``), as ``summary.json``'s ``final_test_bpb`` says."""
    d = root / f"{setting.replace('=', '-').replace(',', '_')}_seed{seed}"
    d.mkdir(parents=True)
    overrides = setting.split(",") + [f"seed={seed}"]
    (d / "summary.json").write_text(json.dumps({
        "status": "completed", "final_test_bpb": bpb, "job_type": overrides[0].split("=")[1], "overrides": overrides,
        "config": {"world_size": 4, "seed": seed, "aggregator": {}, "net": {"clock": "wall"}}}))
    with open(d / "metrics.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["iteration", "compute_s", "aggregate_s", "bytes_sent", "wall_s", "train_loss", "test_acc",
                    "test_loss", "test_bpb"])
        for i in range(200):
            early = hit is None or i < hit
            evals = [0.4, 3.0 if early else 2.3, bpb + (0.5 if early and i < 199 else 0)] if i % 20 == 19 else [""] * 3
            w.writerow([i, 0.01, 0.01, mb * 1e6, i * 0.02, 5.0 - i / 100, *evals])


@pytest.fixture
def lm_sweep(tmp_path):
    """Six settings x 3 seeds: (MB per iteration, final bpb per seed, iteration the loss reaches 2.4 at)."""
    root = tmp_path / "lm"
    settings = {"aggregator=rar": (3.3, (3.40, 3.41, 3.42), 99), "aggregator=fp16": (1.67, (3.40, 3.41, 3.42), 99),
                "aggregator=qsgd,aggregator.compressor.bits=4": (0.42, (3.44, 3.45, 3.46), 119),
                "aggregator=qsgd,aggregator.compressor.bits=2": (0.21, (3.80, 3.81, 3.82), None),
                "aggregator=powersgd,aggregator.rank=2": (0.1, (3.53, 3.54, 3.55), 179),
                "aggregator=signsgd": (0.05, (4.9, 5.0, 5.1), None)}
    for setting, (mb, bpbs, hit) in settings.items():
        for seed, bpb in enumerate(bpbs):
            _lm_run(root, setting, seed, mb, bpb, hit)
    return root


def test_an_lms_frontier_ranks_final_bits_per_byte_lower_being_better(lm_sweep, tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert main(["frontier", str(lm_sweep), "target_loss=2.4", "--out", str(out)]) == 0
    df = pd.read_csv(out / "frontier.csv")
    assert "final_acc" not in df and "frontier_acc" not in df
    by = {r["setting"]: r for r in df.to_dict("records")}
    assert by["rar"]["final_bpb"] == pytest.approx(3.41) and by["rar"]["final_bpb_std"] == pytest.approx(0.01)
    rows = {s: (r["frontier_bpb"], r["frontier_iters"]) for s, r in by.items()}
    assert rows["signsgd"] == (True, False)             # cheapest, the worst bpb; its loss never reached 2.4
    assert rows["powersgd"] == (True, True)      # rank 2, its default: a lower bpb than anything cheaper
    # 2-bit QSGD sends more than PowerSGD for a higher bpb: dominated (as "higher is better" it would win)
    assert rows["qsgd bits=2"] == (False, False)
    assert rows["qsgd"] == (True, True) and rows["fp16"] == (True, True)
    assert rows["rar"] == (False, False)                # fp16's bpb and iterations at half the bytes
    assert by["qsgd"]["iters_to_target"] == 120 and by["qsgd bits=2"]["reached"] == "0/3"
    text = (out / "frontier.md").read_text()
    assert text.startswith("Bits-per-byte-cost frontier") and "| final bpb" in text and "iters to loss 2.4" in text
    assert "3.4100 ± 0.0100" in text
    # the figure's axes say bpb and the loss target
    import matplotlib.pyplot as plt
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    frontier.plot_setting_frontier(df, tmp_path / "f.png", Target.loss(2.4))
    left, right = plt.gcf().axes[:2]
    assert "bits per byte" in left.get_ylabel() and right.get_ylabel() == "iterations to loss 2.4"
    plt.close("all")


def test_a_cnns_frontier_stays_on_accuracy_whatever_the_target(scripted, tmp_path):
    """Runs with no bpb (a CNN's) keep accuracy on the quality axis under --target-loss too; an LM's under
    --target-acc is ranked on accuracy, as asked."""
    assert main(["frontier", str(scripted), "target_loss=2.0", "--out", str(tmp_path / "cnn")]) == 0
    assert "frontier_acc" in pd.read_csv(tmp_path / "cnn" / "frontier.csv")
    table = pd.DataFrame({"final_bpb": [3.4, np.nan]})
    assert frontier.score_axis(table, Target.loss(2.4)) is frontier.BPB
    assert frontier.score_axis(table, 0.8) is frontier.ACC
    assert frontier.score_axis(pd.DataFrame({"final_bpb": [np.nan]}), Target.loss(2.4)) is frontier.ACC


def test_the_report_page_names_the_bpb_frontier(lm_sweep, tmp_path):
    assert main([str(lm_sweep), "target_loss=2.4", "--out", str(tmp_path / "page")]) == 0
    page = (tmp_path / "page" / "report.html").read_text()
    assert "Bits-per-byte-cost frontier" in page and "Accuracy-cost frontier" not in page
    assert "<th>final bpb</th>" in page


def test_a_mean_that_is_not_finite_is_its_own_band():
    b = frontier.band(float("nan"), 0.1)
    assert all(np.isnan(v) for v in (b.median, b.lo, b.hi))
