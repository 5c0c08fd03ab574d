"""The method contract (gvq/methods/base.py): every conf/method option composes, validates and builds a
:class:`Method`; every_step is the contract's defaults (a sync every step, on the gradients, no extra
column: the runs before methods existed); a misspelt or out-of-range method key is refused in one line."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate

from gvq.methods.base import Method
from gvq.methods.every_step import EveryStep
from gvq.run.validate import ConfigError, validate
from gvq.schema import columns
from tests.helpers.cli import cli_in_process

ROOT = Path(__file__).resolve().parents[2]
METHODS = sorted(p.stem for p in (ROOT / "conf" / "method").glob("*.yaml"))


def test_the_methods_are_every_step_local_sgd_diloco_streaming_diloco_and_demo():
    assert METHODS == ["demo", "diloco", "every_step", "local_sgd", "streaming_diloco"]


@pytest.mark.parametrize("option", METHODS)
def test_every_method_composes_validates_and_is_a_method(compose_cfg, option):
    plain_sgd = ["optim=sgd", "optim.momentum=0", "optim.clip_norm=null"] if option == "demo" else []
    cfg = compose_cfg(f"method={option}", *plain_sgd)
    validate(cfg)
    method = instantiate(cfg.method)
    assert isinstance(method, Method) and method.name == option
    assert all(columns.column(f) for f in method.extra_fields)    # declared columns (KeyError otherwise)


def test_every_step_is_the_default_and_syncs_the_gradients_every_step(compose_cfg):
    method = instantiate(compose_cfg().method)
    assert type(method) is EveryStep
    assert all(method.syncs(it) and method.averages_gradients(it) for it in range(50))
    assert method.extra_fields == () and method.state_dict() == {}     # metrics.csv and checkpoints as before


@pytest.mark.parametrize("override,line", [
    ("method.every=0", "method.every=0: must be an integer >= 1"),
    ("method.outer_lr=0", "method.outer_lr=0.0: must be > 0"),
    ("method.outer_momentum=1", "method.outer_momentum=1.0: must be in [0, 1)"),
])
def test_an_out_of_range_method_knob_is_refused_in_one_line(compose_cfg, override, line):
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg("method=diloco", override))
    assert str(e.value) == line


def test_start_iter_below_zero_is_refused(compose_cfg):
    with pytest.raises(ConfigError, match=r"^method.start_iter=-1: must be an integer >= 0$"):
        validate(compose_cfg("method=local_sgd", "method.start_iter=-1"))


def test_a_misspelt_method_key_is_one_line_from_the_cli_naming_it():
    r = cli_in_process("method=diloco", "method.evry=3", "logger=csv")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(
        "gvq: config error: method.evry: unknown key; did you mean method.every?"), lines


@pytest.mark.parametrize("aggregator", ["aggregator=ddp", "aggregator.overlap=true"])
def test_a_method_the_aggregator_cannot_serve_is_refused_before_any_rank_starts(tmp_path, aggregator):
    """DiLoCo and local SGD average a vector after the step: torch DDP, or any ring inside backward, cannot;
    the launcher's preflight says so in one line (exit 2), nothing trains."""
    r = cli_in_process("method=diloco", aggregator, "logger=csv", f"hydra.run.dir={tmp_path}/run")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert lines[-1].startswith("gvq: config error: method=diloco averages a vector after the step"), lines
    assert not (tmp_path / "run" / "metrics.csv").exists()
