"""Run a training job through the launcher's entry function, ``gvq.run.launch.launch(cfg)``, in this
process: what ``python cli.py`` does once Hydra has composed the config and made the run dir.  The ranks
are still processes the launcher starts (forked from the fork server this process keeps for the whole
session); no interpreter, Hydra or fork server is started per run.  For behaviour of the training job;
the CLI itself (one-line errors, signals, sweeps, the README commands) is tested through
``tests.helpers.cli``."""
from __future__ import annotations

import json
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from tests.helpers.cli import ROOT
from tests.helpers.dist import start_test_fork_server

#: what an option needs of the rest of the run to be accepted (``Aggregator.check_run``), for the tests that
#: run every option with SGD's defaults: DGC keeps the momentum itself; a net of 4-rank nodes needs whole nodes
RUN_NEEDS = {"dgc": ["optim.momentum=0"], "signum": ["optim.momentum=0", "optim.lr=0.003"],
             "nodes2x4": ["world_size=8"]}


def run_needs(name: str, overrides=()) -> list[str]:
    """:data:`RUN_NEEDS` of option ``name``, but where ``overrides`` pick another optimizer (AdamW has no
    momentum key to set)."""
    return [] if any(o.startswith("optim=") for o in overrides) else RUN_NEEDS.get(name, [])


def compose_job(run_dir: Path, *overrides: str):
    """The config ``python cli.py *overrides hydra.run.dir=run_dir`` runs, and Hydra's view of the job
    (its run dir resolved as Hydra's job runner does)."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=[*overrides, f"hydra.run.dir={run_dir}"], return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(Path(run_dir).resolve())
    return cfg


def launch_job(run_dir: Path, *overrides: str) -> tuple[int, dict | None]:
    """``launch(cfg)`` for the job above; returns its exit status (0, or the code of the
    :class:`gvq.run.errors.RunEnded` it raises: 1 a rank failed, 2 a config error, 3 diverged) and the
    run's summary.json (None where none was written)."""
    from gvq.run.errors import RunEnded
    from gvq.run.launch import launch
    cfg = compose_job(run_dir, *overrides)
    start_test_fork_server()                      # the session's one server, with the tests' preloads
    HydraConfig.instance().set_config(cfg)        # the launcher reads its run dir and names from here
    with open_dict(cfg):
        del cfg["hydra"]                           # the task function's view, as Hydra hands it over
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    try:
        launch(cfg)
        code = 0
    except RunEnded as e:
        code = e.code
    finally:
        HydraConfig.instance().cfg = None
    summary = Path(run_dir) / "summary.json"
    return code, (json.loads(summary.read_text()) if summary.exists() else None)
