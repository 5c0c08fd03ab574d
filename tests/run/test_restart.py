"""restarts=K (gvq/run/restart.py, gvq/run/supervise.py): a lost rank restarts every rank from the newest
complete checkpoint set, one CSV row per iteration, the same non-time metrics as an uninterrupted run;
the budget runs out as a plain failure; no progress stops early in one line.  Includes the kill soak."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gvq.run import checkpoint, restart
from tests.helpers.launch import launch_job

RUN = ["logger=csv", "logger.progress=false", "iterations=12", "eval_every=4", "checkpoint.every=4",
       "model.width=4", "batch_size=16"]
SAME = ["iteration", "train_loss", "train_acc", "test_loss", "test_acc", "bytes_sent", "skipped"]


def _fail(at, how="exit", once=True) -> list[str]:
    return ["aggregator._target_=tests.helpers.faulty.FailAt", f"+aggregator.at={at}", f"+aggregator.how={how}",
            f"+aggregator.once={str(once).lower()}"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run (FailAt that never fires: the same aggregator class and config)."""
    run = tmp_path_factory.mktemp("ref") / "run"
    code, summary = launch_job(run, *RUN, *_fail(999))
    assert code == 0 and summary["restarts"] == 0, summary
    return pd.read_csv(run / "metrics.csv")


def _same_metrics(run: Path, reference: pd.DataFrame) -> None:
    df = pd.read_csv(run / "metrics.csv")
    assert list(df.iteration) == list(range(12))              # one row per iteration: none lost, none twice
    for col in SAME:
        a, b = df[col].to_numpy(), reference[col].to_numpy()
        assert np.allclose(a, b, rtol=1e-6, atol=0, equal_nan=True), col


@pytest.mark.slow
def test_a_rank_killed_mid_run_is_restarted_from_the_newest_checkpoint(tmp_path, reference, capsys):
    run = tmp_path / "run"
    code, summary = launch_job(run, *RUN, "restarts=2", *_fail(6))
    assert code == 0 and summary["status"] == "completed", summary
    assert summary["restarts"] == 1 and summary["resumed_from"] == [4]
    assert "restart 1 of 2 from iteration 4" in capsys.readouterr().err
    _same_metrics(run, reference)
    assert not (run / restart.SET_ASIDE).exists()


@pytest.mark.slow
def test_the_kill_soak_loses_nothing(tmp_path, reference):
    """Two ranks' deaths in one run, one right where a checkpoint set was just published (iteration 8),
    one mid-interval; every row and non-time value as the uninterrupted run's."""
    run = tmp_path / "run"
    code, summary = launch_job(run, *RUN, "restarts=3", *_fail("[2,8]"))
    assert code == 0 and summary["restarts"] == 2 and summary["resumed_from"] == [0, 8], summary
    _same_metrics(run, reference)


@pytest.mark.slow
def test_past_its_budget_a_run_fails_as_without_restarts(tmp_path, capsys):
    run = tmp_path / "run"
    code, summary = launch_job(run, *RUN, "restarts=1", *_fail("[5,9]", how="raise"))
    assert code == 1 and summary["status"] == "failed" and summary["restarts"] == 1, summary
    assert "injected failure on rank 1 at iteration 9" in capsys.readouterr().err


@pytest.mark.slow
def test_a_restart_that_makes_no_progress_stops_at_once_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    code, summary = launch_job(run, *RUN, "restarts=5", *_fail(5, once=False))
    err = capsys.readouterr().err
    assert code == 1 and summary["status"] == "failed" and summary["restarts"] == 1, summary
    assert "failed again before iteration 5 completed: not restarting" in err.strip().splitlines()[-1]


def test_the_budget_the_resume_point_and_the_rows_set_aside(tmp_path):
    rows = "iteration,train_loss\n" + "".join(f"{i},{i}\n" for i in range(6))
    (tmp_path / "metrics.csv").write_text(rows)
    budget = restart.Restarts(2, tmp_path)
    assert budget.after_failure("x") == restart.Restart(0, None) and budget.resumed_from == [0]   # no set: from 0
    assert not (tmp_path / "metrics.csv").exists()
    (tmp_path / "checkpoint" / "iter-000000004").mkdir(parents=True)
    (tmp_path / "checkpoint" / "iter-000000004" / "complete.json").write_text(json.dumps({}))
    rows += "6,6\n"                                          # the second attempt got further
    (tmp_path / "metrics.csv").write_text(rows)
    assert budget.after_failure("x") == restart.Restart(4, str(tmp_path)) and budget.resumed_from == [0, 4]
    assert budget.after_failure("x") is None                 # the budget is spent: no next attempt
    restart.set_aside_rows(str(tmp_path))                     # the restarted rank 0, before its RunLog
    assert checkpoint.previous_rows_path(str(tmp_path)).name == restart.SET_ASIDE
    assert not (tmp_path / "metrics.csv").exists()
    (tmp_path / "metrics.csv").write_text("iteration\n0\n")   # a second crash mid-replay: keep the full set
    restart.set_aside_rows(str(tmp_path))
    assert (tmp_path / restart.SET_ASIDE).read_text() == rows
    restart.rows_replayed(str(tmp_path))
    assert checkpoint.previous_rows_path(str(tmp_path)).name == "metrics.csv"


def test_no_progress_since_the_last_restart_is_stuck(tmp_path):
    (tmp_path / "metrics.csv").write_text("iteration\n0\n1\n")
    budget = restart.Restarts(3, tmp_path)
    (tmp_path / "checkpoint" / "iter-000000002").mkdir(parents=True)
    (tmp_path / "checkpoint" / "iter-000000002" / "complete.json").write_text("{}")
    budget.after_failure("x")
    with pytest.raises(restart.Stuck, match="before iteration 2 completed"):
        budget.after_failure("boom")
