"""gvq/run/logs.py: the setting wandb groups seeds by, an offline wandb run carrying it, the JSON writer."""
from __future__ import annotations

import json
import time

import pytest

from gvq.run.logs import setting_of, write_json_atomic
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
    # protobuf: config values as JSON text.  wandb's own service process writes the file and may still be
    # flushing it after the run has returned on a busy host: wait for the record, never for a fixed time
    deadline, raw = time.monotonic() + 60, records[0].read_bytes()
    while b"cmp" not in raw and time.monotonic() < deadline:
        time.sleep(0.5)
        raw = records[0].read_bytes()
    assert b'"aggregator=qsgd eval_every=2 iterations=4"' in raw and b"setting" in raw and b"cmp" in raw
    assert b"seed=3 " not in raw.split(b"setting", 1)[1][:80]


def test_an_out_file_in_a_folder_not_made_yet_is_written_with_its_folder(tmp_path):
    out = tmp_path / "runs" / "bench" / "b.json"
    write_json_atomic(out, {"rows": [1.5, 2]})
    assert json.loads(out.read_text()) == {"rows": [1.5, 2]}
    write_json_atomic(out, [3], indent=None)          # an existing folder and file: overwritten
    assert out.read_text() == "[3]"
