"""Planned kills (gvq/run/fault.py): ``GVQ_KILLS`` parsed or refused in one line; a kill fires at its own
attempt, iteration, point and rank and nowhere else, every rank meeting there first; a real run dies
with exactly its planned rows written."""
from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from gvq.aggregators.base import Aggregator
from gvq.methods.every_step import EveryStep
from gvq.run import fault, train
from gvq.run.fault import Kill, Kills
from gvq.workloads import Classification
from tests.helpers.launch import launch_job


def test_a_plan_round_trips_and_defaults_to_the_row_point():
    kills = fault.parse("0:4:1, 2:7:0:aggregate")
    assert kills == [Kill(0, 4, 1, "row"), Kill(2, 7, 0, "aggregate")]
    assert fault.parse(fault.plan_text(kills)) == kills and fault.parse("") == [] and fault.parse(" ") == []
    assert [k.rows for k in kills] == [5, 7]          # a row kill after its row, an aggregate one before


@pytest.mark.parametrize("bad", ["1:2", "a:1:0", "0:1:0:later", "0:-1:0", "0:1:0:row:x", "0:1:0:"])
def test_a_malformed_plan_is_refused_in_one_line(bad):
    with pytest.raises(ValueError) as e:
        fault.parse(f"0:1:0 {bad}")
    assert str(e.value).startswith(f"{fault.ENV}=") and repr(bad) in str(e.value) and "\n" not in str(e.value)


def test_planned_reads_the_environment(monkeypatch):
    monkeypatch.delenv(fault.ENV, raising=False)
    assert fault.planned() == []
    monkeypatch.setenv(fault.ENV, "1:3:0")
    assert fault.planned() == [Kill(1, 3, 0)]


def _walk(plan, rank, attempt, iterations=8):
    """Every point of every iteration, as the loop passes them; what each rank met and where it died."""
    met, died = [], []
    kills = Kills(plan, rank, attempt, meet=lambda: met.append(where), die=lambda: died.append(where))
    for it in range(iterations):
        for point in fault.POINTS[::-1]:              # aggregate (mid-iteration), then row
            where = (it, point)
            kills.at(it, point)
    return met, died


def test_a_kill_fires_at_its_attempt_iteration_point_and_rank_only(capsys):
    plan = [Kill(0, 3, 1, "row"), Kill(1, 5, 0, "aggregate")]
    assert _walk(plan, rank=1, attempt=0) == ([(3, "row")], [(3, "row")])
    assert _walk(plan, rank=0, attempt=0) == ([(3, "row")], [])            # meets the dying rank, lives
    assert _walk(plan, rank=0, attempt=1) == ([(5, "aggregate")], [(5, "aggregate")])
    assert _walk(plan, rank=1, attempt=1) == ([(5, "aggregate")], [])
    assert _walk(plan, rank=0, attempt=2) == ([], [])                     # an attempt with no plan: nothing
    assert fault.announced(capsys.readouterr().err) == plan               # each death said in one line


def test_an_aggregate_kill_comes_between_backward_and_the_averaging_and_nothing_else_changes(tmp_path):
    order = []

    class Toy(Aggregator):
        name = "toy"

        def aggregate(self, it):
            order.append(("aggregate", it))
            return {"bytes_sent": 1}

    kills = Kills([Kill(0, 2, 0, "aggregate")], 0, 0, meet=lambda: None, die=lambda: order.append("died"))
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    dist.init_process_group("gloo", init_method=(tmp_path / "rdv").as_uri(), rank=0, world_size=1)
    train.ITERATION_CALLBACKS.append(kills.at)                          # as fault.install attaches them
    try:
        toy, method = Toy(), EveryStep()
        method.setup(list(model.parameters()), toy)                     # the default: gradients every step
        rows = [train.step(model, opt, toy, method, Classification(2, (3,)), x, y, it) for it in (1, 2)]
    finally:
        train.ITERATION_CALLBACKS.remove(kills.at)
        dist.destroy_process_group()
    assert order == [("aggregate", 1), "died", ("aggregate", 2)]       # only iteration 2's, before averaging
    assert all(r["bytes_sent"] == 1 and r["skipped"] == 0 for r in rows)


def test_install_attaches_this_attempts_kills_and_a_later_attempt_replaces_them(monkeypatch):
    """The training loop knows no kills: fault.install puts the planned ones among its iteration
    callbacks, for this rank and attempt only; installing again (a restart in the same process) leaves
    no stale plan behind, and an attempt with none attaches nothing."""
    monkeypatch.setenv(fault.ENV, "0:3:1:row 1:5:1:aggregate 0:2:0")
    callbacks = [print]
    first = fault.install(1, 0, callbacks)
    assert callbacks == [print, first.at] and set(first.here) == {(3, "row"), (2, "row")}   # every rank meets
    second = fault.install(1, 1, callbacks)
    assert callbacks == [print, second.at] and set(second.here) == {(5, "aggregate")}
    assert fault.install(1, 2, callbacks) is None and callbacks == [print]


RUN = ["logger=csv", "logger.progress=false", "iterations=12", "eval_every=4", "checkpoint.every=4",
       "model.width=4", "batch_size=16"]


@pytest.mark.slow
@pytest.mark.parametrize("kill", [Kill(0, 6, 1, "row"), Kill(0, 7, 0, "row"), Kill(0, 6, 0, "aggregate")])
def test_a_run_dies_with_exactly_its_planned_rows(tmp_path, monkeypatch, kill):
    """No restarts: the planned SIGKILL fails the run, rank 0 having written exactly the planned rows
    (row 7 is followed by a checkpoint the kill prevents; no race with the machine's speed).  The ranks'
    stderr is the session's fork server's, not this test's: the soak's test reads the announcements."""
    monkeypatch.setenv(fault.ENV, fault.plan_text([kill]))
    code, summary = launch_job(tmp_path / "run", *RUN)
    assert code == 1 and summary["status"] == "failed", summary
    assert summary["last_iteration"] == kill.rows - 1
    assert list(pd.read_csv(tmp_path / "run" / "metrics.csv").iteration) == list(range(kill.rows))


def test_a_malformed_plan_is_a_config_error_before_any_rank_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(fault.ENV, "0:x:1")
    code, summary = launch_job(tmp_path / "run", *RUN)
    assert code == 2 and summary is None
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"gvq: config error: {fault.ENV}=")
