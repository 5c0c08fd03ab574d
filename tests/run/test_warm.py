"""Ranks forked from the warm fork server: preloaded, the launcher's environment adopted, and a CLI run's
start-up stamps in order."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gvq.run import warm
from gvq.run.signals import spawn_and_join
from tests.helpers.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def _report(rank: int, path: str, env: dict):
    """In a rank: what was loaded before this function ran, its parent, and the adopted variable."""
    loaded = {m: m in sys.modules for m in warm.PRELOAD}
    warm.adopt_environment(env)
    with open(f"{path}.{rank}", "w") as f:
        json.dump({"loaded": loaded, "ppid": os.getppid(), "var": os.environ.get("GVQ_TEST_VAR")}, f)


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_bad_start_method_is_a_config_error(tmp_path):
    r = cli("iterations=1", "logger=csv", f"hydra.run.dir={tmp_path}/run",
            env=dict(os.environ, **{warm.START_METHOD_ENV: "fork"}))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "gvq: config error: GVQ_START_METHOD='fork': must be forkserver or spawn"]
    assert not (tmp_path / "run").exists()


def test_adopting_an_environment_replaces_it(monkeypatch):
    monkeypatch.setenv("GVQ_TEST_STALE", "1")
    keep = dict(os.environ)
    try:
        warm.adopt_environment({"GVQ_TEST_NEW": "2"})
        assert os.environ.get("GVQ_TEST_NEW") == "2" and "GVQ_TEST_STALE" not in os.environ
    finally:
        warm.adopt_environment(keep)
    assert os.environ.get("GVQ_TEST_STALE") == "1"


@pytest.mark.slow
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


def _python(code: str, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}   # buffered, as in a pipe
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("body, code, err", [
    ("print('out')", 0, ""),
    ("print('out'); sys.exit(3)", 3, ""),
    ("print('out'); sys.exit('gvq: a message')", 1, "gvq: a message"),
    ("print('out'); threading.Thread(target=time.sleep, args=(0.5,)).start(); sys.exit(4)", 4, ""),
    ("print('out'); raise ValueError('a bug')", 1, "ValueError: a bug"),
])
def test_exit_fast_keeps_what_an_ordinary_exit_does(tmp_path, body, code, err):
    """The status, sys.exit's message, buffered output, atexit handlers (Hydra's log, multiprocessing's
    clean-up) and a non-daemon thread's join all survive skipping the interpreter's teardown."""
    marker = tmp_path / "atexit-ran"
    script = (f"import atexit, sys, threading, time\n"
              f"atexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
              f"from gvq.run.warm import exit_fast\n"
              f"def main():\n    {body}\n"
              f"sys.exit(exit_fast(main))\n")                 # as cli.py ends
    r = _python(script, tmp_path)
    assert (r.returncode, r.stdout) == (code, "out\n"), r.stderr
    assert err in r.stderr and marker.exists()


@pytest.mark.slow
def test_the_fork_servers_first_module_flushes_and_ends_the_process(tmp_path):
    r = _python("import sys, gvq.run.warm_server, torch\nprint('buffered')\nsys.exit(7)", tmp_path)
    assert (r.returncode, r.stdout) == (0, "buffered\n")      # its own status: the server's is moot


def _servers_marked(mark: str) -> list[int]:
    """Live fork servers started with GVQ_TEST_MARK=mark in their environment."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            if b"multiprocessing.forkserver" in (d / "cmdline").read_bytes() and \
                    f"GVQ_TEST_MARK={mark}".encode() in (d / "environ").read_bytes().split(b"\0") and \
                    (d / "stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z":
                found.append(int(d.name))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.slow
def test_a_launcher_stopped_by_a_config_error_takes_its_fork_server_down(tmp_path):
    """The server dies with its launcher even while still importing torch (~3 s of work): a caller
    reading the launcher's output gets end-of-file when the launcher exits, not seconds later."""
    mark = str(tmp_path.name)
    env = dict(os.environ, WANDB_MODE="disabled", GVQ_TEST_MARK=mark)
    env.pop(warm.START_METHOD_ENV, None)
    p = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "s=0", f"hydra.run.dir={tmp_path}/run"],
                         cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    p.wait(timeout=120)
    assert p.returncode == 2 and b"config error" in p.stderr.read()
    deadline = time.monotonic() + 1.5          # the kernel's signal at the launcher's exit: milliseconds
    while _servers_marked(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _servers_marked(mark) == []
