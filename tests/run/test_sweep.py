"""gvq/run/sweep.py: a ``-m`` sweep composed and validated whole before its first job, so a refused sweep
leaves nothing under runs/ and its line says which job and, across families, how to sweep instead."""
from __future__ import annotations

import itertools

from gvq.run.sweep import applicable_jobs, sweep_jobs
from tests.helpers.cli import cli, cli_in_process


def test_a_method_sweep_runs_each_key_on_the_methods_that_have_it(tmp_path):
    """The issue's sweep: every_step has no ``every``, so it runs once; diloco once per value; the check
    before the first job composes exactly the jobs the sweeper runs."""
    sweep = tmp_path / "sweep"
    r = cli_in_process("-m", "method=every_step,diloco", "method.every=2,3", "iterations=2", "eval_every=2",
                       "logger=csv", "logger.progress=false", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr[-2000:]
    ran = sorted(yaml_overrides(d) for d in sweep.iterdir() if d.is_dir())
    assert ran == [["method=diloco", "method.every=2"], ["method=diloco", "method.every=3"], ["method=every_step"]]


def yaml_overrides(job_dir):
    import yaml
    task = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text())
    return [o for o in task if o.startswith("method")]


def test_a_key_applies_to_the_swept_options_that_have_it_nested_keys_too():
    choices = {"aggregator": "rar", "method": "every_step"}
    jobs = sweep_jobs(["aggregator=rar,qsgd,fp16", "aggregator.compressor.bits=2,4", "seed=0"])
    assert applicable_jobs(jobs, choices) == [
        ["aggregator=rar", "seed=0"],                                  # rar has no compressor
        ["aggregator=qsgd", "aggregator.compressor.bits=2", "seed=0"],
        ["aggregator=qsgd", "aggregator.compressor.bits=4", "seed=0"],
        ["aggregator=fp16", "seed=0"]]                                 # fp16's compressor has no bits
    # the default option where a job names none: every_step (the composed default) lacks every
    jobs = sweep_jobs(["method.every=2,3", "seed=0,1"])
    assert applicable_jobs(jobs, choices) == jobs                     # no option of the sweep has it: kept
    assert applicable_jobs(sweep_jobs(["method=diloco,every_step", "method.every=2"]), choices) == [
        ["method=diloco", "method.every=2"], ["method=every_step"]]


def test_a_key_no_swept_option_has_is_refused_in_one_line_naming_the_job_leaving_nothing(tmp_path):
    """A misspelt key is never dropped: no option of the sweep has it, so its job is refused."""
    sweep = tmp_path / "sweep"
    r = cli("-m", "aggregator=qsgd,rar", "aggregator.compressor.bitz=2,4", "iterations=2", "eval_every=2",
            "logger=csv", "logger.progress=false", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gvq: config error:")]
    assert len(lines) == 1, r.stderr[-2000:]
    assert "sweep job [aggregator=qsgd aggregator.compressor.bitz=2" in lines[0]
    assert "did you mean aggregator.compressor.bits" in lines[0]
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
