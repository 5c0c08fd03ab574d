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


def test_per_tensor_codecs_are_timed_grouped_as_their_aggregator_runs_them():
    """The payload each row reports is the one the aggregator's own codec (``codec_for`` the model's
    parameters) sends, not the ungrouped compressor's: top-k's per-tensor scope and the sign codecs'
    per-tensor scales (whose ungrouped payloads differ in size, checked here first)."""
    from gvq.aggregators.base import RunContext
    from gvq.bench.common import build_model, make_aggregator
    names = ["topk", "efsignsgd", "onebit"]
    rows = bench_main(["codecs", "model=cnn", "num_classes=10", "reps=1", f"codecs=[{','.join(names)}]"])
    params = list(build_model("cnn", 10, 1).parameters())
    whole = slice(0, sum(p.numel() for p in params))
    for r in rows:
        agg = make_aggregator(r["codec"], [])
        agg.bind(params, RunContext(0, 1))
        grouped = agg.codec_for(range(len(params))).payload_nbytes(whole)
        assert grouped != agg.compressor.payload_nbytes(whole), r["codec"]    # the check can tell them apart
        assert round(r["payload_mb"] * 1e6) == grouped, r["codec"]


def test_random_k_is_timed_drawing_its_positions_each_call_not_from_its_cache():
    """Every timed compress is its iteration's first (a fresh ``begin_vector``): its positions drawn, so
    its payload changes from call to call and it runs the draw's ops, more than a cache hit's."""
    import torch
    from gvq.bench.codecs import FirstCalls, build_codec
    from gvq.bench.opcount import count_call
    comp = build_codec("randomk", [(5000,)], torch.device("cpu"))[0]
    x, seg = torch.randn(5000), slice(0, 5000)
    calls = FirstCalls(comp, x, seg)
    assert not torch.equal(calls(), calls())
    cached = count_call(lambda: comp.compress(x, seg)).ops
    assert calls.count().ops > cached
    (row,) = bench_main(["codecs", "model=cnn", "num_classes=10", "reps=1", "codecs=[randomk]"])
    assert row["compress_ops"] == FirstCalls(comp, torch.randn(row["numel"]), slice(0, row["numel"])).count().ops
