"""gvq/report/stats.py: a run's means come from the column registry, so a newly declared column is in
the report without a second list."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gvq.report.runs import Run
from gvq.report.stats import run_stats
from gvq.schema import columns


def _run(metrics: pd.DataFrame) -> Run:
    return Run(Path("."), "completed", "", "qsgd", [], {}, metrics)


def test_every_declared_amount_is_averaged_and_clock_readings_are_not():
    rng = np.random.default_rng(0)
    # iter_s is the training bench's whole step; a run's iteration is compute_s + aggregate_s (below)
    logged = [c.name for c in columns.COLUMNS if c.unit in ("s", "B") and c.name != "iter_s"]
    m = pd.DataFrame({k: rng.random(5) for k in logged})
    m["test_acc"] = np.nan
    out = run_stats(_run(m), target=0.5)
    for name in set(columns.AMOUNTS) - {"iter_s"}:
        assert out[name] == pytest.approx(m[name].mean()), name
    assert "wall_s" not in out and "real_wall_s" not in out     # readings at a step's end, not amounts
    assert {"straggle_s", "last_bucket_s", "bytes_sent"} <= set(columns.AMOUNTS)
    assert out["iter_s"] == pytest.approx((m["compute_s"] + m["aggregate_s"]).mean())
