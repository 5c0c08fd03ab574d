"""The suite's own tools: ``make coverage``'s table (coverage.py's JSON summed per room of ``gvq/``, before
against after) and the count of processes the tests start, printed by ``make test``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

import torch.distributed as dist

from tests.helpers import launches
from tests.helpers.cli import ROOT
from tests.helpers.coverage_rooms import by_room, main, room, table
from tests.helpers.dist import run_ranks, start_test_fork_server


def _report(**files):
    keys = ("covered_lines", "num_statements", "covered_branches", "num_branches")
    return {"files": {p: {"summary": dict(zip(keys, v))} for p, v in files.items()}}


def test_a_file_belongs_to_the_folder_under_gvq_whatever_the_checkout():
    assert room("gvq/comm/ring.py") == "gvq/comm"
    assert room("/work/base/gvq/aggregators/flat.py") == "gvq/aggregators"
    assert room("gvq/__init__.py") == "gvq"
    assert room("/home/u/gvq/gvq/run/train.py") == "gvq/run"            # a checkout named gvq itself


def test_rooms_sum_their_files_and_all_sums_every_room():
    rooms = by_room(_report(**{"gvq/comm/a.py": (3, 4, 1, 2), "gvq/comm/b.py": (5, 6, 0, 0),
                              "gvq/run/c.py": (0, 10, 0, 4)}))
    assert list(rooms) == ["gvq/comm", "gvq/run", "all"]
    assert rooms["gvq/comm"] == {"covered_lines": 8, "num_statements": 10, "covered_branches": 1, "num_branches": 2}
    assert rooms["all"]["num_statements"] == 20 and rooms["all"]["covered_lines"] == 8


def test_a_room_that_fell_is_named_and_one_that_held_is_not():
    before = by_room(_report(**{"gvq/comm/a.py": (8, 10, 2, 4), "gvq/run/c.py": (5, 10, 1, 2)}))
    after = by_room(_report(**{"gvq/comm/a.py": (8, 10, 1, 4), "gvq/run/c.py": (6, 10, 1, 2)}))
    text, fell = table(after, before)
    assert fell == ["gvq/comm", "all"]                      # branches 50% -> 25%; run rose; all fell with comm
    assert "| gvq/run | 6/10 | 60.0 | 1/2 | 50.0 | 50.0 | 50.0 |" in text


def test_the_command_exits_1_naming_the_fall(tmp_path, capsys):
    for name, lines in (("before", 9), ("after", 7)):
        (tmp_path / f"{name}.json").write_text(json.dumps(_report(**{"gvq/x/a.py": (lines, 10, 0, 0)})))
    assert main([str(tmp_path / "after.json"), str(tmp_path / "before.json")]) == 1
    assert "coverage fell in: gvq/x, all" in capsys.readouterr().err
    assert main([str(tmp_path / "before.json"), str(tmp_path / "after.json")]) == 0


def test_python_interpreters_are_told_apart_from_cli_runs_and_other_programs():
    assert launches.kind([sys.executable, "/repo/cli.py", "aggregator=rar"]) == "cli.py"
    assert launches.kind([sys.executable, "-m", "gvq.report"]) == "python"
    assert launches.kind(["git", "status"]) is None and launches.kind("python cli.py") is None


def _one(rank, world):
    return dist.get_world_size()


def test_a_group_of_ranks_and_an_interpreter_are_each_counted_once(tmp_path):
    before = launches.COUNTS.copy()
    assert run_ranks(_one, 2, tmp_path) == [2, 2]
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    after = launches.COUNTS - before
    assert after == {"rank groups": 1, "other Python processes": 1}


def _env_var(rank, world):
    return os.environ.get("GVQ_TEST_ADOPTED")


def test_a_rank_adopts_the_callers_environment_as_it_is_at_launch(tmp_path, monkeypatch):
    """A variable set after the fork server started reaches the ranks (they take the caller's environment
    at launch, not the server's)."""
    start_test_fork_server()
    monkeypatch.setenv("GVQ_TEST_ADOPTED", uuid.uuid4().hex)
    assert run_ranks(_env_var, 2, tmp_path) == [os.environ["GVQ_TEST_ADOPTED"]] * 2


def _dies_on_one(rank, world):
    if rank == 1:
        os._exit(7)
    dist.barrier()                     # rank 0 waits on the dead rank: killed with its group, not left behind
    return rank


def _hangs(rank, world):
    time.sleep(600)


def test_a_rank_that_dies_or_hangs_fails_its_test_by_name_and_the_next_group_is_sound(tmp_path):
    with pytest.raises(Exception, match="process 1 terminated with exit code 7"):
        run_ranks(_dies_on_one, 2, tmp_path)
    with pytest.raises(TimeoutError, match="ranks of _hangs did not finish within 3"):
        run_ranks(_hangs, 2, tmp_path, timeout=3.0)
    assert run_ranks(_one, 3, tmp_path) == [3, 3, 3]


@pytest.mark.slow
def test_coverage_follows_a_rank_forked_from_the_fork_server(tmp_path):
    """``make coverage``'s settings (pyproject.toml) measure code that runs only in a rank: the environment
    test above run under them, ``adopt_environment``'s replacing branch (a rank's, never the caller's) is
    covered."""
    env = dict(os.environ, COVERAGE_FILE=str(tmp_path / "cov"), COVERAGE_PROCESS_START=str(ROOT / "pyproject.toml"),
               WANDB_MODE="disabled")
    env.pop("PYTEST_ADDOPTS", None)     # the outer run's options (a --basetemp it would clear) stay its own
    test = "tests/test_suite_tools.py::test_a_rank_adopts_the_callers_environment_as_it_is_at_launch"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", test],
                   cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    for cmd in (["combine", "-q"], ["json", "-q", "-o", str(tmp_path / "c.json")]):
        subprocess.run([sys.executable, "-m", "coverage", *cmd], cwd=ROOT, env=env, check=True, timeout=120)
    warm = next(v for k, v in json.loads((tmp_path / "c.json").read_text())["files"].items()
                if k.endswith("gvq/run/warm.py"))
    lines = (ROOT / "gvq" / "run" / "warm.py").read_text().splitlines()
    update = next(i for i, ln in enumerate(lines, 1) if ln.strip() == "os.environ.update(env)")
    assert update in warm["executed_lines"]


def test_a_shared_fixture_that_failed_is_not_rebuilt_by_the_next_test(tmp_path_factory):
    """once_per_run: a build that raised (a calibration past its timeout) marks itself failed; the next
    asker fails at once naming it instead of building (and timing out) again."""
    from _pytest.outcomes import Failed

    from tests.helpers.shared import once_per_run
    calls = []

    def build(folder):
        calls.append(folder)
        raise RuntimeError("too slow")
    name = f"probe-{len(list(tmp_path_factory.getbasetemp().iterdir()))}"
    with pytest.raises(RuntimeError):
        once_per_run(tmp_path_factory, name, build)
    with pytest.raises(Failed, match="failed in an earlier test: RuntimeError: too slow"):
        once_per_run(tmp_path_factory, name, build)
    assert len(calls) == 1
    assert once_per_run(tmp_path_factory, name + "-ok", lambda folder: calls.append(folder)).is_dir()
    assert len(calls) == 2 and once_per_run(tmp_path_factory, name + "-ok", build).is_dir()   # built once
