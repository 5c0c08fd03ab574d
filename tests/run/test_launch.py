"""Scale-out through torchrun on loopback: one node with 2 processes, and two launchers (--nnodes=2)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
ARGS = ["iterations=20", "eval_every=10", "logger=csv"]


def _env():
    env = dict(os.environ, WANDB_MODE="disabled")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _free_port() -> int:
    """A port the kernel says is free now (never a fixed one: parallel tests would collide)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_torchrun_single_node_runs_ranks_without_spawning(tmp_path):
    run = tmp_path / "run"
    r = subprocess.run([*TORCHRUN, "--standalone", "--nproc_per_node=2", str(ROOT / "cli.py"), *ARGS,
                        f"hydra.run.dir={run}"], cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["config"]["world_size"] == 2 and summary["replicas_identical"]
    assert len(pd.read_csv(run / "metrics.csv")) == 20


@pytest.mark.slow
def test_two_torchrun_launchers_form_one_job(tmp_path):
    port = _free_port()
    common = [*TORCHRUN, "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
              f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id=gvq-test-{port}"]
    procs = [subprocess.Popen([*common, f"--node_rank={i}", str(ROOT / "cli.py"), *ARGS,
                               f"hydra.run.dir={tmp_path}/node{i}"], cwd=ROOT, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    runs = [d for d in tmp_path.iterdir() if (d / "summary.json").exists()]
    assert len(runs) == 1                                   # written once, by global rank 0
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["config"]["world_size"] == 2 and summary["replicas_identical"]


@pytest.mark.slow
def test_a_rank_dying_under_torchrun_leaves_a_failed_summary(tmp_path):
    """No gvq launcher under torchrun: rank 0 records the failure itself (the peer it lost, the last
    complete row)."""
    run = tmp_path / "run"
    r = subprocess.run([*TORCHRUN, "--standalone", "--nproc_per_node=2", str(ROOT / "cli.py"), "iterations=50",
                        "logger=csv", "timeout_s=20", "aggregator._target_=tests.helpers.faulty.FailAt",
                        "+aggregator.at=7", "+aggregator.how=exit", f"hydra.run.dir={run}"], cwd=ROOT,
                       env=dict(_env(), PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] in ("failed", "interrupted") and summary["last_iteration"] == 6, summary
    assert list(pd.read_csv(run / "metrics.csv").iteration) == list(range(7))


@pytest.mark.slow
def test_torchrun_max_restarts_continues_from_the_newest_checkpoint(tmp_path):
    """--max-restarts: the restarted workers find the run dir's newest complete set themselves (no
    resume=) and finish with the uninterrupted run's rows and metrics."""
    def run(name, *extra):
        d = tmp_path / name
        r = subprocess.run([*TORCHRUN, "--standalone", "--nproc_per_node=2", "--max-restarts=2",
                            str(ROOT / "cli.py"), "iterations=12", "logger=csv", "checkpoint.every=4",
                            "eval_every=4", "timeout_s=20", "aggregator._target_=tests.helpers.faulty.FailAt",
                            "+aggregator.how=exit", "+aggregator.once=true", *extra, f"hydra.run.dir={d}"],
                           cwd=ROOT, env=dict(_env(), PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads((d / "summary.json").read_text()), pd.read_csv(d / "metrics.csv")
    (s0, ref), (s1, got) = run("ref", "+aggregator.at=999"), run("killed", "+aggregator.at=6")
    assert s0["status"] == s1["status"] == "completed"
    assert s1["restarts"] == 1 and s1["resumed_from"] == [4], s1
    assert list(got.iteration) == list(range(12))
    for col in ("train_loss", "train_acc", "test_loss", "test_acc", "bytes_sent"):
        assert np.allclose(got[col], ref[col], rtol=1e-6, atol=0, equal_nan=True), col


@pytest.mark.slow
def test_world_size_disagreeing_with_torchrun_is_refused(tmp_path):
    run = tmp_path / "run"
    env = dict(_env(), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()))
    r = subprocess.run([sys.executable, str(ROOT / "cli.py"), "world_size=4", "logger=csv",
                        f"hydra.run.dir={run}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "world_size=4: torchrun started 1" in r.stderr
    assert not run.exists() or not any(run.iterdir())
