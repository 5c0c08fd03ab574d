"""End to end: training quality, replica equality and sweeps through the real CLI; failures and the NaN
policy through the launcher's entry function in-process (``tests.helpers.launch``)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.helpers.cli import ROOT, cli
from tests.helpers.dist import run_ranks
from tests.helpers.launch import launch_job


@pytest.mark.slow
def test_default_digits_run_learns_and_keeps_replicas_identical(tmp_path):
    run = tmp_path / "run"
    r = cli(f"hydra.run.dir={run}", "logger=csv")
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["replicas_identical"] is True
    assert summary["final_test_acc"] >= 0.90
    df = pd.read_csv(run / "metrics.csv")
    assert list(df.iteration) == list(range(300))
    for col in ("epoch", "phase", "compute_s", "aggregate_s", "wire_s", "stage_s", "bytes_sent", "train_loss",
                "train_acc", "lr", "wall_s", "test_loss", "test_acc"):
        assert col in df.columns
    assert (df.stage_s == 0).all() and summary["cuda_plan"] is None     # host tensors: nothing staged
    evals = df.dropna(subset=["test_acc"])
    assert list(evals.iteration) == [49, 99, 149, 199, 249, 299]
    assert evals.test_acc.iloc[-1] == pytest.approx(summary["final_test_acc"], abs=1e-4)
    assert df.train_loss.iloc[-20:].mean() < df.train_loss.iloc[:20].mean() / 5
    # the ring moves 2(N-1)/N of the parameter bytes per rank: (2 ranks) exactly the model size
    assert (df.bytes_sent == df.bytes_sent.iloc[0]).all() and df.bytes_sent.iloc[0] > 0
    assert (df.aggregate_s >= df.wire_s * 0.99).all()


@pytest.mark.slow
def test_sweep_runs_every_job_and_writes_each_csv(tmp_path):
    sweep = tmp_path / "sweep"
    r = cli("-m", "aggregator=rar", "world_size=1,3", "iterations=12", "eval_every=6", "logger=csv",
            f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr[-3000:]
    csvs = sorted(sweep.glob("*/metrics.csv"))
    assert len(csvs) == 2
    for path in csvs:
        df = pd.read_csv(path)
        assert len(df) == 12 and df.test_acc.notna().sum() == 2
    ws = sorted(json.loads((p.parent / "summary.json").read_text())["config"]["world_size"] for p in csvs)
    assert ws == [1, 3]


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_failing_rank_ends_the_job_nonzero_and_keeps_completed_rows(tmp_path, capsys, how):
    run = tmp_path / "run"
    code, summary = launch_job(run, "logger=csv", "iterations=50", "timeout_s=20",
                               "aggregator._target_=tests.helpers.faulty.FailAt", "+aggregator.at=7",
                               f"+aggregator.how={how}")
    assert code != 0
    if how == "raise":
        assert "injected failure on rank 1 at iteration 7" in capsys.readouterr().err
    df = pd.read_csv(run / "metrics.csv")
    assert list(df.iteration) == list(range(7))       # every completed iteration, no torn row
    assert summary["status"] == "failed"


def test_nan_gradient_stops_the_run_naming_rank_and_layer(tmp_path, capsys):
    run = tmp_path / "run"
    code, _ = launch_job(run, "logger=csv", "iterations=10", "model._target_=tests.helpers.faulty.NaNAt",
                         "+model.at=3")
    assert code != 0
    err = capsys.readouterr().err
    assert "gvq: stopped: non-finite gradient at iteration 3 (rank 1: net." in err and "Traceback" not in err
    assert list(pd.read_csv(run / "metrics.csv").iteration) == [0, 1, 2]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["reason"].startswith("non-finite gradient at iteration 3")
    assert not list(run.glob(".stopped-rank*"))


def test_nan_policy_error_ends_the_cli_in_one_line(tmp_path):
    """A stop the user asked for is one line on stderr, exit 1, no traceback (tests.helpers.cli: a real
    CLI, as the user sees it)."""
    from tests.helpers.cli import cli
    r = cli("logger=csv", "logger.progress=false", "iterations=6", "model._target_=tests.helpers.faulty.NaNAt",
            "+model.at=3", f"hydra.run.dir={tmp_path}")
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[-1].startswith("gvq: stopped: non-finite gradient at iteration 3 (rank 1: net."), r.stderr


def test_nan_policy_skip_skips_on_all_ranks_and_counts(tmp_path):
    run = tmp_path / "run"
    code, summary = launch_job(run, "logger=csv", "iterations=10", "eval_every=5", "nan_policy=skip",
                               "model._target_=tests.helpers.faulty.NaNAt", "+model.at=3")
    assert code == 0, summary
    df = pd.read_csv(run / "metrics.csv")
    assert list(df.skipped) == [0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
    assert df.phase[3] == "skipped" and df.bytes_sent[3] == 0
    assert summary["total_skipped"] == 1 and summary["replicas_identical"]


@pytest.mark.parametrize("aggregator, says", [
    ("fp16", "gradient too large for the wire at iteration 3"),       # gvq's ring: checked before it starts
    ("ddp_fp16", "non-finite gradient at iteration 3"),                # torch's hook runs in backward: inf
])
def test_fp16_wire_overflow_is_caught_by_nan_policy(tmp_path, capsys, aggregator, says):
    """Gradients finite in fp32 but beyond fp16's range (65504)."""
    blow = ["model._target_=tests.helpers.faulty.NaNAt", "+model.at=3", "+model.factor=1e9",
            f"aggregator={aggregator}"]
    code, _ = launch_job(tmp_path / "error", "logger=csv", "iterations=8", *blow)
    err = capsys.readouterr().err
    assert code != 0 and says in err, err[-2000:]
    run = tmp_path / "skip"
    code, summary = launch_job(run, "logger=csv", "iterations=8", "eval_every=4", "nan_policy=skip", *blow)
    assert code == 0 and "Traceback" not in capsys.readouterr().err, summary
    df = pd.read_csv(run / "metrics.csv")
    assert list(df.skipped) == [0, 0, 0, 1, 0, 0, 0, 0]
    assert summary["status"] == "completed" and summary["replicas_identical"]


@pytest.mark.slow
def test_a_run_that_skips_every_step_to_the_end_is_diverged_and_fails(tmp_path):
    run = tmp_path / "run"
    r = cli(f"hydra.run.dir={run}", "logger=csv", "iterations=12", "eval_every=6", "nan_policy=skip",
            "model._target_=tests.helpers.faulty.NaNAt", "+model.at=4", "+model.forever=true")
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("gvq:")] == [
        "gvq: run diverged: every step skipped since iteration 4 (non-finite gradients; nan_policy=skip)"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["total_skipped"] == 8


@pytest.mark.slow
def test_joblib_launcher_runs_jobs_that_spawn_their_own_ranks(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="pip install -e '.[joblib]'")
    sweep = tmp_path / "sweep"
    r = cli("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "aggregator=rar,signsgd",
            "iterations=10", "eval_every=5", "logger=csv", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr[-3000:]
    done = [json.loads(p.read_text())["status"] for p in sweep.glob("*/summary.json")]
    assert done == ["completed", "completed"]


VIRTUAL_OK = sorted(p.stem for p in (ROOT / "conf" / "aggregator").glob("*.yaml") if not p.stem.startswith("ddp"))


def _train_virtual(rank, world, cfgs, root):
    from gvq.run.train import train
    out = {}
    for name, cfg in cfgs.items():
        summary = train(cfg, rank, world, f"{root}/{name}", {"run_dir": f"{root}/{name}"})
        out[name] = None if summary is None else (summary["clock"], summary["wall_s"], summary["real_wall_s"],
                                                   summary["total_bytes_sent"])
    return out


@pytest.mark.slow
def test_every_p2p_aggregator_trains_in_virtual_time_with_identical_replicas(compose_cfg, tmp_path):
    """Short virtual-time runs of every aggregator whose traffic goes through P2P; train() fails if the
    replicas differ at the end.  The clock is simulated: compute runs 6x faster than this host's."""
    from omegaconf import OmegaConf
    cfgs = {}
    for name in VIRTUAL_OK:
        cfg = compose_cfg(f"aggregator={name}", "iterations=5", "eval_every=5", "logger=csv", "net=mbit200",
                          "net.clock=virtual", "net.compute_scale=0.1667", "warmup=1", "L_t=2", "L_c=2",
                          "model.width=4", "logger.progress=false")
        cfgs[name] = OmegaConf.to_container(cfg, resolve=True)
        (tmp_path / name).mkdir()
    res = run_ranks(_train_virtual, 2, tmp_path, cfgs, str(tmp_path), timeout=300)[0]
    assert sorted(res) == VIRTUAL_OK and len(VIRTUAL_OK) >= 10
    for name, (clock, wall, real, sent) in res.items():
        assert clock == "virtual" and wall > 0 and real > 0 and sent > 0, name
        df = pd.read_csv(tmp_path / name / "metrics.csv")
        assert set(df["clock"]) == {"virtual"} and df["wall_s"].is_monotonic_increasing, name
        # virtual wall = compute (x1/6) + aggregation, within the per-iteration bookkeeping
        assert df["wall_s"].iloc[-1] >= 0.9 * (df["compute_s"] + df["aggregate_s"]).sum(), name


@pytest.mark.slow
def test_a_run_whose_loss_returns_to_chance_ends_collapsed_in_one_line(tmp_path):
    """A model that learns, then outputs zero logits (loss ln 10, accuracy of one guess) to the end: the run
    ends with status collapsed and one line saying so, exit 3; the report lists it as collapsed."""
    run = tmp_path / "run"
    r = cli(f"hydra.run.dir={run}", "logger=csv", "iterations=80", "eval_every=40",
            "model._target_=tests.helpers.faulty.ChanceAfter", "+model.at=30")
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gvq:")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("gvq: run collapsed: train loss back at chance since iteration"), lines
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "collapsed" and summary["reason"] in lines[0]
    assert 30 < int(summary["reason"].split("since iteration ")[1].split()[0]) < 60


@pytest.mark.slow
def test_a_run_that_never_leaves_chance_is_not_completed(tmp_path):
    """A model whose logits are zero from its first step (loss ln 10 throughout, accuracy of one guess)
    over 100 iterations: status never_learned with a one-line reason, exit 3 (issue 51: such a run was
    reported completed at 0.100)."""
    run = tmp_path / "run"
    r = cli(f"hydra.run.dir={run}", "logger=csv", "logger.progress=false", "iterations=100", "eval_every=50",
            "model._target_=tests.helpers.faulty.ChanceAfter", "+model.at=0")
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gvq:")]
    assert len(lines) == 1 and lines[0].startswith("gvq: run never_learned: train loss never left chance in 100"), lines
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "never_learned" and summary["reason"] in lines[0]


@pytest.mark.slow
def test_rar_learns_fashion_mnist_well_above_chance(tmp_path, fashion_root, monkeypatch):
    """The real data set trains: rar on a 6,000-image stratified subset, 2 ranks, 150 iterations (fixed
    seeds) ends far above chance (0.10); the bar leaves a wide margin below what it reaches."""
    monkeypatch.setenv("GVQ_DATA", str(fashion_root))
    code, summary = launch_job(tmp_path / "run", "dataset=fashion_mnist", "dataset.n_train=6000", "logger=csv",
                               "logger.progress=false", "iterations=150", "eval_every=150", "seed=0")
    assert code == 0 and summary["status"] == "completed", summary
    assert summary["final_test_acc"] >= 0.6, summary["final_test_acc"]
    df = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert df.train_loss.iloc[-30:].mean() < 0.6 * df.train_loss.iloc[:10].mean()


@pytest.mark.slow
def test_a_failed_job_does_not_cancel_the_rest_of_a_sweep(tmp_path):
    """In a sweep (-m) a job that stops (here nan_policy=error on a NaN) prints its one line and records
    status failed, and the next job still runs (a comparison sweep with one unstable method completes)."""
    sweep = tmp_path / "sweep"
    r = cli("-m", "model._target_=tests.helpers.faulty.NaNAt", "+model.at=2,1000", "iterations=8",
            "eval_every=4", "logger=csv", "logger.progress=false", f"hydra.sweep.dir={sweep}")
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("gvq: stopped: non-finite gradient")], r.stderr
    first = json.loads((sweep / "0" / "summary.json").read_text())
    second = json.loads((sweep / "1" / "summary.json").read_text())
    assert first["status"] == "failed" and second["status"] == "completed"


def _train_all(rank, world, cfgs, root):
    from gvq.run.train import train
    for name, cfg in cfgs.items():
        train(cfg, rank, world, f"{root}/{name}", {"run_dir": f"{root}/{name}"})


AGGREGATE_ERROR_RUNS = {        # name: overrides (every run: aggregate_error=true unless named off)
    "qsgd": ["aggregator=qsgd", "aggregator.compressor.bits=2"],
    "qsgd-off": ["aggregator=qsgd", "aggregator.compressor.bits=2", "aggregate_error=false"],
    "qsgd-overlap": ["aggregator=qsgd", "aggregator.compressor.bits=2", "aggregator.overlap=true",
                     "aggregator.bucket_cap_mb=0.004"],
    "ddp": ["aggregator=ddp"],
}


@pytest.mark.slow
def test_aggregate_error_reaches_the_aggregator_and_its_column_and_changes_no_training(compose_cfg, tmp_path):
    """``aggregate_error=true`` (conf/config.yaml) reaches the aggregator through RunContext: a column of
    the mean's error after every step (post-backward and inside backward), NaN for torch DDP, which
    averages inside its own hooks; off, no column, and the same bytes and losses as on."""
    from omegaconf import OmegaConf
    cfgs = {}
    for name, overrides in AGGREGATE_ERROR_RUNS.items():
        cfg = compose_cfg("aggregate_error=true", *overrides, "iterations=4", "eval_every=4", "logger=csv",
                          "logger.progress=false", "model.width=4", "batch_size=16")
        cfgs[name] = OmegaConf.to_container(cfg, resolve=True)
        (tmp_path / name).mkdir()
    run_ranks(_train_all, 2, tmp_path, cfgs, str(tmp_path), timeout=240)
    df = {name: pd.read_csv(tmp_path / name / "metrics.csv") for name in cfgs}
    for name in ("qsgd", "qsgd-overlap"):
        assert (df[name].aggregate_error > 1e-3).all() and df[name].aggregate_error.notna().all(), name
    assert "aggregate_error" in df["ddp"] and df["ddp"].aggregate_error.isna().all()
    assert "aggregate_error" not in df["qsgd-off"]
    for col in ("bytes_sent", "train_loss"):
        assert df["qsgd-off"][col].tolist() == df["qsgd"][col].tolist(), col
