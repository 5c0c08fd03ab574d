"""Ranks forked from the warm fork server: preloaded, the launcher's environment adopted, and a CLI run's
start-up stamps in order."""
from __future__ import annotations

import json
import os
import sys

import pytest

from gvq.run import warm
from gvq.run.signals import spawn_and_join
from tests.helpers.cli import cli


def _report(rank: int, path: str, env: dict):
    """In a rank: what was loaded before this function ran, its parent, and the adopted variable."""
    loaded = {m: m in sys.modules for m in warm.PRELOAD}
    warm.adopt_environment(env)
    with open(f"{path}.{rank}", "w") as f:
        json.dump({"loaded": loaded, "ppid": os.getppid(), "var": os.environ.get("GVQ_TEST_VAR")}, f)


def test_ranks_fork_from_a_preloaded_server_and_take_the_launchers_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(warm.START_METHOD_ENV, raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert warm.start_fork_server() and warm.start_fork_server()      # idempotent: one server
    server = warm.server_pid()
    monkeypatch.setenv("GVQ_TEST_VAR", "set-after-the-server-started")
    spawn_and_join(_report, (str(tmp_path / "r"), dict(os.environ)), 2, start_method="forkserver")
    for rank in range(2):
        got = json.loads((tmp_path / f"r.{rank}").read_text())
        assert got["ppid"] == server                                   # forked by it, not spawned
        assert all(got["loaded"].values()), got["loaded"]              # torch, dynamo, gvq: imported
        assert got["var"] == "set-after-the-server-started"            # as spawn would have given it
    assert warm.server_pid() == server                                 # reused, not restarted


def test_start_method_knob(monkeypatch):
    monkeypatch.setenv(warm.START_METHOD_ENV, "spawn")
    assert warm.start_method() == "spawn" and warm.start_fork_server() is False
    monkeypatch.setenv(warm.START_METHOD_ENV, "fork")
    with pytest.raises(ValueError, match="forkserver or spawn"):
        warm.start_method()
    monkeypatch.delenv(warm.START_METHOD_ENV)
    monkeypatch.setenv("LOCAL_RANK", "0")                              # a torchrun rank spawns nothing
    assert warm.start_fork_server() is False


def test_adopting_an_environment_replaces_it(monkeypatch):
    monkeypatch.setenv("GVQ_TEST_STALE", "1")
    keep = dict(os.environ)
    try:
        warm.adopt_environment({"GVQ_TEST_NEW": "2"})
        assert os.environ.get("GVQ_TEST_NEW") == "2" and "GVQ_TEST_STALE" not in os.environ
    finally:
        warm.adopt_environment(keep)
    assert os.environ.get("GVQ_TEST_STALE") == "1"


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_runs_startup_stamps_are_in_order(tmp_path, method):
    """Both ways of starting ranks run; summary.json carries the start-up stamps the benchmark splits."""
    env = dict(os.environ, **{warm.START_METHOD_ENV: method})
    r = cli("world_size=2", "iterations=2", "logger=csv", "logger.progress=false",
            f"hydra.run.dir={tmp_path}", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    stamps = json.loads((tmp_path / "summary.json").read_text())["startup"]
    order = ["process", "main", "spawn", "rank_start", "rendezvous", "built", "logger", "first_step",
             "trained"]
    assert set(stamps) == set(order)
    times = [stamps[k] for k in order]
    assert times == sorted(times), stamps
