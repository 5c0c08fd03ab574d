"""Figures never put two clocks on one axis (gvq/report/plots.py), and each run's clock is named."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from gvq.report.plots import breakdown, plot_curves, time_clock
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
    from gvq.report.plots import PER, plot_breakdown
    post = Group("rar", ("a",), [_run("a", {"bandwidth_bps": 5e7})])
    over = Group("rar overlapped", ("b",), [_run("b", {"bandwidth_bps": 5e7})])
    stats = {"rar": {"compute_s": 0.5, "aggregate_s": 0.4, "compress_s": 0.0, "wire_s": 0.3, "decompress_s": 0.0},
             # the codec and wire ran during backward: 0.35 s of communication, 0.1 s of it after backward
             "rar overlapped": {"compute_s": 0.5, "aggregate_s": 0.1, "compress_s": 0.0, "wire_s": 0.3,
                                "decompress_s": 0.0, "comm_s": 0.35, "exposed_s": 0.1}}
    table = breakdown([post, over], lambda g: stats[g.label]).drop(columns="clock").set_index("group") / PER
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
