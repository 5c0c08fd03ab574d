"""The compute as N ranks on this host pay it (gvq/predict/host_compute.py), and validate's use of it; its
timing on real ranks runs inside calibrate-overlap's own test (tests/predict/test_overlap.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gvq.predict import cost_model as M
from gvq.predict import host_compute, validate


def test_samples_are_rescaled_to_the_hosts_speed_of_the_moment():
    entry = {"quiet_s": 0.1, "samples": [0.12, 0.2]}
    assert host_compute.at_speed(entry, [0.3, 0.2, 0.2]) == pytest.approx([0.24, 0.4])   # now at 2x slower


def test_an_overlap_json_without_the_timing_reads_as_none(tmp_path):
    assert host_compute.read(tmp_path) == {}
    (tmp_path / "overlap.json").write_text(json.dumps({"host_msg": {}}))
    assert host_compute.read(tmp_path) == {}
    (tmp_path / "overlap.json").write_text(json.dumps({"host_compute": {"4": {"quiet_s": 0.1, "samples": [0.1]}}}))
    assert host_compute.read(tmp_path) == {4: {"quiet_s": 0.1, "samples": [0.1]}}


def test_validate_prices_compute_from_n_ranks_on_this_host_only_where_that_n_was_timed():
    """N = 4 timed on this host at 1.5x a quiet rank: its cell's compute is the slowest of 4 from those
    samples at the fresh samples' speed; N = 8, not timed, keeps the fresh one-rank samples."""
    m = M.Calibrated.load(Path("tests/records/predict/cnn"))
    fresh = [0.09, 0.1, 0.1, 0.11, 0.12]
    cells = [{"N": n, "link_bps": 1e9, "aggregator": "rar", "aggregate_s": 0.01, "iter_s": 0.2,
              "compute_now_s": 0.1, "compute_samples": fresh} for n in (4, 8)]
    timed = {4: {"quiet_s": 0.05, "samples": [0.07, 0.075, 0.08, 0.09]}}
    df = validate.compare(m, cells, compute=timed).set_index("N")
    shared = M.iteration(m, "rar", 4, 1e9, compute_s=[0.14, 0.15, 0.16, 0.18])["compute_s"]
    assert df.loc[4, "model_compute_s"] == pytest.approx(shared)
    assert df.loc[8, "model_compute_s"] == pytest.approx(M.iteration(m, "rar", 8, 1e9, compute_s=fresh)["compute_s"])
    assert df.loc[4, "model_compute_s"] > df.loc[8, "model_compute_s"]       # 4 sharing ranks dearer than 8 alone
    plain = validate.compare(m, cells[:1]).set_index("N")
    assert plain.loc[4, "model_compute_s"] < df.loc[4, "model_compute_s"]


def test_the_validate_command_reads_the_calibrations_host_compute(monkeypatch, tmp_path):
    """``python -m gvq.predict validate`` passes ``overlap.json``'s host_compute on: the printed head names the
    N it was used at, and the cell's compute is priced from it."""
    import shutil

    from gvq.predict.__main__ import main
    folder = tmp_path / "cnn"
    shutil.copytree("tests/records/predict/cnn", folder)
    (folder / "overlap.json").write_text(json.dumps({"host_compute": {"2": {"quiet_s": 0.05, "samples": [0.2]}}}))
    monkeypatch.setattr(validate, "run_bench", lambda sub, keys, pin=False: [
        {"aggregator": "rar", "N": 2, "bandwidth_bps": 1e9, "median_s": 0.01, "iter_s": 0.2, "compute_s": 0.1}])
    monkeypatch.setattr(validate, "_compute_now", lambda cal: [0.1])
    out = tmp_path / "v.csv"
    main(["validate", "--calibration", str(folder), "aggregators=[rar]", "world_size=[2]", "bandwidth=[1e9]",
          "--out", str(out)])
    got = pd.read_csv(out)
    assert got["model_compute_s"].iloc[0] == pytest.approx(M.iteration(
        M.Calibrated.load(folder), "rar", 2, 1e9, compute_s=[0.4])["compute_s"])

