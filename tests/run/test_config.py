"""Config composition (in-process) and bad input through the real CLI (subprocess)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import pandas as pd
import yaml
from hydra.utils import get_object
from omegaconf import OmegaConf

from gvq.aggregators.base import Aggregator
from gvq.hooks.builder import aggregator_from
from gvq.run.validate import ConfigError, validate
from tests.helpers.launch import run_needs

ROOT = Path(__file__).resolve().parents[2]
GROUPS = ("aggregator", "model", "dataset", "optim", "net", "logger")


def _options(group):
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_option_file_composes_and_validates(compose_cfg, group, option):
    cfg = compose_cfg(f"{group}={option}", *run_needs(option))
    validate(cfg)
    assert OmegaConf.to_container(cfg, resolve=True)[group] is not None


@pytest.mark.parametrize("option", _options("aggregator"))
def test_every_aggregator_instantiates_and_satisfies_the_contract(compose_cfg, option):
    cfg = compose_cfg(f"aggregator={option}")
    agg = aggregator_from(cfg.aggregator)                   # as the runner builds it
    assert isinstance(agg, Aggregator), f"{option}: {type(agg).__name__} does not inherit the Aggregator base class"
    assert isinstance(agg.name, str) and isinstance(agg.extra_fields, tuple)


def _targets(node, where: str):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "_target_" and isinstance(v, str):
                yield where, v
            else:
                yield from _targets(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _targets(v, f"{where}[{i}]")


TARGETS = [(f"{p.relative_to(ROOT)}:{w}", t)
           for p in sorted(list((ROOT / "conf").rglob("*.yaml")) + list((ROOT / "tests" / "conf").rglob("*.yaml")))
           for w, t in _targets(yaml.safe_load(p.read_text()) or {}, "")]


@pytest.mark.parametrize("where,target", TARGETS, ids=[w for w, _ in TARGETS])
def test_every_target_in_every_option_file_resolves(where, target):
    """A stale ``_target_`` (a class moved or renamed) fails here, even in an option no other test
    instantiates; launcher plugins resolve only where their optional extra is installed."""
    if target.startswith("hydra_plugins.") and (
            importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None):
        pytest.skip("launcher plugin not installed (optional extra)")
    assert callable(get_object(target)), f"{where}: {target}"


def test_hydra_dirs_come_from_conf_hydra_default(compose_cfg):
    cfg = compose_cfg(return_hydra_config=True)
    assert cfg.hydra.run.dir.startswith("runs/") and cfg.hydra.sweep.dir.startswith("runs/multirun/")
    assert cfg.hydra.job.chdir is False
    assert "\nhydra:" not in (ROOT / "conf" / "config.yaml").read_text()   # one home for Hydra's settings


def test_the_target_scan_sees_every_room():
    rooms = {t.split(".")[1] for _, t in TARGETS if t.startswith("gvq.")}
    assert {"aggregators", "compressors", "models", "data"} <= rooms


def test_lambda_is_top_level_and_typed(compose_cfg):
    cfg = compose_cfg("lambda=0.05", "s=inf", "K=x3")
    assert cfg["lambda"] == 0.05 and cfg.s == float("inf") and cfg.K == "x3"


def test_schema_rejects_unknown_and_ill_typed_keys(compose_cfg):
    from hydra.errors import ConfigCompositionException
    with pytest.raises(ConfigCompositionException):
        compose_cfg("no_such_key=1")
    with pytest.raises(ConfigCompositionException):
        compose_cfg("world_size=abc")
    with pytest.raises(ConfigCompositionException):
        compose_cfg("optim.no_such_knob=1")
    for choice in ("device=tpu", "optim.schedule=linear", "nan_policy=ignore", "logger.wandb.mode=sometimes"):
        with pytest.raises(ConfigCompositionException):
            compose_cfg(choice)


@pytest.mark.parametrize("override,key", [
    ("world_size=0", "world_size"), ("iterations=0", "iterations"), ("batch_size=0", "batch_size"),
    ("lambda=1.0", "lambda"), ("lambda=-0.1", "lambda"), ("eval_every=0", "eval_every"),
    ("L_t=1", "L_t"), ("L_c=0", "L_c"), ("s=0", "s"), ("s=2.5", "s"), ("warmup=-1", "warmup"),
    ("K=abc", "K"), ("K=0", "K"), ("optim.lr=0", "optim.lr"),
    ("net.bandwidth_bps=0", "net.bandwidth_bps"), ("net.bandwidth_bps=-5", "net.bandwidth_bps"),
    ("net.latency_s=-1", "net.latency_s"), ("timeout_s=0", "timeout_s"), ("net.clock=virtual", "net.clock"),
    ("net.compute_scale=0.5", "net.compute_scale"), ("net.codec_scale=-1", "net.codec_scale"),
])
def test_range_errors_name_the_key(compose_cfg, override, key):
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg(override))
    msg = str(e.value)
    assert msg.startswith(key) and "\n" not in msg


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *args, "logger=csv"], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_slurm_launcher_config_composes(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    r = _cli("--cfg", "hydra", "hydra/launcher=slurm", "hydra.launcher.partition=cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "submitit_slurm" in r.stdout or "SlurmLauncher" in r.stdout
    assert "partition: cpu" in r.stdout


@pytest.mark.parametrize("aggregator,overrides,inert", [
    ("rar", ["lambda=0.5"], ["lambda"]),
    ("qsgd", ["L_t=7", "K=x2", "world_size=4"], ["K", "L_t"]),
    ("gradiveq", ["lambda=0.5", "L_t=7", "warmup=3"], []),
    ("gradiveq_bf16", ["lambda=0.5", "s=4"], []),        # reads them through its defaults (gradiveq)
    ("powersgd", [], []),                                # knobs at their defaults, not set: nothing to say
])
def test_knobs_the_aggregator_does_not_read_are_inert(compose_cfg, aggregator, overrides, inert):
    from gvq.run.validate import inert_knobs
    cfg = compose_cfg(f"aggregator={aggregator}", *overrides)
    assert inert_knobs(cfg, [f"aggregator={aggregator}", *overrides]) == inert


def test_run_and_sweep_dirs_are_unique_per_run(compose_cfg):
    """Microseconds and a random suffix: two runs started in the same second get two dirs."""
    a = compose_cfg(return_hydra_config=True).hydra
    b = compose_cfg(return_hydra_config=True).hydra
    assert a.run.dir != b.run.dir and a.sweep.dir != b.sweep.dir
    assert re.fullmatch(r"runs/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d-\d{6}-[0-9a-f]{6}", a.run.dir), a.run.dir


@pytest.mark.slow
def test_runs_started_at_once_never_share_a_dir(tmp_path):
    env = dict(os.environ, WANDB_MODE="disabled")
    procs = [subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "iterations=3", "eval_every=3", "logger=csv",
                               "logger.progress=false"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    runs = sorted(p.parent for p in (tmp_path / "runs").glob("*/*/metrics.csv"))
    assert len(runs) == 2 and all(len((r / "metrics.csv").read_text().splitlines()) == 4 for r in runs)


def test_metrics_are_never_written_over(tmp_path):
    from gvq.run.logs import RunLog
    (tmp_path / "metrics.csv").write_text("iteration\n0\n")
    cfg = {"logger": {"csv": True, "wandb": {"enabled": False, "mode": "disabled"}}}
    with pytest.raises(FileExistsError):
        RunLog(tmp_path, (), cfg, {})
    assert (tmp_path / "metrics.csv").read_text() == "iteration\n0\n"


@pytest.mark.slow
def test_a_sweep_runs_end_to_end_through_submitits_local_executor(tmp_path):
    """hydra/launcher=submitit_local (the SLURM plugin's local executor): 2 jobs x 2 ranks complete, each
    in its own dir with its own CSV; submitit's files stay under the sweep dir; nothing keeps running."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    before = set(os.listdir(ROOT))
    sweep = tmp_path / "sweep"
    r = subprocess.run([sys.executable, str(ROOT / "cli.py"), "-m", "hydra/launcher=submitit_local",
                        "aggregator=rar,qsgd", "world_size=2", "iterations=4", "eval_every=2", "logger=csv",
                        "logger.progress=false", "hydra.launcher.timeout_min=10", f"hydra.sweep.dir={sweep}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, WANDB_MODE="disabled"))
    assert r.returncode == 0, r.stderr[-2000:]
    for job, name in (("0", "rar"), ("1", "qsgd")):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["status"] == "completed" and f"aggregator={name}" in summary["overrides"]
        assert summary["run_dir"] == str(sweep / job)
        df = pd.read_csv(sweep / job / "metrics.csv")
        assert list(df.iteration) == [0, 1, 2, 3]
    assert (sweep / ".submitit").is_dir() and set(os.listdir(ROOT)) == before
    left = subprocess.run(["pgrep", "-f", str(sweep)], capture_output=True, text=True).stdout.split()
    assert left == []
