"""The cost model (gvq/predict/cost_model.py) on a real calibration: consistent with its own schedule."""
from __future__ import annotations

import numpy as np
import pytest

from gvq.predict import cost_model as M
from gvq.predict import schedule as S
from tests.predict.conftest import GRADIVEQ, POWERSGD


def test_iteration_is_compute_plus_aggregation_and_scales_apply(calibrated):
    m = M.Calibrated.load(calibrated)
    one = M.iteration(m, "qsgd", 4, 5e7)
    assert one["iter_s"] == pytest.approx(one["compute_s"] + one["measure_s"] + one["aggregate_s"])
    assert one["measure_s"] > 0 and M.iteration(m, "rar", 4, 5e7)["measure_s"] < one["measure_s"]
    gpu = M.iteration(m, "qsgd", 4, 5e7, compute_scale=1 / 6)
    assert gpu["aggregate_s"] == one["aggregate_s"] and gpu["compute_s"] < one["compute_s"]
    assert M.aggregation(m, "qsgd", 4, 5e7, codec_scale=0.1) < one["aggregate_s"]


def test_slower_links_and_more_bytes_cost_more(calibrated):
    m = M.Calibrated.load(calibrated)
    for name in m.aggregators:
        assert M.aggregation(m, name, 4, 5e6) > M.aggregation(m, name, 4, 5e8)
    # at 1 Mbit/s the wire dominates: rar (4 bytes a value) is slower than fp16 (2)
    assert M.aggregation(m, "rar", 4, 1e6) > M.aggregation(m, "fp16", 4, 1e6)


def test_unknown_world_size_or_aggregator_is_one_line(calibrated):
    m = M.Calibrated.load(calibrated)
    with pytest.raises(M.PredictError, match="N=2000 not in the calibrated structure"):
        M.aggregation(m, "rar", 2000, 1e9)
    with pytest.raises(M.PredictError, match="aggregator 'orq' not calibrated"):
        M.aggregation(m, "orq", 4, 1e9)


def test_missing_calibration_names_the_command(tmp_path, capsys):
    with pytest.raises(M.PredictError, match="python -m gvq.predict calibrate"):
        M.Calibrated.load(tmp_path)
    from gvq.predict.__main__ import main           # the command ends with that one line
    with pytest.raises(SystemExit):
        main(["--calibration", str(tmp_path)])
    assert "python -m gvq.predict calibrate" in capsys.readouterr().err


def test_cost_curves_interpolate_and_extrapolate_along_their_end_slopes():
    c = {"values": [100.0, 1000.0, 10000.0], "seconds": [1.0, 2.0, 20.0]}
    got = M.op_cost(c, [100, 550, 1000, 20000, 50], 2.0)
    assert got == pytest.approx([2.0, 3.0, 4.0, 2 * (20.0 + 10000 * 18 / 9000), 2 * (1.0 - 50 / 900)])
    assert M.op_cost([1e-5, 2e-9], [1000.0], 1.0) == pytest.approx([1e-5 + 2e-6])     # a [fixed, per] line


def test_an_iteration_waits_for_the_slowest_of_n_ranks():
    samples = list(range(101))                      # F uniform on 0..100
    assert M.slowest(samples, 1) == pytest.approx(50.0)                  # the median
    assert M.slowest(samples, 2) == pytest.approx(100 * 0.5 ** 0.5)      # P(max of 2 <= x) = F(x)^2 = 1/2
    assert M.slowest(samples, 16) == pytest.approx(100 * 0.5 ** (1 / 16))
    assert M.slowest(samples, 10**6) <= 100.0                           # never beyond the slowest sample


def test_a_fresher_median_rescales_the_calibrated_spread(calibrated):
    m = M.Calibrated.load(calibrated)
    s = m.cal["compute_samples"]
    assert len(s) >= 16 and s == sorted(s) and m.cal["compute_s"] == pytest.approx(float(np.median(s)))
    assert M.compute_time(m, 8) >= M.compute_time(m, 2) >= M.compute_time(m, 1)
    assert M.compute_time(m, 8, 2 * m.cal["compute_s"]) == pytest.approx(2 * M.compute_time(m, 8))


def test_pieces_timed_at_an_n_are_used_as_timed_and_curves_elsewhere(calibrated):
    m = M.Calibrated.load(calibrated)
    for name in (GRADIVEQ, "qsgd"):
        rnd = m.struct["aggregators"][name]["4"][0]
        costs = m.cal["codecs"][rnd["key"]]
        p = M._pieces(rnd, costs, 2.0)
        assert p.compress[p.present] == pytest.approx(2.0 * np.asarray(costs["pieces"]["4"]["compress"]))
        curve_only = M._pieces(rnd, {k: v for k, v in costs.items() if k != "pieces"}, 2.0)
        sizes = [v for seg in rnd["vals"] for v in seg]
        assert curve_only.compress[p.present] == pytest.approx(M.op_cost(costs["compress"], sizes, 2.0))
        before = M.aggregation(m, name, 4, 1e9)             # a piece slower as timed: a slower ring
        for op in costs["pieces"]["4"].values():
            op[:] = [10 * t for t in op]
        m.cache.clear()
        assert M.aggregation(m, name, 4, 1e9) > before


def _old_aggregation(m, name, n, bps, codec_scale):
    """The cost model as it priced an aggregation while it named PowerSGD to price its passes outside
    the rings: what the declaration (``Aggregator.extra_passes``) must leave unchanged."""
    link, t = S.Link(bps, 0.0, *m.cal["msg"]), np.zeros(n)
    for rnd in m.struct["aggregators"][name][str(n)]:
        t = M.replay_ring(rnd, m.cal, link, codec_scale, t)
    extra = float(M.op_cost(m.cal["vector"]["div"], m.struct["numel"], 1.0))
    if name.startswith("powersgd"):
        extra += 4 * float(M.op_cost(m.cal["vector"]["add"], m.struct["numel"], codec_scale))
    return float(t.max()) + extra


def test_passes_declared_outside_the_rings_price_every_aggregator_as_before(calibrated, tmp_path):
    """calibrate stores each aggregator's declared passes (PowerSGD's four, none elsewhere); priced from
    them, every default aggregator costs what it cost while the model named PowerSGD; a structure.json
    from before the declaration gets them from its aggregators, with the same prices."""
    import json
    import shutil
    m = M.Calibrated.load(calibrated)
    assert m.struct["passes"] == {name: 4 if name == POWERSGD else 0 for name in m.aggregators}
    for name in m.aggregators:
        for n, bps, scale in ((2, 1e8, 1.0), (4, 5e9, 0.5), (16, 1e7, 2.0)):
            assert M.aggregation(m, name, n, bps, codec_scale=scale) == pytest.approx(
                _old_aggregation(m, name, n, bps, scale), rel=1e-12), (name, n)
    shutil.copytree(calibrated, tmp_path / "old")
    struct = json.loads((tmp_path / "old" / "structure.json").read_text())
    del struct["passes"]
    (tmp_path / "old" / "structure.json").write_text(json.dumps(struct))
    assert M.Calibrated.load(tmp_path / "old").struct["passes"] == m.struct["passes"]


def test_an_aggregator_declaring_passes_outside_its_rings_is_priced_for_them(calibrated, tmp_path):
    """Not by its name: qsgd declaring two passes (as calibrate stores a declaration) costs two vector
    adds more, at the codec scale, post-backward; nothing else changes."""
    import json
    import shutil
    shutil.copytree(calibrated, tmp_path / "cnn")
    struct = json.loads((tmp_path / "cnn" / "structure.json").read_text())
    struct["passes"]["qsgd"] = 2
    (tmp_path / "cnn" / "structure.json").write_text(json.dumps(struct))
    plain, declared = M.Calibrated.load(calibrated), M.Calibrated.load(tmp_path / "cnn")
    add = float(M.op_cost(plain.cal["vector"]["add"], plain.struct["numel"], 0.5))
    assert add > 0
    assert M.aggregation(declared, "qsgd", 4, 1e9, codec_scale=0.5) == pytest.approx(
        M.aggregation(plain, "qsgd", 4, 1e9, codec_scale=0.5) + 2 * add, rel=1e-12)
    assert M.aggregation(declared, "fp16", 4, 1e9) == M.aggregation(plain, "fp16", 4, 1e9)


def test_a_calibration_whose_names_hide_a_priced_value_is_refused_in_one_line(tmp_path):
    """A calibration written while names left out the grid's ``set`` (its ``powersgd`` priced rank 6) would
    match a rank-2 setting to rank 6's costs: loading it says which names and to calibrate again."""
    import json
    import shutil

    from tests.helpers.records import RECORDS
    shutil.copytree(RECORDS / "predict" / "cnn", tmp_path / "cnn")
    M.Calibrated.load(tmp_path / "cnn")                       # rar and qsgd at their defaults: read as written
    cal = json.loads((tmp_path / "cnn" / "calibration.json").read_text())
    cal["settings"] = [*cal["settings"], "qsgd:aggregator.compressor.bits=2"]    # what it priced as 'qsgd'
    (tmp_path / "cnn" / "calibration.json").write_text(json.dumps(cal))
    with pytest.raises(M.PredictError, match=r"calibrated before names carried their values: 'qsgd' \(priced as "
                                             r"'qsgd bits=2'\); run `python -m gvq.predict calibrate` again"):
        M.Calibrated.load(tmp_path / "cnn")


def test_a_sparse_round_is_priced_on_the_sparse_rings_schedule():
    """compress + decode of the whole vector from the codec's curves, a merge per hop as a vector add over
    the segment, the write-back as one over the vector; its entries from the round's 8-byte pairs."""
    rnd = {"kind": "sparse", "key": "topk", "vals": [[600], [400]], "bytes": [[480.0], [320.0]]}
    cal = {"codecs": {"topk": {"compress": [1e-3, 1e-6], "decompress": [2e-4, 1e-7], "add": [0.0, 0.0]}},
           "vector": {"add": [1e-5, 1e-8]}}
    link = S.Link(1e6, 1e-3)
    got = M.replay_ring(rnd, cal, link, 2.0, np.zeros(2))
    codec = 2.0 * (1e-3 + 1e-6 * 1000 + 2e-4 + 1e-7 * 1000)
    merge = 2.0 * (1e-5 + 1e-8 * np.array([600.0, 400.0]))
    want = S.sparse_ring(np.array([60.0, 40.0]), np.array([600.0, 400.0]), codec, merge,
                         2.0 * (1e-5 + 1e-8 * 1000), link, np.zeros(2))
    assert got == pytest.approx(want, rel=1e-12)


def test_an_allgather_round_forwards_its_payload_n_minus_1_times_on_every_rank():
    """An allgather round is stored as one whole-vector segment (``[[numel]]``): its ranks are the clocks it
    replays from, not its segments, so N - 1 payloads cross the link (before, one segment priced no hop)."""
    rnd = {"kind": "allgather", "key": "topk", "vals": [[1000]], "bytes": [[800]]}
    cal = {"codecs": {"topk": {"compress": [1e-4, 0.0], "decompress": [2e-5, 0.0]}}, "vector": {"add": [0.0, 0.0]}}
    link = S.Link(1e9, 0.0, 1e-5, 0.0)
    for n in (4, 16):
        got = M.replay_ring(rnd, cal, link, 1.0, np.zeros(n))
        assert got == pytest.approx(S.gather_ring(800.0, 1e-4, 2e-5, 0.0, link, n))
        assert got.max() >= 1e-4 + (n - 1) * (8 * 800 / 1e9 + 1e-5) + n * 2e-5 - 1e-12
