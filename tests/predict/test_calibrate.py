"""Calibration (gvq/predict/calibrate.py): the least-squares cost fit, and a real calibration's JSON."""
from __future__ import annotations

import json

import pytest

from gvq.predict.calibrate import linear
from gvq.predict.structure import AGGREGATORS


def test_linear_recovers_fixed_and_per_value_cost():
    fixed, per = linear([(n, 2e-5 + 3e-9 * n) for n in (100, 1000, 10000, 100000)])
    assert fixed == pytest.approx(2e-5) and per == pytest.approx(3e-9)


def test_linear_never_returns_a_negative_fixed_cost():
    fixed, per = linear([(100, 0.0), (1000, 1e-5), (2000, 2.2e-5)])
    assert fixed == 0.0 and per > 0


def test_a_calibration_holds_every_cost_the_model_reads(calibrated):
    cal = json.loads((calibrated / "calibration.json").read_text())
    assert cal["model"] == "cnn" and 0 < cal["compute_s"] < 5 and 0 < cal["msg_s"] < 0.05
    assert set(cal["vector"]) == {"add", "div", "finite"}
    assert set(cal["codecs"]) == {"fp16", "qsgd", "gradiveq_bf16", "powersgd-P", "powersgd-Q"}
    for ops in cal["codecs"].values():
        assert set(ops) == {"compress", "decompress", "add"}
        assert all(len(v) == 2 and v[0] >= 0 and v[1] >= 0 for v in ops.values())
    assert cal["codecs"]["qsgd"]["compress"][1] > cal["vector"]["add"][1]    # quantizing costs more than adding
    struct = json.loads((calibrated / "structure.json").read_text())
    assert list(struct["aggregators"]) == list(AGGREGATORS)
