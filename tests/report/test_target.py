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


def test_an_lm_runs_report_defaults_to_a_loss_target_and_says_which(tmp_path, capsys):
    """Given no target, a language model's runs were timed to test accuracy 0.9 (meaningless to them): the
    report now counts to the LM default (the Makefile's LM_TARGET, validation loss 2.4 nats per token) and
    says so on stdout and under the table; a CNN's runs keep test accuracy 0.9."""
    from gvq.report.target import ACC_TARGET, LM_TARGET_LOSS
    for seed, last in ((0, 1.6), (1, 1.7)):
        _lm_run(tmp_path / "sweep", f"rar-{seed}", {4: 2.3, 9: last}, seed=seed)
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out")]) == 0
    shown = capsys.readouterr().out
    assert f"target: validation loss {LM_TARGET_LOSS:g} (the default for a language model's runs" in shown
    assert f"time to loss {LM_TARGET_LOSS:g}" in shown
    table = pd.read_csv(tmp_path / "out" / "table.csv")
    assert table.iters_to_target.iloc[0] == 5                                  # 2.3 <= 2.4 at iteration 4
    assert "Target: validation loss 2.4 (the default" in (tmp_path / "out" / "table.md").read_text()
    assert LM_TARGET_LOSS == 2.4 and "LM_TARGET ?= 2.4" in (Path(__file__).parents[2] / "Makefile").read_text()
    assert main([str(tmp_path / "sweep"), "target_acc=0.2", "--out", str(tmp_path / "acc")]) == 0
    assert "time to acc 0.2" in capsys.readouterr().out                         # given: taken as it is
    cnn = tmp_path / "cnn"
    _lm_run(cnn, "rar", {4: 2.3})
    (cnn / "rar" / "metrics.csv").write_text((cnn / "rar" / "metrics.csv").read_text().replace(",test_bpb", ",x"))
    assert main([str(cnn), "--out", str(tmp_path / "cnn_out")]) == 0
    assert f"target: test accuracy {ACC_TARGET:g} (the default" in capsys.readouterr().out


def test_the_report_says_validation_for_a_loss_target_everywhere():
    """tta said "test loss" where the frontier and curves say validation: one word."""
    from gvq.report.__main__ import ReportKeys
    assert Target.loss(2.4).describe == "validation loss 2.4" and Target(0.8).describe == "test accuracy 0.8"
    import inspect
    from gvq.report import frontier, plots, tta_markdown
    for module in (frontier, plots, tta_markdown, tta):
        assert "test loss" not in inspect.getsource(module), module.__name__
    assert "test loss" not in inspect.getsource(ReportKeys)
