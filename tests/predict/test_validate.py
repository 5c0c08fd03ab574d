"""Validation table (gvq/predict/validate.py): ratios and the summary line, on given measurements."""
from __future__ import annotations

import pytest

from gvq.predict import model as M
from gvq.predict import validate


def test_compare_divides_model_by_measurement_and_summary_counts_bands(calibrated):
    m = M.Calibrated.load(calibrated)
    truth = M.iteration(m, "rar", 2, 5e7)
    measured = [{"N": 2, "link_bps": 5e7, "aggregator": "rar", "aggregate_s": truth["aggregate_s"],
                 "iter_s": truth["iter_s"] * 2}]
    df = validate.compare(m, measured)
    assert df["agg_ratio"].iloc[0] == pytest.approx(1.0) and df["iter_ratio"].iloc[0] == pytest.approx(0.5)
    assert validate.summary(df).startswith("2 cells: 1 within 10% (50%), 1 beyond 25%")
