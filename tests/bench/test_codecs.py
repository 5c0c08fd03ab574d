"""python -m gvq.bench codecs: per-call codec times beside a floor from ceilings measured in the run."""
from __future__ import annotations

import json
import math

import pytest

from gvq.bench.__main__ import main as bench_main

pytestmark = pytest.mark.slow          # every test here starts processes (make test-fast skips them)


def test_codecs_rows_carry_times_floor_ratio_and_ops(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GVQ_FUSED", "0")             # the device path's ops, counted on the host
    out = tmp_path / "not" / "yet" / "c.json"      # --out's folder is made, not a late FileNotFoundError
    rows = bench_main(["codecs", "model=cnn", "num_classes=10", "reps=1", "codecs=[qsgd,gradiveq_pooled_bf16,powersgd]",
                       "--out", str(out)])
    by = {r["codec"]: r for r in rows}
    assert set(by) == {"qsgd", "gradiveq_pooled_bf16", "powersgd"}
    for r in rows:
        assert r["compress_ms"] > 0 and r["decompress_ms"] > 0 and r["floor_ms"] > 0
        assert r["x_floor"] == pytest.approx(r["compress_ms"] / r["floor_ms"])
    assert math.isnan(by["qsgd"]["add_ms"]) and by["powersgd"]["add_ms"] > 0   # additive codecs only
    assert by["gradiveq_pooled_bf16"]["fit_s"] > 0 and math.isnan(by["qsgd"]["fit_s"])   # GradiVeQ's refit
    assert by["gradiveq_pooled_bf16"]["dtype"] == "bfloat16"                    # the override applied
    saved = json.loads(out.read_text())
    assert set(saved["ceilings"]) == {"gemm_gflops_float32", "gemm_gflops_bfloat16", "mem_gbps"}
    printed = capsys.readouterr().out
    assert "floor of compress from gemm_gflops_float32" in printed and "compress_ops" in printed
    for r in rows:                                     # the GPU cost proxy beside the times
        assert r["compress_ops"] > 0 and r["decompress_ops"] > 0 and r["compress_syncs"] >= 0
