"""python -m gvq.bench topk: top-k's selection against its floors (torch.topk, a full sort, kthvalue, DGC's
sampled threshold) and the codec at each scope, paired.  What it measures is never asserted (a benchmark,
not a timed test): the floors' selections, its keys, its records and its refusals are."""
from __future__ import annotations

import json
import math

import pytest
import torch

from gvq.bench import topk
from gvq.bench.__main__ import COMMANDS, main as bench_main
from gvq.schema.tool import compose_command
from tests.helpers.cli import refusal

FLOORS = {"torch.topk", "sort", "kthvalue", "sampled"}
CODECS = {f"codec scope={s}" for s in topk.SCOPES}


def test_its_keys_compose_with_their_defaults_and_overrides():
    cfg = compose_command(COMMANDS["topk"], ["ratios=[0.05]", "models=[cnn]", "num_classes=[10]"])
    assert (list(cfg.models), list(cfg.num_classes), list(cfg.ratios), cfg.reps) == (["cnn"], [10], [0.05], 30)
    default = compose_command(COMMANDS["topk"])
    assert list(default.models) == ["resnet32", "gpt_tiny"] and list(default.ratios) == [0.01, 0.001]


@pytest.mark.parametrize("keys", [["num_classes=[10]"], ["reps=1"], ["ratios=[]"], ["world_sizes=[1]"]])
def test_a_bad_key_is_one_line_before_anything_is_built(keys, capsys):
    assert "topk: one num_classes per model" in refusal(bench_main, ["topk", *keys], capsys)


@pytest.mark.parametrize("ratio", [0.01, 0.001])
def test_every_floor_selects_the_k_largest_magnitudes(ratio):
    """On distinct magnitudes each floor keeps exactly the k largest |v| (kthvalue's mask, the sampled
    threshold's re-selection too), so the table compares selections that do the same work."""
    v = torch.randn(20_000, generator=torch.Generator().manual_seed(1))
    k = max(1, math.floor(ratio * v.numel()))
    want = set(torch.topk(v.abs(), k).indices.tolist())
    calls = topk.timed_calls(v, [(v.numel(),)], ratio)
    for name in FLOORS:
        kind, call = calls[name]
        assert kind == "floor" and set(call().tolist()) == want, name


def test_the_sampled_threshold_lowers_itself_until_k_pass():
    """A sample that sees only the few large values sets the threshold too high: it is lowered until k
    candidates pass, then exactly the k largest are kept."""
    start = int(torch.randint(100, (1,), generator=torch.Generator().manual_seed(0)))   # its strided sample's
    v = 1e-3 * torch.rand(10_000, generator=torch.Generator().manual_seed(1))
    v[start::100] = 1 + torch.arange(100, dtype=torch.float32)       # the sample: these 100 only
    got = topk.by_sampled(v, 150, torch.Generator().manual_seed(0))
    assert got.numel() == 150 and set(got.tolist()) == set(torch.topk(v, 150).indices.tolist())


def test_the_break_even_link_is_where_selection_time_equals_the_wire_time_saved():
    """n = 1,000 fp32 values, a 100-byte payload, N = 4: the ring sends 1.5 x 4,000 = 6,000 bytes, the
    all-gather 300, saving 45,600 bits: 1 ms of selection breaks even at 45.6 Mbit/s.  Past N = 80 (1/r
    with r = 100/8000 of the bytes) the all-gather sends more than the ring: nothing is saved."""
    assert topk.breakeven_gbps(1000, 100, 1e-3, 4) == pytest.approx(0.0456)
    assert topk.breakeven_gbps(1000, 100, 2e-3, 4) == pytest.approx(0.0228)      # slower selection: lower
    assert topk.breakeven_gbps(1000, 100, 1e-3, 81) == 0.0
    rows = topk.with_breakeven([{"method": "codec scope=tensor", "numel": 1000, "ms": 1.0},
                                {"method": "sort", "numel": 1000, "ms": 1.0}], {"codec scope=tensor": 100}, [4, 81])
    assert rows[0]["gbps_at_4"] == pytest.approx(0.0456) and rows[0]["gbps_at_81"] == 0.0
    assert "gbps_at_4" not in rows[1] and rows[0]["payload_bytes"] == 100


def test_each_ratio_is_to_the_fastest_floor_paired_by_repetition():
    """The best floor has the lowest median; a method's figure is the median of its per-repetition
    ratios (2 here), not the ratio of medians (1.5), so a spell that slows one repetition cancels."""
    times = {"slow": [2.0, 4.0, 6.0], "fast": [1.0, 2.0, 3.0], "codec": [2.0, 6.0, 3.0]}
    rows = {r["method"]: r for r in topk.cell_rows("m", 1000, 0.01, {"slow": "floor", "fast": "floor",
                                                                     "codec": "codec"}, times)}
    assert {r["best_floor"] for r in rows.values()} == {"fast"} and rows["fast"]["x_best_floor"] == 1.0
    assert rows["codec"]["x_best_floor"] == 2.0 and rows["slow"]["x_best_floor"] == 2.0
    assert rows["codec"]["ms"] == 3000.0 and rows["codec"]["k"] == 10
    assert rows["codec"]["x_hi"] > 2 and not rows["codec"]["within_2x"] and rows["fast"]["within_2x"]


@pytest.mark.slow
def test_a_tiny_run_names_its_floors_and_gives_finite_paired_ratios(tmp_path, capsys):
    out = tmp_path / "t.json"
    rows = bench_main(["topk", "models=[cnn]", "num_classes=[10]", "reps=2", "ratios=[0.01,0.001]",
                       "world_sizes=[4]", "--out", str(out)])
    assert len(rows) == 2 * len(FLOORS | CODECS)
    for ratio in (0.01, 0.001):
        cell = {r["method"]: r for r in rows if r["ratio"] == ratio}
        assert set(cell) == FLOORS | CODECS
        assert {r["kind"] for r in cell.values()} == {"floor", "codec"}
        best = {r["best_floor"] for r in cell.values()}
        assert len(best) == 1 and best <= FLOORS and cell[best.pop()]["x_best_floor"] == 1.0
        for r in cell.values():
            assert r["reps"] == 2 and r["ms"] > 0 and r["k"] == max(1, math.floor(ratio * r["numel"]))
            assert all(math.isfinite(r[c]) for c in ("x_best_floor", "x_lo", "x_hi"))
            assert r["x_lo"] <= r["x_best_floor"] <= r["x_hi"] and isinstance(r["within_2x"], bool)
            if r["kind"] == "codec":
                assert r["payload_bytes"] > 0 and r["gbps_at_4"] > 0     # 1% at N = 4 saves bytes
    saved = json.loads(out.read_text())
    assert saved["rows"] == json.loads(json.dumps(rows)) and saved["threads"] == 1
    printed = capsys.readouterr()
    assert "x_best_floor" in printed.out and "codec scope=tensor" in printed.out and "gbps_at_4" in printed.out
    assert "gvq.bench topk: 2/2 cnn r=0.001" in printed.err
