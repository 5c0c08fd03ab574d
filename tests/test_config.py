"""Config composition (in-process) and bad input through the real CLI (subprocess)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from gvq.validate import ConfigError, validate

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("aggregator", "model", "dataset", "optim", "net", "logger")


def _options(group):
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_option_file_composes_and_validates(compose_cfg, group, option):
    cfg = compose_cfg(f"{group}={option}")
    validate(cfg)
    assert OmegaConf.to_container(cfg, resolve=True)[group] is not None


@pytest.mark.parametrize("option", _options("aggregator"))
def test_every_aggregator_instantiates(compose_cfg, option):
    cfg = compose_cfg(f"aggregator={option}")
    agg = instantiate(cfg.aggregator, _convert_="object")
    assert hasattr(agg, "aggregate")


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


@pytest.mark.parametrize("override,key", [
    ("world_size=0", "world_size"), ("iterations=0", "iterations"), ("batch_size=0", "batch_size"),
    ("lambda=1.0", "lambda"), ("lambda=-0.1", "lambda"), ("eval_every=0", "eval_every"),
    ("L_t=1", "L_t"), ("L_c=0", "L_c"), ("s=0", "s"), ("s=2.5", "s"), ("warmup=-1", "warmup"),
    ("K=abc", "K"), ("K=0", "K"), ("optim.lr=0", "optim.lr"), ("optim.schedule=linear", "optim.schedule"),
    ("net.bandwidth_bps=0", "net.bandwidth_bps"), ("net.bandwidth_bps=-5", "net.bandwidth_bps"),
    ("net.latency_s=-1", "net.latency_s"), ("device=tpu", "device"), ("timeout_s=0", "timeout_s"),
])
def test_range_errors_name_the_key(compose_cfg, override, key):
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg(override))
    msg = str(e.value)
    assert msg.startswith(key) and "\n" not in msg


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *args, "logger=csv"], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,needle", [
    (["aggregator=nope"], "aggregator"),
    (["model=nope"], "model"),
    (["dataset=nope"], "dataset"),
    (["bogus=1"], "bogus"),
    (["world_size=0"], "world_size"),
    (["iterations=0"], "iterations"),
    (["batch_size=0"], "batch_size"),
    (["lambda=1.5"], "lambda"),
    (["dataset=cifar10", "dataset.root=/nonexistent"], "cifar-10-batches-py"),
    (["aggregator.nonsense=3"], "nonsense"),
])
def test_bad_input_exits_nonzero_with_one_line_and_no_traceback(tmp_path, args, needle):
    r = _cli(*args, f"hydra.run.dir={tmp_path}/run")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr + r.stdout
    assert needle in r.stderr


def test_slurm_launcher_config_composes(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    r = _cli("--cfg", "hydra", "hydra/launcher=slurm", "hydra.launcher.partition=cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "submitit_slurm" in r.stdout or "SlurmLauncher" in r.stdout
    assert "partition: cpu" in r.stdout
