"""Projection (gvq/predict/project.py) and the default query CLI: a table, a heatmap, a CSV."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gvq.predict import __main__ as cli
from gvq.predict import project


def test_default_query_prints_a_table(calibrated, capsys):
    df = cli.main(["--calibration", str(calibrated)])
    assert len(df) == 4 * 3 * 5 and set(df["bound"]) <= {"compute", "bandwidth", "latency", "codec"}
    assert (df[df["aggregator"] == "rar"]["speedup_vs_rar"] == 1).all()
    assert "predicted, virtual-time terms" in capsys.readouterr().out


def test_project_writes_heatmap_and_csv(calibrated, tmp_path):
    project.main(["--models", calibrated.name, "--calibration", str(calibrated.parent), "--max-world-size", "8",
                  "--out", str(tmp_path)])
    df = pd.read_csv(tmp_path / "projection.csv")
    cells = df.drop_duplicates(["N", "link_bps", "compute_scale"])
    assert len(cells) == 3 * len(project.LINKS) * len(project.SCALES)            # N = 2, 4, 8
    fastest = df.loc[df.groupby(["N", "link_bps", "compute_scale"])["iter_s"].idxmin()]
    assert (fastest["aggregator"] == fastest["winner"]).all() and (cells["margin"] >= 1).all()
    assert (tmp_path / "projection_cnn.png").stat().st_size > 10_000
    cross = pd.read_csv(tmp_path / "crossovers.csv")
    assert len(cross) == 3 * len(project.SCALES) and "rar_bandwidth_bound_to_bps" in cross


def test_crossing_is_interpolated_geometrically_between_links():
    r = pd.Series([3.0, 2.0, 0.5, 0.25], index=[1e6, 1e7, 1e8, 1e9])
    assert project._last_crossing(r) == pytest.approx(10 ** (7 + 1 / 1.5))
    assert np.isnan(project._last_crossing(pd.Series([2.0, 1.5], index=[1e6, 1e7])))     # pays everywhere
    assert np.isnan(project._last_crossing(pd.Series([0.5, 0.2], index=[1e6, 1e7])))     # never
