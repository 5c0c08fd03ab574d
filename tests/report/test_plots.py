"""Figures never put two clocks on one axis (gvq/report/plots.py), and each run's clock is named."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gvq.report.plots import breakdown, curve_columns, plot_curves, time_clock
from gvq.report.runs import Group, Run, clock_of


def _run(name: str, net: dict) -> Run:
    m = pd.DataFrame({"iteration": range(4), "wall_s": [0.1, 0.2, 0.3, 0.4], "train_loss": [2, 1.5, 1, 0.8],
                      "test_acc": [None, 0.5, None, 0.8], "compute_s": 0.05, "aggregate_s": 0.05})
    return Run(Path(name), "completed", "", "rar", [f"x={name}"], {"net": net}, m)


def test_clock_names_say_which_clock_and_scales():
    assert clock_of(_run("a", {"bandwidth_bps": 5e7})) == "wall-clock"
    virt = clock_of(_run("b", {"bandwidth_bps": 5e7, "clock": "virtual", "compute_scale": 1 / 6, "codec_scale": 1}))
    assert virt == "virtual time (compute ×0.167, codec ×1)"


def test_breakdown_and_time_axis_keep_to_one_clock(tmp_path):
    wall = Group("wall run", ("a",), [_run("a", {"bandwidth_bps": 5e7})])
    virt = Group("virtual run", ("b",), [_run("b", {"bandwidth_bps": 5e7, "clock": "virtual",
                                                    "compute_scale": 0.5, "codec_scale": 1})])
    groups = [virt, wall]
    assert time_clock(groups) == virt.clock
    table = breakdown(groups, lambda g: {"compute_s": 0.05, "aggregate_s": 0.05})
    assert list(table["group"]) == ["virtual run"] and set(table["clock"]) == {virt.clock}
    assert plot_curves(groups, tmp_path / "c.png", "test").stat().st_size > 1000


def test_breakdown_shows_hidden_and_exposed_communication_of_an_overlapped_run(tmp_path):
    from gvq.report.plots import plot_breakdown
    post = Group("rar", ("a",), [_run("a", {"bandwidth_bps": 5e7})])
    over = Group("rar overlapped", ("b",), [_run("b", {"bandwidth_bps": 5e7})])
    stats = {"rar": {"compute_s": 0.5, "aggregate_s": 0.4, "compress_s": 0.0, "wire_s": 0.3, "decompress_s": 0.0},
             # the codec and wire ran during backward: 0.35 s of communication, 0.1 s of it after backward
             "rar overlapped": {"compute_s": 0.5, "aggregate_s": 0.1, "compress_s": 0.0, "wire_s": 0.3,
                                "decompress_s": 0.0, "comm_s": 0.35, "exposed_s": 0.1}}
    table = breakdown([post, over], lambda g: stats[g.label]).drop(columns="clock").set_index("group")
    stack = ["compute_s", "compress_s", "wire_s", "decompress_s", "other_s", "exposed_s"]
    # every bar stacks to the iteration time, compute_s + aggregate_s
    assert table.loc["rar", stack].sum() == pytest.approx(0.9)
    assert table.loc["rar overlapped", stack].sum() == pytest.approx(0.6)
    assert table.loc["rar", "exposed_s"] == 0 and table.loc["rar", "wire_s"] == pytest.approx(0.3)
    assert table.loc["rar", "other_s"] == pytest.approx(0.1) and table.loc["rar", "hidden_s"] == 0
    assert table.loc["rar overlapped", "wire_s"] == 0                      # not stacked: it was hidden
    assert table.loc["rar overlapped", "exposed_s"] == pytest.approx(0.1)
    assert table.loc["rar overlapped", "hidden_s"] == pytest.approx(0.25)
    png = plot_breakdown(breakdown([post, over], lambda g: stats[g.label]), tmp_path / "b.png", "test")
    assert png.stat().st_size > 1000


def _kept_figure(monkeypatch):
    """Keep the figure a plotting function closes, to read its labels back."""
    import matplotlib.pyplot as plt
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    return plt


def _overlaps(ax) -> list[tuple[str, str]]:
    """Pairs of the axis' x tick labels that overlap on the drawn canvas."""
    renderer = ax.figure.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.get_xticklabels(minor=False) +
             ax.get_xticklabels(minor=True) if t.get_text() and t.get_visible()]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


def test_the_frontiers_tick_labels_do_not_overlap_over_a_narrow_span_of_bytes(tmp_path, monkeypatch):
    """Settings from 0.002 to 0.06 MB per iteration (under two decades): matplotlib labelled every minor
    tick of the log axis (2x10^-3, 3x10^-3, ...) and they ran into each other."""
    from gvq.report.frontier import plot_setting_frontier
    plt = _kept_figure(monkeypatch)
    mb = [0.00195, 0.0021, 0.0039, 0.0077, 0.0155, 0.0307, 0.0614]
    df = pd.DataFrame({"setting": [f"s{i}" for i in range(len(mb))], "MB_per_iter": mb, "variant": "post",
                       "setting_name": [f"qsgd bits={i}" for i in range(len(mb))],
                       "final_acc": [0.8, 0.84, 0.1, 0.86, 0.87, 0.88, 0.88], "final_acc_std": 0.01,
                       "iters_to_target": [120, 100, float("inf"), 100, 80, 60, 60], "iters_to_target_std": 5.0,
                       "reached": ["2/2"] * len(mb), "ranked": True, "all_at_chance": False,
                       "frontier_acc": True, "frontier_iters": True})
    plot_setting_frontier(df, tmp_path / "f.png", 0.8)
    fig = plt.gcf()
    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert len(labels) >= 2 and _overlaps(ax) == [], labels
    plt.close("all")


def test_the_breakdowns_axis_says_per_iteration_whatever_the_runs_length(tmp_path, monkeypatch):
    """A 200-iteration sweep's bars were labelled "seconds per 500 iterations": the axis is per iteration."""
    from gvq.report.plots import plot_breakdown
    plt = _kept_figure(monkeypatch)
    run = Group("rar", ("a",), [_run("a", {"bandwidth_bps": 5e7})])
    table = breakdown([run], lambda g: {"compute_s": 0.05, "aggregate_s": 0.02, "wire_s": 0.015})
    assert table.loc[0, "compute_s"] == pytest.approx(0.05)                    # seconds per iteration
    plot_breakdown(table, tmp_path / "b.png", "test")
    ax = plt.gcf().axes[0]
    assert ax.get_ylabel().startswith("ms per iteration") and "500" not in ax.get_ylabel()
    tops = [p.get_y() + p.get_height() for p in ax.patches]
    assert max(tops) == pytest.approx(70.0)                                    # 0.05 + 0.02 s, in ms
    plt.close("all")


def test_an_lms_curves_add_validation_bits_per_byte_with_seed_bands(tmp_path, monkeypatch):
    """Runs that logged ``test_bpb`` (a language model's) get a third row: validation bpb against iteration
    and the clock, mean ± std over seeds; a CNN's curves keep two rows."""
    plt = _kept_figure(monkeypatch)
    cnn = Group("rar", ("a",), [_run("a", {})])
    assert curve_columns([cnn]) == ["test_acc", "train_loss"]
    seeds = []
    for seed, bpb in enumerate((3.4, 3.6)):
        r = _run(f"lm{seed}", {})
        r.metrics["test_bpb"] = [None, bpb + 0.5, None, bpb]
        seeds.append(r)
    lm = Group("rar", ("b",), seeds)
    assert curve_columns([lm]) == ["test_acc", "train_loss", "test_bpb"]
    plot_curves([lm], tmp_path / "c.png", "test")
    axes = plt.gcf().axes
    assert len(axes) == 6 and axes[4].get_ylabel().startswith("validation bits per byte")
    assert axes[4].get_xlabel() == "iteration"
    line = axes[4].get_lines()[0]
    assert list(line.get_xdata()) == [1, 3] and list(line.get_ydata()) == pytest.approx([4.0, 3.5])   # the mean
    band = axes[4].collections[0].get_paths()[0].vertices[:, 1]                                     # ± std
    assert band.min() == pytest.approx(3.5 - np.std([3.4, 3.6], ddof=1))
    plt.close("all")
