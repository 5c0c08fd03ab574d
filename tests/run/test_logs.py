"""gvq/run/logs.py: the setting wandb groups a method's seeds by, and an offline wandb run carrying it."""
from __future__ import annotations

import pytest

from gvq.run.logs import setting_of
from tests.helpers.launch import launch_job


def test_a_setting_is_the_overrides_without_seed_logging_or_inert_knobs():
    over = ["aggregator=orq", "seed=2", "aggregator.compressor.levels=5", "logger.progress=false",
            "hydra.run.dir=/x", "lambda=0.05", "logger=csv"]
    assert setting_of(over) == "aggregator.compressor.levels=5 aggregator=orq lambda=0.05"
    assert setting_of(over, inert=["lambda"]) == "aggregator.compressor.levels=5 aggregator=orq"
    assert setting_of(["seed=1"]) == setting_of([]) == "default"
    seeds = {setting_of(["aggregator=qsgd", f"seed={s}"]) for s in range(3)}
    assert len(seeds) == 1                                      # every seed of a method: one wandb group


@pytest.mark.slow
def test_an_offline_wandb_run_records_group_and_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    code, summary = launch_job(run, "logger=wandb", "logger.wandb.mode=offline", "logger.progress=false",
                               "iterations=4", "eval_every=2", "seed=3", "aggregator=qsgd",
                               "logger.wandb.group=cmp")
    assert code == 0, summary
    records = list(run.rglob("offline-run-*/run-*.wandb"))       # what `wandb sync` would upload
    assert len(records) == 1, sorted(str(p) for p in run.rglob("*"))[:40]
    raw = records[0].read_bytes()                                 # protobuf: config values as JSON text
    assert b'"aggregator=qsgd eval_every=2 iterations=4"' in raw and b"setting" in raw and b"cmp" in raw
    assert b"seed=3 " not in raw.split(b"setting", 1)[1][:80]
