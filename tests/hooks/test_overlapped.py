"""``aggregator.overlap=true`` in the runner (gvq/hooks/overlapped.py), through the launcher: it trains as
its post-backward self, under virtual time on two lanes, skips and fails as a run should, and torch DDP's
options refuse the knob in one line.  That every ring aggregator trains overlapped at N = 1 and 3 and
resumes bitwise at N = 2: the contracts of tests/aggregators/test_every_aggregator.py."""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest

from gvq.schema.columns import COLUMNS
from tests.helpers.cli import cli_in_process
from tests.helpers.launch import launch_job

COMMON = ["logger=csv", "logger.progress=false", "model.width=4", "batch_size=16", "eval_every=4",
          "aggregator.overlap=true", "aggregator.bucket_cap_mb=0.004", "warmup=2", "L_t=3", "L_c=4"]
TIMES = [c.name for c in COLUMNS if c.unit == "s"]          # every declared column in seconds


def _metrics(run: Path) -> pd.DataFrame:
    df = pd.read_csv(run / "metrics.csv")
    return df.drop(columns=[c for c in TIMES if c in df])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rar", "qsgd"])
def test_overlapped_trains_as_post_backward(tmp_path, name):
    """At DDP's default buckets this model is one bucket, summed in parameter order: the same vector (and
    the same random draws) as after backward, so the runs agree but for the ring's addition order."""
    base = ["logger=csv", "logger.progress=false", "iterations=12", "eval_every=4", "world_size=3",
            f"aggregator={name}"]
    code, a = launch_job(tmp_path / "post", *base)
    assert code == 0, a
    code, b = launch_job(tmp_path / "overlap", *base, "aggregator.overlap=true")
    assert code == 0, b
    pa, pb = _metrics(tmp_path / "post"), _metrics(tmp_path / "overlap")
    pd.testing.assert_series_equal(pa.train_loss, pb.train_loss, rtol=1e-5, atol=1e-6)
    assert b["final_test_loss"] == pytest.approx(a["final_test_loss"], rel=1e-5)


@pytest.mark.slow
def test_torch_ddp_refuses_overlap_in_one_line(tmp_path):
    """torch DDP overlaps by itself: its options have no ``overlap`` key (``bucket_cap_mb`` they keep)."""
    r = cli_in_process("aggregator=ddp", "aggregator.overlap=true", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2 and "aggregator.overlap" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name,core", [("rar", "shared"), ("qsgd", "own")])
def test_overlapped_trains_under_virtual_time_on_two_lanes(tmp_path, name, core):
    code, summary = launch_job(tmp_path, *COMMON, f"aggregator={name}", "world_size=2", "iterations=4",
                               "net=mbit50", "net.clock=virtual", f"net.comm_core={core}")
    assert code == 0 and summary["replicas_identical"], summary
    # backward's tail waits for its buckets without the host's clock lock: no rank gave it up
    assert summary["ranks_without_clock_lock"] == 0
    df = pd.read_csv(tmp_path / "metrics.csv")
    assert (df.comm_s >= df.exposed_s).all() and (df.exposed_s >= 0).all() and (df.wire_s > 0).all()
    assert (df.exposed_s >= df.last_bucket_s - 1e-9).all()     # the last bucket is never hidden
    assert (df.straggle_s >= 0).all()          # the first rank to end backward waits at least as long
    # many small buckets over a slow link: the ones backward made early were averaged during it
    assert (df.comm_s > df.exposed_s).any()


@pytest.mark.slow
def test_nan_policy_skip_skips_an_overlapped_iteration_on_all_ranks(tmp_path):
    """Inside backward the non-finite gradient is already averaged (as with torch DDP): the check after
    backward still skips the step on every rank."""
    code, summary = launch_job(tmp_path, "logger=csv", "iterations=6", "eval_every=3", "nan_policy=skip",
                               "aggregator=rar", "aggregator.overlap=true",
                               "model._target_=tests.helpers.faulty.NaNAt", "+model.at=3")
    assert code == 0 and summary["replicas_identical"], summary
    df = pd.read_csv(tmp_path / "metrics.csv")
    assert list(df.skipped) == [0, 0, 0, 1, 0, 0] and summary["total_skipped"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_rank_failing_inside_backward_ends_the_job_within_the_timeout(tmp_path, capsys, how):
    t0 = time.monotonic()
    code, summary = launch_job(tmp_path, "logger=csv", "iterations=30", "timeout_s=10", "aggregator.overlap=true",
                               "aggregator._target_=tests.helpers.faulty.FailAt", "+aggregator.at=5",
                               f"+aggregator.how={how}")
    assert code != 0 and summary["status"] == "failed"
    assert time.monotonic() - t0 < 60
    err = capsys.readouterr().err
    assert ("injected failure on rank 1 at iteration 5" if how == "raise" else "process 1 terminated") in err
    assert list(pd.read_csv(tmp_path / "metrics.csv").iteration) == list(range(5))


@pytest.mark.slow
def test_bucket_cap_mb_without_overlap_warns_in_one_line(tmp_path):
    r = cli_in_process("aggregator=rar", "aggregator.bucket_cap_mb=0.5", "logger=csv", "iterations=2",
            f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0
    assert [ln for ln in r.stderr.splitlines() if "aggregator.bucket_cap_mb" in ln] == [
        "gvq: warning: aggregator.bucket_cap_mb=0.5 does nothing without aggregator.overlap=true "
        "(gradients are averaged after backward, as one vector)"]
