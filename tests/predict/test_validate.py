"""Validation table (gvq/predict/validate.py): ratios and the summary line, on given measurements."""
from __future__ import annotations

import argparse
import json

import pandas as pd
import pytest

from gvq.predict import cost_model as M
from gvq.predict import validate


def test_compare_divides_model_by_measurement_and_summary_counts_bands(calibrated):
    m = M.Calibrated.load(calibrated)
    truth = M.iteration(m, "rar", 2, 5e7)
    measured = [{"N": 2, "link_bps": 5e7, "aggregator": "rar", "aggregate_s": truth["aggregate_s"],
                 "iter_s": truth["iter_s"] * 2}]
    df = validate.compare(m, measured)
    assert df["agg_ratio"].iloc[0] == pytest.approx(1.0) and df["iter_ratio"].iloc[0] == pytest.approx(0.5)
    assert validate.summary(df).startswith("2 cells: 1 within 10% (50%), 1 beyond 25%")


def test_fresh_compute_samples_replace_the_calibrated_ones(calibrated):
    m = M.Calibrated.load(calibrated)
    base = M.iteration(m, "qsgd", 4, 2e8)
    fresh = [1.0, 1.1, 1.2, 1.3, 1.4]
    cell = {"N": 4, "link_bps": 2e8, "aggregator": "qsgd", "aggregate_s": 1.0, "iter_s": 1.0,
            "compute_now_s": 1.2, "compute_samples": fresh}
    df = validate.compare(m, [cell])
    slowest_of_4 = 1.0 + 0.4 * 0.5 ** 0.25                # F's 0.84 quantile, linear between samples
    assert df["model_compute_s"].iloc[0] == pytest.approx(base["compute_s"] - M.slowest(m.cal["compute_samples"], 4)
                                                          + slowest_of_4)
    assert df["model_aggregate_s"].iloc[0] == pytest.approx(base["aggregate_s"])
    assert "compute_samples" not in df.columns           # the table keeps the median, not the samples


def test_compute_is_re_timed_on_one_thread(calibrated, monkeypatch):
    import torch
    seen = []
    monkeypatch.setattr("gvq.predict.calibrate.compute", lambda *a, **k: seen.append(torch.get_num_threads()) or [0.5])
    before = torch.get_num_threads()
    m = M.Calibrated.load(calibrated)
    assert validate._compute_now(m.cal) == [0.5] and seen == [1] and torch.get_num_threads() == before


class _ScriptedModel:
    """Stands for :class:`gvq.predict.overlap.Overlap`: fixed predictions, the phases it was given kept."""
    m = type("M", (), {"aggregators": ["rar", "fp16"]})()

    def __init__(self):
        self.seen = []

    def post_iteration(self, name, n, bps, alpha, codec, compute, phases=None, host=False):
        self.seen.append(("post", name, n, bps, phases, host))
        return {"iter_s": 1.0, "aggregate_s": 0.5, "exposed_s": 0.5}

    def iteration(self, name, n, bps, alpha, codec, compute, cap="default", shared=True, phases=None, host=False):
        self.seen.append((cap, name, n, bps, phases, host))
        return {"iter_s": 2.0, "aggregate_s": 0.1, "exposed_s": 0.2}


def _record(agg, variant, iter_s):
    cap = float(variant.split("@")[1].removesuffix("MB")) if "@" in variant else None     # the bench's fields
    return {"N": 8, "link_Mbps": 50.0, "compute_scale": 1.0, "aggregator": agg, "variant": variant,
            "overlapped": variant != "post", "bucket_mb": cap,
            "iter_s": iter_s, "aggregate_s": 0.4, "exposed_s": 0.3, "alone_s": 0.9, "compute_s": 0.8,
            "backward_s": 0.5}


def test_overlap_validation_pairs_each_mode_with_its_prediction():
    bench = {"setting": {"codec_scale": 1.0}, "modes": [
        _record("rar", "post", 1.05), _record("rar", "overlap", 2.5), _record("fp16", "overlap@0.25MB", 1.9),
        _record("powersgd", "post", 1.0)]}                      # not calibrated: left out
    model = _ScriptedModel()
    df = validate.overlap_rows(model, bench)
    assert list(df["aggregator"]) == ["rar", "rar", "fp16"]
    assert df["iter_ratio"].tolist() == pytest.approx([1.0 / 1.05, 2.0 / 2.5, 2.0 / 1.9])
    assert [s[0] for s in model.seen] == ["post", "default", "0.25"]
    assert model.seen[0][3] == 5e7
    assert all(s[5] for s in model.seen)                       # the benchmark's ranks shared this host
    ph = model.seen[0][4]                                       # the record's own compute-alone figures
    assert (ph.forward, ph.backward, ph.step) == pytest.approx((0.3, 0.5, 0.1))
    text = validate.overlap_summary(df)
    assert text.startswith("3 (cell, aggregator, mode): 2 within 10% (67%), 0 beyond 25%")
    assert "worst: rar overlap at N=8, 50 Mbit/s" in text and "ratio 0.80" in text
    assert "inside the measured" not in text                   # these records carry no interval
    other = {"setting": {"codec_scale": 1.0, "defaults": {"rar": "rar", "fp16": "fp16"}},
             "modes": [{**_record("fp16", "post", 1.0), "setting": "fp16"},
                       {**_record("fp16", "post", 3.0), "setting": "fp16 some_knob=2"}]}
    # the calibration is of each family's default setting: another setting of the family is not compared
    assert validate.overlap_rows(_ScriptedModel(), other)["iter_s"].tolist() == [1.0]
    # ... unless the calibration holds that setting under its name (calibrate --aggregators OPTION:KEY=VALUE)
    with_setting = _ScriptedModel()
    with_setting.m = type("M", (), {"aggregators": ["rar", "fp16", "fp16 some_knob=2"]})()
    df = validate.overlap_rows(with_setting, other)
    assert df["iter_s"].tolist() == [1.0, 3.0] and df["aggregator"].tolist() == ["fp16", "fp16 some_knob=2"]
    assert [s[1] for s in with_setting.seen] == ["fp16", "fp16 some_knob=2"]      # each priced as itself
    bench["modes"][0].update(iter_lo_s=1.01, iter_hi_s=1.10)   # the model's 1.0 s falls below it
    bench["modes"][1].update(iter_lo_s=1.9, iter_hi_s=2.6)     # 2.0 s inside
    df = validate.overlap_rows(_ScriptedModel(), bench)
    assert df["in_interval"].tolist() == [False, True, None]
    assert validate.overlap_summary(df).endswith("; 1 of 2 inside the measured 95% interval")


def test_overlap_validation_never_prices_a_setting_at_anothers_costs(capsys):
    """``gvq.bench overlap`` times PowerSGD at its grid's rank 4 (``powersgd rank=4``), a calibration of the
    default settings priced rank 6 (``powersgd rank=6``): the record is left out, said in one line naming
    both.  It was paired with rank 6's costs (the calibration named them ``powersgd``, the record was its
    family's default): validate-overlap's worst cell."""
    from gvq.bench import overlap
    from gvq.predict.structure import AGGREGATORS, entries
    specs = overlap.cell_specs([5e7], ["rar", "powersgd"], 0.25, kinds=["post"])
    modes = [{**_record(s.option, "post", 1.0), "setting": s.setting} for s in specs[1:]]
    bench = {"setting": {"codec_scale": 1.0, "defaults": {s.option: s.setting for s in specs[1:]}}, "modes": modes}
    model = _ScriptedModel()
    model.m = type("M", (), {"aggregators": list(entries(AGGREGATORS))})()
    df = validate.overlap_rows(model, bench)
    assert list(df["aggregator"]) == ["rar"] and [s[1] for s in model.seen] == ["rar"]
    assert "validate-overlap: left out: powersgd rank=4: not calibrated (the calibration priced powersgd " \
           "rank=6)" in capsys.readouterr().out


def test_overlap_validation_reads_several_files_and_refuses_another_jobs(tmp_path, monkeypatch, capsys):
    model = _ScriptedModel()
    model.m = type("M", (), {"aggregators": ["rar", "fp16"], "cal": {"model": "resnet32", "batch_size": 32,
                                                                      "num_classes": 100, "settings": []}})()
    monkeypatch.setattr("gvq.predict.overlap.Overlap.load", lambda folder: model)
    setting = {"model": "resnet32", "batch_per_rank": 32, "num_classes": 100, "set": [], "codec_scale": 1.0}
    files = []
    for i, agg in enumerate(("rar", "fp16")):            # e.g. one spawn per aggregator at N = 32
        files.append(tmp_path / f"n32_{agg}.json")
        files[-1].write_text(json.dumps({"setting": setting, "modes": [_record(agg, "post", 1.0 + i)]}))
    args = argparse.Namespace(overlap_phases="bench", overlap_msg="host", comm_core="shared", out=tmp_path / "v.csv")
    df = validate.report_overlap_validation(tmp_path, files, args)
    assert list(df["aggregator"]) == ["rar", "fp16"] and df["iter_ratio"].tolist() == pytest.approx([1.0, 0.5])
    assert "2 (cell, aggregator, mode): 1 within 10%" in capsys.readouterr().out
    assert len(pd.read_csv(tmp_path / "v.csv")) == 2
    other = tmp_path / "cnn.json"
    other.write_text(json.dumps({"setting": {**setting, "model": "cnn"}, "modes": []}))
    with pytest.raises(ValueError, match="cnn.json: measured on cnn, batch 32, 100 classes, inputs .1, 8, 8.; the "
                                         "calibration is resnet32"):
        validate.report_overlap_validation(tmp_path, [files[0], other], args)
    # the same model on other inputs (Fashion-MNIST's against the calibration's CIFAR default) is another job
    fmnist = tmp_path / "fmnist.json"
    fmnist.write_text(json.dumps({"setting": {**setting, "input_shape": [1, 28, 28]}, "modes": []}))
    with pytest.raises(ValueError, match=r"inputs \(1, 28, 28\); the calibration is resnet32, batch 32, 100 "
                                         r"classes, inputs \(3, 32, 32\)"):
        validate.report_overlap_validation(tmp_path, [fmnist], args)


def test_validation_by_the_post_backward_benchmarks_refuses_a_setting_in_one_line():
    """gvq.bench aggregate / train take options, not settings: a calibrated ``qsgd bits=2`` would be
    measured as 4-bit QSGD and compared with 2-bit's model, so validate names it and says what to use."""
    from gvq.predict import cost_model as M
    m = type("M", (), {"cal": {"entries": {"qsgd": "qsgd", "qsgd bits=2": "qsgd:compressor.bits=2"}},
                       "struct": {"aggregators": {"qsgd": {}, "qsgd bits=2": {}}},
                       "aggregators": ["qsgd", "qsgd bits=2"]})()
    args = argparse.Namespace(aggregators=None)
    with pytest.raises(M.PredictError, match="validate: 'qsgd bits=2': settings, which the benchmarks it runs do "
                                             "not take; validate them with validate-overlap --bench BENCH_JSON"):
        validate.report_validation(m, args)


def _scripted_benches(monkeypatch, seen: list, **row):
    """``run_bench`` replaced: each command's keys composed against its schema (kept in ``seen`` as
    (command, config)), and one row per (N, link, setting) it was asked for, with ``row``'s figures."""
    from gvq.bench.__main__ import COMMANDS
    from gvq.schema.tool import compose_command

    def bench(sub, keys, pin=False):
        cfg = compose_command(COMMANDS[sub], keys)
        seen.append((sub, cfg))
        return [{"aggregator": a, "N": n, "bandwidth_bps": b, **row}
                for n in cfg.grid.world_sizes for b in cfg.grid.links_bps for a in cfg.grid.settings]
    monkeypatch.setattr(validate, "run_bench", bench)
    monkeypatch.setattr(validate, "_compute_now", lambda cal: [row["compute_s"]])


def test_the_benchmarks_validation_runs_are_given_the_calibrations_workload_as_keys(monkeypatch):
    """``measure`` runs ``gvq.bench aggregate`` and ``train`` as subprocesses: the keys it passes compose
    against each command's schema (so a renamed key fails here, not hours into a validation) and carry the
    calibration's model, batch, input, settings, world sizes and links, on the virtual clock."""
    from types import SimpleNamespace

    from gvq.predict.structure import SETTINGS
    seen = []
    _scripted_benches(monkeypatch, seen, median_s=1.0, iter_s=2.0, compute_s=0.5)
    cal = {"model": "cnn", "num_classes": 10, "batch_size": 16, "input_shape": [1, 28, 28],
           "entries": {"rar": "rar", "qsgd": "qsgd", "powersgd rank=6": "powersgd"}}
    rows = validate.measure(SimpleNamespace(cal=cal, struct={}), ["rar", "powersgd rank=6"], [2, 4], [5e7, 1e9],
                            reps=3, iters=5)
    assert len(rows) == 2 * 2 * 2 and all(r["iter_s"] == 2.0 and r["aggregate_s"] == 1.0 for r in rows)
    # the benches time options (PowerSGD at the set's rank 6): each row under the name calibrate gave it
    assert {r["aggregator"] for r in rows} == {"rar", "powersgd rank=6"}
    for _, cfg in seen:
        assert (cfg.model, cfg.num_classes, cfg.net.clock.name, cfg.timeout) == ("cnn", 10, "virtual", 900)
        assert (list(cfg.grid.settings), list(cfg.grid.set)) == (["rar", "powersgd"], list(SETTINGS))
    aggregate = [cfg for sub, cfg in seen if sub == "aggregate"]
    train = [cfg for sub, cfg in seen if sub == "train"]
    assert [list(c.grid.world_sizes) for c in aggregate] == [[2], [4]] and aggregate[0].reps == 3
    assert [list(c.grid.links_bps) for c in train] == [[5e7], [1e9]]
    assert (train[0].batch_size, list(train[0].input_shape), train[0].iters, train[0].compressed_only) == \
        (16, [1, 28, 28], 5, True)


def test_a_two_level_validation_runs_hierarchical_rings_on_the_nodes_and_prices_them_so(monkeypatch):
    """``ranks_per_node=2``: ``bench aggregate`` and ``bench train`` compose with their ranks on nodes of 2
    (the intra links given) and every ring ``topology=hierarchical``; the model's figures, aggregation and
    whole iterations, are the two-level ones; a world the nodes do not fill is refused before any
    benchmark runs."""
    from pathlib import Path

    from gvq.comm.links import Cluster
    seen = []
    _scripted_benches(monkeypatch, seen, median_s=0.01, iter_s=0.2, compute_s=0.1)
    m = M.Calibrated.load(Path("tests/records/predict/cnn"))
    args = argparse.Namespace(aggregators=["rar", "qsgd"], world_size=[4], bandwidth=[1e9], reps=2, iters=3,
                              ranks_per_node=2, intra_bandwidth=2.4e12, intra_latency=1e-6, out=None)
    df = validate.report_validation(m, args).set_index("aggregator")
    assert [sub for sub, _ in seen] == ["aggregate", "train"]
    for _, cfg in seen:
        assert (cfg.net.ranks_per_node, cfg.net.intra_bandwidth_bps, cfg.net.intra_latency_s) == (2, 2.4e12, 1e-6)
        assert list(cfg.grid.set)[-2:] == [f"{a}:aggregator.topology=hierarchical" for a in ("rar", "qsgd")]
        assert cfg.net.clock.name == "virtual"
    cluster = Cluster(2, 2.4e12, 1e-6)
    two = {a: M.iteration(m, a, 4, 1e9, compute_s=[0.1], cluster=cluster) for a in ("rar", "qsgd")}
    assert df["model_aggregate_s"].to_dict() == pytest.approx({a: t["aggregate_s"] for a, t in two.items()})
    assert two["rar"]["aggregate_s"] != pytest.approx(M.iteration(m, "rar", 4, 1e9)["aggregate_s"])   # not flat
    assert df["agg_ratio"].to_dict() == pytest.approx({a: t["aggregate_s"] / 0.01 for a, t in two.items()})
    assert df["iter_ratio"].to_dict() == pytest.approx({a: t["iter_s"] / 0.2 for a, t in two.items()})
    seen.clear()
    with pytest.raises(M.PredictError, match="gvq.predict: ranks_per_node=2: must divide world_size=3"):
        validate.report_validation(m, argparse.Namespace(**{**vars(args), "world_size": [4, 3]}))
    assert seen == []


def test_a_two_level_validation_runs_qgz_as_it_is_beside_hierarchical_rings(monkeypatch, records_with_qgz):
    """qgZ has no topology: ``bench aggregate`` runs it as its option file says (its all-to-alls on the same
    nodes), the rings beside it hierarchical; the model's figure is its two-level price."""
    from gvq.comm.links import Cluster
    seen = []
    _scripted_benches(monkeypatch, seen, median_s=0.01, iter_s=0.2, compute_s=0.1)
    m = records_with_qgz
    args = argparse.Namespace(aggregators=["qsgd", "qgz"], world_size=[4], bandwidth=[1e9], reps=2, iters=3,
                              ranks_per_node=2, intra_bandwidth=2.4e12, intra_latency=0.0, out=None)
    df = validate.report_validation(m, args)
    for _, cfg in seen:                                # bench aggregate, then bench train
        assert list(cfg.grid.set)[-1] == "qsgd:aggregator.topology=hierarchical"
        assert list(cfg.grid.settings) == ["qsgd", "qgz"]
    want = M.iteration(m, "qgz", 4, 1e9, cluster=Cluster(2, 2.4e12))["aggregate_s"]
    assert df.set_index("aggregator").loc["qgz", "model_aggregate_s"] == pytest.approx(want)


def test_a_two_level_validation_prices_messages_as_n_ranks_on_this_host_pay_them(monkeypatch, tmp_path):
    """``calibrate-overlap host_ranks=[4] host_ranks_per_node=[1,2]`` timed messages at N = 4 on flat rings and
    on nodes of 2: on nodes of 2 the model's figure at N = 4 is the two-level one at the hierarchical rings'
    cost (read from ``overlap.json``), never the flat rings'; an N it did not time keeps the calibration's."""
    from pathlib import Path

    from gvq.comm.links import Cluster
    _scripted_benches(monkeypatch, [], median_s=0.01, iter_s=0.2, compute_s=0.1)
    (tmp_path / "overlap.json").write_text(json.dumps({"host_msg": {"4": [9e-4, 0.0]},
                                                       "host_msg_nodes": {"2": {"4": [5e-4, 0.0]}}}))
    host = validate.host_msg(tmp_path, 2)
    assert host == {4: (5e-4, 0.0)} and validate.host_msg(tmp_path) == {4: (9e-4, 0.0)}
    assert validate.host_msg(tmp_path, 4) == {} and validate.host_msg(tmp_path / "none", 2) == {}
    m = M.Calibrated.load(Path("tests/records/predict/cnn"))
    args = argparse.Namespace(aggregators=["rar"], world_size=[4, 8], bandwidth=[1e9], reps=2, iters=3,
                              ranks_per_node=2, intra_bandwidth=2.4e12, intra_latency=0.0, out=None)
    got = validate.report_validation(m, args, host).set_index("N")["model_aggregate_s"]
    cluster = Cluster(2, 2.4e12)
    assert got[4] == pytest.approx(M.aggregation(m, "rar", 4, 1e9, msg=(5e-4, 0.0), cluster=cluster))
    assert got[4] > M.aggregation(m, "rar", 4, 1e9, cluster=cluster)
    assert got[8] == pytest.approx(M.aggregation(m, "rar", 8, 1e9, cluster=cluster))
