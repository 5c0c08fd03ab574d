"""A run's processes live and die together (gvq/run/signals.py): whatever stops the launcher -- Ctrl-C,
SIGTERM, SIGHUP, SIGKILL -- stops every rank, and the run dir says how it ended.

Each test sets the signal dispositions it relies on (a shell that runs ``make test`` in the background
hands its children SIGINT ignored) and bounds every wait generously; none times a duration."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers.cli import ROOT
from tests.helpers.dist import run_ranks


def _default_signals():
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


def _ignored_signals():
    """As a non-interactive shell starts ``cli.py ... &`` (SIGINT ignored), under nohup (SIGHUP) too."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)


def _start(run: Path, *args: str, inherit=_default_signals) -> subprocess.Popen:
    env = dict(os.environ, WANDB_MODE="disabled")
    return subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "iterations=1000000", "logger=csv",
                             "logger.progress=false", f"hydra.run.dir={run}", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=inherit)


def _rows(run: Path) -> int:
    path = run / "metrics.csv"
    return len(path.read_text().splitlines()) - 1 if path.exists() else 0


def _wait_rows(p: subprocess.Popen, run: Path, n: int = 5) -> None:
    deadline = time.monotonic() + 120
    while _rows(run) < n:
        assert time.monotonic() < deadline and p.poll() is None, (p.stderr.read() if p.poll() is not None else "")
        time.sleep(0.3)


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(k) for k in out]


def descendants(pid: int) -> list[int]:
    kids = children(pid)
    return kids + [d for k in kids for d in descendants(k)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"        # a zombie has exited
    except FileNotFoundError:
        return False


def _all_gone(pids: list[int], within_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.3)
    return [p for p in pids if _alive(p)]


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


@pytest.mark.slow
@pytest.mark.parametrize("sig, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False),
                                           (signal.SIGHUP, False)])
def test_a_signal_to_the_launcher_stops_every_rank_and_records_the_interruption(tmp_path, sig, to_group):
    """Ctrl-C reaches the whole process group; ``kill``, SLURM and Kubernetes send SIGTERM to the
    launcher alone, a closed terminal SIGHUP."""
    run = tmp_path / "run"
    p = _start(run)
    try:
        _wait_rows(p, run)
        ranks = descendants(p.pid)
        (os.killpg if to_group else os.kill)(p.pid, sig)
        p.wait(timeout=90)
    finally:
        _stop(p)
    assert p.returncode == 128 + sig, p.stderr.read()[-2000:]
    assert _all_gone(ranks) == []
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and signal.Signals(sig).name in summary["reason"]
    df = pd.read_csv(run / "metrics.csv")                       # every row whole
    assert summary["last_iteration"] == df.iteration.iloc[-1] and list(df.iteration) == list(range(len(df)))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_a_launcher_started_ignoring_signals_still_stops_on_them_in_one_line(tmp_path, sig):
    """``cli.py ... &`` from a script inherits SIGINT ignored (nohup: SIGHUP): the launcher handles the
    stop signals itself, so ``kill -INT <launcher>`` stops the run as Ctrl-C would."""
    run = tmp_path / "run"
    p = _start(run, inherit=_ignored_signals)
    try:
        _wait_rows(p, run)
        ranks = descendants(p.pid)
        os.kill(p.pid, sig)
        _, err = p.communicate(timeout=90)
    finally:
        _stop(p)
    assert p.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1] == \
        f"gvq: interrupted ({signal.Signals(sig).name}); every rank stopped"
    assert _all_gone(ranks) == []
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and signal.Signals(sig).name in summary["reason"]


@pytest.mark.slow
def test_ranks_die_with_a_launcher_killed_by_sigkill(tmp_path):
    run = tmp_path / "run"
    p = _start(run)
    try:
        _wait_rows(p, run)
        ranks = descendants(p.pid)
        assert len(ranks) >= 2
        os.kill(p.pid, signal.SIGKILL)                          # no handler runs in the launcher
        p.wait(timeout=30)
        assert _all_gone(ranks) == []                           # the kernel told them (PDEATHSIG)
    finally:
        _stop(p)
    summary = json.loads((run / "summary.json").read_text())    # written by rank 0 on its way out
    # every rank gets SIGTERM at once; on a busy host rank 1 can be gone before rank 0's handler runs, and
    # rank 0 then records the lost peer first (signals_deferred holds its own SIGTERM while it records):
    # either is a true account of how the run ended, and a summary is there either way
    interrupted = summary["status"] == "interrupted" and "SIGTERM" in summary["reason"]
    peer_first = summary["status"] == "failed" and "peer" in summary["reason"].lower()
    assert interrupted or peer_first, summary
    assert summary["last_iteration"] >= 4


@pytest.mark.slow
def test_the_watchdog_ends_a_rank_whose_parent_is_gone(tmp_path):
    """Without PDEATHSIG (another OS, or a rank that re-parented before it was set): the watchdog thread
    sees the parent gone and stops the process, even one that ignores SIGTERM, after its grace."""
    code = ("import os, signal, sys, time; sys.path.insert(0, %r)\n"
            "if os.fork() == 0:\n"
            "    parent = os.getppid()\n"
            "    from gvq.run.signals import die_with_parent\n"
            "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "    time.sleep(0.5)\n"                                     # the parent is gone by now
            "    die_with_parent(parent, grace_s=1.0)\n"
            "    open(%r, 'w').write(str(os.getpid()))\n"
            "    time.sleep(60)\n"
            "else:\n"
            "    time.sleep(0.1)\n") % (str(ROOT), str(tmp_path / "pid"))
    subprocess.run([sys.executable, "-c", code], timeout=60)
    deadline = time.monotonic() + 30
    while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = int((tmp_path / "pid").read_text())
    assert _all_gone([pid], within_s=30) == []


def _ranks(launcher: int) -> list[int]:
    """The launcher's rank processes, rank order (started in order: increasing pids).  Forked (the
    default): the children of its fork server, which share the server's command line; spawned: their
    own (``spawn_main``)."""
    def cmd(pid):
        try:
            return open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            return b""
    kids = descendants(launcher)
    forked = [p for p in kids if b"forkserver" in cmd(p) and p not in children(launcher)]
    return sorted(forked or [p for p in kids if b"spawn_main" in cmd(p)])


@pytest.mark.slow
def test_a_frozen_rank_fails_the_run_within_the_timeout_and_is_named(tmp_path):
    """SIGSTOP: the rank neither answers nor dies.  Its peers give up after timeout_s; the launcher
    names the frozen rank and takes every process down."""
    run = tmp_path / "run"
    p = _start(run, "timeout_s=8")
    try:
        _wait_rows(p, run)
        ranks = _ranks(p.pid)
        assert len(ranks) == 2
        t0 = time.monotonic()
        os.kill(ranks[1], signal.SIGSTOP)
        _, err = p.communicate(timeout=180)
        waited = time.monotonic() - t0
    finally:
        _stop(p)
    assert p.returncode == 1
    assert "rank 1 stopped answering" in err and "Traceback (most recent call last)" in err
    assert waited < 8 + 60                                        # the timeout and a generous margin
    assert _all_gone(ranks) == []
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and "rank 1 stopped answering" in summary["reason"]


def test_a_second_sigterm_does_not_interrupt_the_first_ones_unwinding():
    from gvq.run.signals import Interrupted, on_sigterm
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        for s in before:
            signal.signal(s, on_sigterm)
        with pytest.raises(Interrupted) as e:
            on_sigterm(signal.SIGTERM, None)
        assert e.value.code == 128 + signal.SIGTERM
        assert all(signal.getsignal(s) == signal.SIG_IGN for s in before)
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_the_rank_that_raised_is_reported_over_the_peers_that_lost_it(tmp_path):
    """Forked ranks exit in milliseconds: the rank that lost its peer may exit (and be reported by torch)
    before the peer that raised; the launcher reports the cause."""
    import pickle
    from types import SimpleNamespace

    import torch.multiprocessing as tmp_mp

    from gvq.run.signals import _root_cause
    files = []
    for i, trace in enumerate(["gvq.comm.p2p.PeerLostError: rank 0: peer 1 closed",
                               "RuntimeError: injected failure on rank 1", None]):
        files.append(str(tmp_path / f"err{i}"))
        if trace is not None:
            with open(files[-1], "wb") as f:
                pickle.dump(trace, f)
    ctx = SimpleNamespace(error_files=files, processes=[SimpleNamespace(pid=100 + i) for i in range(3)])
    first = tmp_mp.ProcessRaisedException("-- Process 0 ...\ngvq.comm.p2p.PeerLostError: rank 0", 0, 100)
    cause = _root_cause(ctx, first)
    assert (cause.error_index, cause.error_pid) == (1, 101) and "injected failure on rank 1" in str(cause)
    other = tmp_mp.ProcessRaisedException("RuntimeError: a bug on rank 2", 2, 102)
    assert _root_cause(ctx, other) is other                # not a lost peer: torch's pick stands


def test_a_rank_error_file_holding_an_object_is_not_unpickled(tmp_path):
    """The error files are read as plain data: a pickled object (whose loading could run code) is
    refused and its rank skipped, never imported or called."""
    import pickle
    from types import SimpleNamespace

    import torch.multiprocessing as tmp_mp

    from gvq.run.signals import _root_cause
    files = [str(tmp_path / "err0"), str(tmp_path / "err1"), str(tmp_path / "err2")]
    with open(files[1], "wb") as f:
        pickle.dump(print, f)                                  # a global: loading it needs find_class
    with open(files[2], "wb") as f:
        pickle.dump("RuntimeError: the real failure on rank 2", f)
    ctx = SimpleNamespace(error_files=files, processes=[SimpleNamespace(pid=200 + i) for i in range(3)])
    first = tmp_mp.ProcessRaisedException("gvq.comm.p2p.PeerLostError: rank 0", 0, 200)
    assert _root_cause(ctx, first).error_index == 2


def test_a_sigterm_while_a_block_is_deferred_acts_after_it():
    from gvq.run.signals import Interrupted, on_sigterm, signals_deferred
    before = signal.getsignal(signal.SIGTERM)
    done = []
    try:
        signal.signal(signal.SIGTERM, on_sigterm)
        with pytest.raises(Interrupted) as e:
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                done.append("the block ran to its end")
        assert done and e.value.code == 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)    # on_sigterm set both to ignored


def _fail_with_sigterm_in_the_record(rank, world, cfg, run_dir):
    from gvq.run.signals import on_sigterm
    from gvq.run.train import train
    signal.signal(signal.SIGTERM, on_sigterm)        # as gvq's ranks and torchrun's workers run
    try:
        train(cfg, rank, world, run_dir, {"run_dir": run_dir})
    except BaseException as e:                       # what ended the rank is the result
        return type(e).__name__
    return None


def test_a_sigterm_arriving_while_rank_0_records_its_failure_waits_for_the_summary(compose_cfg, tmp_path):
    """torchrun SIGTERMs the other workers as soon as one exits, often while rank 0 is writing down the
    peer it lost: the summary is written first, the signal acted on after (an interrupted write left none)."""
    from omegaconf import OmegaConf
    cfg = OmegaConf.to_container(compose_cfg(
        "world_size=1", "iterations=10", "logger=csv", "logger.progress=false", "model.width=4",
        "aggregator._target_=tests.helpers.faulty.FailAt", "+aggregator.at=2", "+aggregator.rank=0",
        "+aggregator.how=term"), resolve=True)
    ended = run_ranks(_fail_with_sigterm_in_the_record, 1, tmp_path, cfg, str(tmp_path))[0]
    assert ended == "Interrupted"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "injected failure on rank 0 at iteration 2" in summary["reason"]
    assert summary["last_iteration"] == 1
