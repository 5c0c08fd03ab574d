"""gvq/run/sweep.py: a ``-m`` sweep composed and validated whole before its first job, so a refused sweep
leaves nothing under runs/ and its line says which job and, across families, how to sweep instead."""
from __future__ import annotations

import itertools

from gvq.run.sweep import sweep_jobs
from tests.helpers.cli import cli, cli_in_process


def test_a_sweep_crossing_a_family_key_with_a_family_that_lacks_it_is_refused_leaving_nothing(tmp_path):
    """The new user's sweep: rar has no compressor. Refused before Hydra makes the sweep dir (it used to
    leave one holding only multirun.yaml, which the report then took for the latest sweep), in one line
    that names the job, the key rar lacks, and the way to sweep across families."""
    sweep = tmp_path / "sweep"
    r = cli("-m", "aggregator=qsgd,rar", "aggregator.compressor.bits=2,4", "iterations=2", "eval_every=2",
            "logger=csv", "logger.progress=false", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gvq: config error:")]
    assert len(lines) == 1, r.stderr[-2000:]
    line = lines[0]
    assert "[aggregator=rar aggregator.compressor.bits=2" in line
    assert "aggregator=rar has no aggregator.compressor" in line
    assert "sweep each family on its own" in line and "hydra.sweep.dir=DIR/rar" in line and "gvq.report DIR" in line
    assert not sweep.exists() and not tmp_path.joinpath("runs").exists()


def test_a_sweep_refused_at_a_later_job_runs_none_of_its_jobs(tmp_path):
    """world_size=0 is refused at job 2 of 2: job 1 (world_size=2) must not have trained first."""
    sweep = tmp_path / "sweep"
    r = cli_in_process("-m", "aggregator=rar", "world_size=2,0", "iterations=2", "logger=csv",
                       "logger.progress=false", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 2
    assert "gvq: config error: sweep job [aggregator=rar world_size=0" in r.stderr and "must be >= 1" in r.stderr
    assert not sweep.exists()


def test_jobs_are_the_basic_sweepers_cartesian_product_in_order():
    jobs = sweep_jobs(["aggregator=rar,qsgd", "seed=0", "world_size=2,4"])
    want = [["aggregator=" + a, "seed=0", f"world_size={n}"] for a, n in itertools.product(("rar", "qsgd"), (2, 4))]
    assert jobs == want
    assert sweep_jobs(["lr=0.1"]) == [["lr=0.1"]]
    assert sweep_jobs(["lr=interval(0,1)"]) == []              # not discrete: nothing to check up front
