"""The report's target: test accuracy at least a value, or (``--target-loss``) test loss at most one, read
the same way by the table (time and iterations to target) and by time to accuracy's phase counts."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gvq.report import tta
from gvq.report.__main__ import main
from gvq.report.runs import load_run
from gvq.report.stats import run_stats
from gvq.report.target import Target, as_target


def _lm_run(root: Path, name: str, losses: dict[int, float], seed: int = 0, iterations: int = 10) -> Path:
    """A finished language-model run: test loss (and bits per byte) at the iterations in ``losses``."""
    d = root / name
    d.mkdir(parents=True)
    config = {"world_size": 2, "seed": seed, "batch_size": 8, "aggregator": {}, "net": {"clock": "wall"}}
    (d / "summary.json").write_text(json.dumps({"status": "completed", "config": config, "job_type": "rar",
                                                "overrides": ["aggregator=rar", f"seed={seed}"]}))
    with open(d / "metrics.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["iteration", "phase", "compute_s", "aggregate_s", "wall_s", "train_loss", "test_acc", "test_loss",
                    "test_bpb"])
        for i in range(iterations):
            loss = losses.get(i)
            w.writerow([i, "rar", 0.01, 0.02, 0.03 * (i + 1), 3.0 - 0.1 * i, "" if loss is None else 0.3,
                        "" if loss is None else loss,
                        "" if loss is None else loss / np.log(2)])
    return d


def test_a_loss_target_is_reached_at_or_below_it_an_accuracy_target_at_or_above():
    rows = pd.DataFrame({"test_acc": [0.2, 0.5, np.nan], "test_loss": [3.0, 1.9, np.nan]})
    assert Target.loss(2.0).reached(rows).tolist() == [False, True, False]
    assert Target(0.5).reached(rows).tolist() == [False, True, False]
    assert as_target(0.8) == Target(0.8) and f"{Target.loss(1.5):g}" == "1.5" and Target.loss(1.5).label == "loss 1.5"


def test_iterations_and_time_to_a_loss_target_and_the_final_bits_per_byte(tmp_path):
    run = load_run(_lm_run(tmp_path, "a", {3: 2.5, 6: 1.8, 9: 1.6}))
    out = run_stats(run, Target.loss(2.0))
    assert out["target_iters"] == 7 and out["target_s"] == pytest.approx(0.21)
    assert out["final_bpb"] == pytest.approx(1.6 / np.log(2), rel=1e-5)
    assert np.isnan(run_stats(run, Target.loss(1.0))["target_iters"])          # never reached
    assert tta.phase_counts(run, Target.loss(2.0)) == {"rar": 7}


def test_the_report_takes_target_loss_and_shows_bits_per_byte(tmp_path, capsys):
    for seed, last in ((0, 1.6), (1, 1.7)):
        _lm_run(tmp_path / "sweep", f"rar-{seed}", {4: 2.4, 9: last}, seed=seed)
    assert main([str(tmp_path / "sweep"), "target_loss=2.0", "--out", str(tmp_path / "out")]) == 0
    shown = capsys.readouterr().out
    assert "time to loss 2" in shown and "final bpb" in shown
    table = pd.read_csv(tmp_path / "out" / "table.csv")
    assert table.final_bpb.iloc[0] == pytest.approx(np.mean([1.6, 1.7]) / np.log(2), rel=1e-5)
    assert table.iters_to_target.iloc[0] == 10
