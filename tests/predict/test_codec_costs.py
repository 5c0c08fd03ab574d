"""Codec costs measured on another machine (gvq/predict/codec_costs.py): the shared H100 files priced into
the cost model, the implied costs of op counts, and every misuse one line."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from gvq.predict import codec_costs as C
from gvq.predict import cost_model as M
from tests.predict.conftest import GRADIVEQ, POWERSGD

H100 = Path(__file__).resolve().parents[2] / "docs" / "gpu" / "h100-2026-11-27"
RESNET32 = 470004


def test_the_h100_files_load_as_lines_above_their_floor():
    rows = C.load_rows([H100], RESNET32)
    assert {"fp16", "qsgd", "gradiveq_pooled", "bingrad_b"} <= set(rows)
    q = rows["qsgd"]
    fixed, per = C.line(q, "compress")
    assert fixed + per * RESNET32 == pytest.approx(q["compress_ms"] / 1e3)          # the whole call, exactly
    assert fixed == pytest.approx((q["compress_ms"] - q["floor_ms"]) / 1e3)       # launches: fixed per call
    assert C.line(q, "add") is None and C.line(rows["gradiveq_pooled"], "add") is not None


def test_a_file_without_its_gradient_size_is_one_line(tmp_path):
    with pytest.raises(M.PredictError, match="codec_costs_numel"):
        C.load_rows([H100])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(M.PredictError, match="not a gvq.bench codecs --out file"):
        C.load_rows([tmp_path / "bad.json"])
    with pytest.raises(M.PredictError, match="no gvq.bench codecs JSON"):
        C.load_rows([tmp_path / "nothing"])
    with pytest.raises(M.PredictError, match="expected KEY=LABEL"):
        C.parse_map(["gradiveq_bf16"])


def test_rows_the_bench_writes_now_carry_their_size(tmp_path):
    row = {"codec": "qsgd", "numel": 1000, "compress_ms": 1.0, "decompress_ms": 0.5, "add_ms": math.nan,
           "floor_ms": 0.1}
    (tmp_path / "q.json").write_text(json.dumps({"ceilings": {}, "rows": [row]}))
    assert C.load_rows([tmp_path])["qsgd"]["numel"] == 1000


def test_implied_rows_are_ops_times_the_seconds_per_op_plus_the_floor():
    rows = C.load_rows([H100], RESNET32)
    us = C.seconds_per_op(rows, {"qsgd": (85, 49), "terngrad": (94, 60), "fp16": (7, 3)})
    assert 5 < us < 20                               # the 8-19 us per op on the H100
    implied = C.implied_rows(rows, {"qsgd": (15, 16)}, us)
    assert set(implied) == {"qsgd"}
    assert implied["qsgd"]["compress_ms"] == pytest.approx(15 * us / 1e3 + rows["qsgd"]["floor_ms"])
    assert implied["qsgd"]["compress_ms"] < rows["qsgd"]["compress_ms"] / 4


def test_the_cost_model_prices_the_codecs_it_is_given(calibrated, capsys):
    """Priced from the H100 files, the cost model charges their times (not this host's) for every call,
    keeps the aggregators asked for only, and refuses a codec with no measurement in one line."""
    m = M.Calibrated.load(calibrated)
    rows = C.load_rows([H100], RESNET32)
    priced, used = C.priced_model(m, rows, ["rar", "fp16", "qsgd"])
    assert used == {"fp16": "fp16", "qsgd": "qsgd"} and priced.aggregators == ["rar", "fp16", "qsgd"]
    numel = m.struct["numel"]
    assert M.op_cost(priced.cal["codecs"]["qsgd"]["compress"], numel, 1.0) == pytest.approx(
        C.line(rows["qsgd"], "compress")[0] + C.line(rows["qsgd"], "compress")[1] * numel)
    assert M.aggregation(priced, "rar", 4, 1e9) == M.aggregation(m, "rar", 4, 1e9)      # nothing to price
    assert M.aggregation(priced, "qsgd", 4, 1e9) != M.aggregation(m, "qsgd", 4, 1e9)
    slow = {k: {**r, "compress_ms": 50.0, "floor_ms": 0.0} for k, r in rows.items()}
    slowed = C.priced_model(m, slow, ["qsgd"])[0]
    assert M.aggregation(slowed, "qsgd", 4, 1e9) > M.aggregation(priced, "qsgd", 4, 1e9) + 0.1
    with pytest.raises(M.PredictError, match=rf"codec_map=\[{POWERSGD}-P=LABEL\]"):
        C.priced_model(m, rows, [POWERSGD])
    # a key is a setting's name (it holds '='): the label is what follows the last one
    mapped = C.priced_model(m, rows, [GRADIVEQ], C.parse_map([f"{GRADIVEQ}=gradiveq_pooled"]))[0]
    assert GRADIVEQ in mapped.aggregators


def test_the_commands_take_the_codec_costs(calibrated, tmp_path, capsys):
    from gvq.predict import __main__ as cli
    df = cli.main(["--calibration", str(calibrated), "aggregators=[rar,fp16,qsgd]", "--codec-costs",
                   str(H100), f"codec_costs_numel={RESNET32}", f"compute_scale=[{1 / 6}]"])
    assert set(df["aggregator"]) == {"rar", "fp16", "qsgd"}
    assert "codecs priced from --codec-costs (measured): fp16=fp16, qsgd=qsgd" in capsys.readouterr().out
    cli.main(["project", f"models=[{calibrated.name}]", "--calibration", str(calibrated.parent), "max_world_size=4",
              "--out", str(tmp_path), "aggregators=[rar,qsgd]", "--codec-costs", str(H100),
              f"codec_costs_numel={RESNET32}", "codec_ops_us=12"])
    assert "implied: device-path ops x 12 us + floor" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--calibration", str(calibrated), "--codec-costs", str(H100), "codec_costs_numel=470004"])
    assert re.search(f"no measurement for codec '{GRADIVEQ}'.*codec_map", capsys.readouterr().err)
