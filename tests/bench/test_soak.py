"""gvq/bench/soak.py: its plan of kills (drawn from a seed), and end to end on a tiny run: each planned
SIGKILL (gvq/run/fault.py) at its planned row under restarts=K, each restart from the checkpoint the kill
left, then rows and non-time metrics equal to an uninterrupted run's.  Nothing races the machine's speed:
each rank kills itself at its row."""
from __future__ import annotations

import random

import pytest

from gvq.bench import soak
from gvq.bench.__main__ import main as bench_main
from gvq.run import fault


@pytest.mark.parametrize("seed", range(20))
def test_a_plan_kills_once_per_attempt_each_after_more_rows(seed):
    kills = soak.draw_kills(5, 12, 3, random.Random(seed))
    assert kills == soak.draw_kills(5, 12, 3, random.Random(seed))      # the seed decides everything
    assert [k.attempt for k in kills] == list(range(5)) and all(0 <= k.rank < 3 for k in kills)
    rows = [k.rows for k in kills]
    assert rows == sorted(set(rows)) and 1 <= rows[0] and rows[-1] <= 11   # progress each time, none at the end
    with pytest.raises(ValueError, match="kills=12"):
        soak.draw_kills(12, 12, 2, random.Random(seed))


def test_a_restart_resumes_from_the_newest_checkpoint_its_kill_left():
    kills = fault.parse("0:5:0:row 1:6:0:aggregate 2:8:1:row")
    assert soak.resumes(kills, 3) == [3, 6, 6] and soak.resumes(kills, 0) == [0, 0, 0]


@pytest.mark.slow
def test_the_soak_kills_ranks_at_the_planned_rows_and_loses_nothing():
    # seed 2's plan: both ranks, both points, a kill after row 0 (restart from scratch), one after row 5 where
    # a checkpoint was due (it is not written: resume from 3, not 6), one just after the checkpoint at 12
    plan = "0:0:1:row 1:2:0:aggregate 2:5:0:row 3:12:1:aggregate"
    assert fault.plan_text(soak.draw_kills(4, 14, 2, random.Random(2))) == plan
    out = bench_main(["soak", "kills=4", "every=3", "iterations=14", "seed=2", "set=[model.width=8]"])
    assert out["status"] == "completed" and out["rows_and_metrics_equal"] and out["kills_as_planned"]
    assert out["plan"] == plan and out["kills"] == out["restarts"] == 4
    assert out["killed_at_rows"] == [1, 2, 6, 12] and out["resumed_from"] == [0, 0, 3, 12]
    assert out["iterations_lost"] == [1, 2, 3, 0]
