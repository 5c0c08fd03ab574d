"""Calibration (gvq/predict/calibrate.py): the least-squares cost fit, and a real calibration's JSON."""
from __future__ import annotations

import json

import pytest

from gvq.predict.calibrate import curve, linear
from gvq.predict.structure import AGGREGATORS
from tests.predict.conftest import GRADIVEQ, POWERSGD


def test_linear_recovers_fixed_and_per_value_cost():
    fixed, per = linear([(n, 2e-5 + 3e-9 * n) for n in (100, 1000, 10000, 100000)])
    assert fixed == pytest.approx(2e-5) and per == pytest.approx(3e-9)


def test_linear_never_returns_a_negative_fixed_cost():
    fixed, per = linear([(100, 0.0), (1000, 1e-5), (2000, 2.2e-5)])
    assert fixed == 0.0 and per > 0


def test_a_calibrated_setting_is_named_by_the_values_the_grids_set_gave_it():
    """``calibrate aggregators=[rar,fp16,qsgd,powersgd]`` prices PowerSGD at the calibration grid's rank 6:
    it is stored and printed as ``powersgd rank=6`` (it was ``powersgd``, which a rank-2 run's report also
    says); an entry restating its option's default is named by the option, and is the option's setting."""
    from gvq.predict.structure import entries
    assert entries(["rar", "fp16", "qsgd", "powersgd"]) == {"rar": "rar", "fp16": "fp16", "qsgd": "qsgd",
                                                             POWERSGD: "powersgd"}
    assert entries(["powersgd:rank=2", "gradiveq_bf16"]) == {"powersgd": "powersgd:rank=2", GRADIVEQ: "gradiveq_bf16"}
    with pytest.raises(ValueError, match="the same setting as qsgd"):
        entries(["qsgd", "qsgd:compressor.bits=4"])


def test_a_calibration_holds_every_cost_the_model_reads(calibrated):
    cal = json.loads((calibrated / "calibration.json").read_text())
    assert cal["model"] == "cnn" and 0 < cal["compute_s"] < 5 and cal["cache"] == "cold"
    assert 0 < cal["msg"][0] < 0.05 and cal["msg"][1] >= 0
    assert set(cal["vector"]) == {"add", "div", "finite"}
    assert cal["entries"] == {"rar": "rar", "fp16": "fp16", "qsgd": "qsgd", GRADIVEQ: "gradiveq_bf16",
                              POWERSGD: "powersgd"}
    assert set(cal["codecs"]) == {"fp16", "qsgd", GRADIVEQ, f"{POWERSGD}-P", f"{POWERSGD}-Q"}
    for key, ops in cal["codecs"].items():
        hop = key in ("fp16", "qsgd")                                  # re-encode rings: no payload add
        assert set(ops) == {"compress", "decompress", "hop" if hop else "add", "pieces"}, key
        for c in (c for op, c in ops.items() if op != "pieces"):
            assert c["values"] == sorted(c["values"]) and len(c["values"]) >= 2
            assert all(t >= 0 for t in c["seconds"])
    qsgd = cal["codecs"]["qsgd"]["compress"]
    assert qsgd["seconds"][-1] > qsgd["seconds"][0]                   # a bigger piece costs more
    assert set(cal["measure"]) == set(cal["entries"]) and cal["measure"]["qsgd"] > cal["measure"]["rar"]
    struct = json.loads((calibrated / "structure.json").read_text())
    assert list(struct["aggregators"]) == list(cal["entries"]) and list(cal["entries"].values()) == list(AGGREGATORS)
    assert struct["passes"] == {name: 4 if name == POWERSGD else 0 for name in cal["entries"]}   # extra_passes
    for name, per_n in struct["aggregators"].items():         # small N: every piece timed, in ring order
        for rnd in (r for r in per_n["4"] if r["kind"] != "plain"):
            timed = cal["codecs"][rnd["key"]]["pieces"]["4"]
            assert set(timed) == set(cal["codecs"][rnd["key"]]) - {"pieces"}
            assert all(len(v) == sum(map(len, rnd["vals"])) for v in timed.values()), name


def test_curve_is_the_median_per_size_bin_in_size_order():
    c = curve([(1000, 3.0), (10, 1.0), (1050, 5.0), (1000, 4.0), (10, 2.0), (10, 9.0)])
    assert c == {"values": [10.0, 1000.0], "seconds": [2.0, 4.0]}      # 1000 and 1050: one bin
    assert curve([(100, 1.0), (120, 2.0)])["values"] == [100.0, 120.0]   # 20% apart: two


def test_settings_are_calibrated_under_their_names_each_with_its_own_rings(calibrated_settings):
    """``calibrate --aggregators qsgd:compressor.bits=2``: keyed ``qsgd bits=2`` (the report's name for the
    runs of that setting) beside the family default, its own payloads (2-bit codes, fewer bytes than 4-bit)
    and codec costs; the rings check rebuilds each entry at its setting (no stored ring differs)."""
    from gvq.predict.structure import stale_rings
    cal = json.loads((calibrated_settings / "calibration.json").read_text())
    struct = json.loads((calibrated_settings / "structure.json").read_text())
    assert cal["entries"] == {"fp16": "fp16", "qsgd": "qsgd", "qsgd bits=2": "qsgd:compressor.bits=2"}
    assert list(struct["aggregators"]) == list(cal["entries"]) and set(cal["measure"]) == set(cal["entries"])
    assert {"qsgd", "qsgd bits=2"} <= set(cal["codecs"])
    sent = {name: sum(sum(b) for r in struct["aggregators"][name]["4"] for b in r["bytes"])
            for name in ("qsgd", "qsgd bits=2", "fp16")}
    assert sent["qsgd bits=2"] < sent["qsgd"] < sent["fp16"]
    assert stale_rings(calibrated_settings)[1] == []
    overlap = json.loads((calibrated_settings / "overlap.json").read_text())
    assert set(overlap["buckets"]) == set(cal["entries"])
    # --input-shape: timed, profiled and priced on those inputs (3 channels: a larger first layer)
    from gvq.bench.common import build_model
    from tests.predict.conftest import SETTING_SHAPE
    numel = sum(p.numel() for p in build_model("cnn", 10, SETTING_SHAPE[0]).parameters())
    assert cal["input_shape"] == list(SETTING_SHAPE) and struct["numel"] == numel
    assert sum(overlap["profile"]["nbytes"]) == 4 * numel


def test_settings_of_one_name_or_malformed_are_refused_in_one_line(capsys):
    from gvq.predict.__main__ import main
    from gvq.predict.structure import entries
    assert entries(["qsgd", "qsgd:compressor.bits=2,compressor.bucket=64"]) == {
        "qsgd": "qsgd", "qsgd bits=2 bucket=64": "qsgd:compressor.bits=2,compressor.bucket=64"}
    with pytest.raises(ValueError, match="the same setting as qsgd:compressor.bits=2"):
        entries(["qsgd:compressor.bits=2", "qsgd:compressor.bits=2"])
    for bad in (["qsgd:"], ["qsgd:compressor.bits=2", "qsgd:compressor.bits=2"]):
        with pytest.raises(SystemExit):
            main(["calibrate", "aggregators=[" + ",".join(f"'{b}'" for b in bad) + "]"])
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("gvq.predict: error: aggregators")


def test_a_reencode_rings_hop_is_priced_through_the_codecs_own_reencode_sum():
    """The calibrated hop is the call the ring makes (Compressor.reencode_sum), so a codec that fuses
    decode + add + encode is priced by its fused path, not by three separate calls."""
    import contextlib

    import torch

    from gvq.compressors.qsgd import QSGD
    from gvq.predict.calibrate import Evict, one_rank_ring

    calls = []

    class Counting(QSGD):
        def reencode_sum(self, payload, local, seg, *args, **kwargs):
            calls.append(seg)
            return super().reencode_sum(payload, local, seg, *args, **kwargs)

    comp = Counting(bits=4, bucket=64, kernels="torch")
    flat, pieces = torch.randn(512), [slice(0, 256), slice(256, 512)]
    got = one_rank_ring(comp, flat, pieces, lambda f: contextlib.nullcontext(), True, Evict(False))
    assert calls == pieces
    assert [n for n, _ in got["hop"]] == [256, 256]


def test_a_calibration_has_the_fields_the_flags_version_wrote(calibrated):
    """tests/records/predict/cnn is ``calibrate --model cnn --num-classes 10 --aggregators rar qsgd`` as the
    flags' version wrote it (1615f19^, before issue 62 typed its keys): today's calibration has the same
    fields, each of the same type, at every level the model reads (its values are this host's timings)."""
    from tests.helpers.records import RECORDS
    for name in ("calibration.json", "structure.json"):
        now = json.loads((calibrated / name).read_text())
        before = json.loads((RECORDS / "predict" / "cnn" / name).read_text())
        assert list(now) == list(before), name
        assert {k: type(v).__name__ for k, v in now.items()} == {k: type(v).__name__ for k, v in before.items()}
    cal = json.loads((calibrated / "calibration.json").read_text())
    old = json.loads((RECORDS / "predict" / "cnn" / "calibration.json").read_text())
    assert set(cal["codecs"]["qsgd"]) == set(old["codecs"]["qsgd"]) and set(cal["vector"]) == set(old["vector"])
    assert (cal["version"], cal["model"], cal["batch_size"], cal["num_classes"], cal["cache"]) == \
        (old["version"], old["model"], old["batch_size"], old["num_classes"], old["cache"])
