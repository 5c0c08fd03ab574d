"""gvq/report/tta.py: time to accuracy composed from runs' iterations per phase and a bench's seconds per
iteration per cell; the winner per cell, the gain over overlapped fp16, the end-to-end validation and the
refusal of runs measured on another setting.  Runs and bench JSON are written here, small and exact."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from gvq.report import tta
from gvq.report.__main__ import main
from gvq.report.runs import ReportError, load_run

SETTING = {"model": "resnet20", "input_shape": [1, 28, 28], "batch_per_rank": 16, "num_classes": 10,
           "set": ["L_t=50"], "defaults": {"qsgd": "qsgd"}, "iters": 3, "warmup": 1,
           "codec_scale": 1.0, "clock": "virtual"}
#: seconds per iteration at N = 4, 200 Mbit/s, compute x1, per (option, variant)
SECS = {("rar", "post"): 0.5, ("rar", "overlap"): 0.4, ("qsgd", "post"): 0.2, ("qsgd", "overlap"): 0.25,
        ("gradiveq", "post"): 0.1, ("gradiveq", "overlap"): 0.12, ("fp16", "post"): 0.3,
        ("fp16", "overlap"): 0.28, ("powersgd", "post"): 0.15, ("powersgd", "overlap"): 0.16}


def _bench(path: Path, secs=SECS) -> Path:
    modes = [{"N": 4, "compute_scale": 1.0, "link_Mbps": 200.0, "aggregator": a.split(" ")[0], "setting": a,
              "variant": v, "iter_s": s}
             for (a, v), s in secs.items()]
    path.write_text(json.dumps({"setting": SETTING, "modes": modes, "cells": []}))
    return path


def _run(root: Path, name: str, agg: str, phases: list[str], accs: dict[int, float], seed=0, overlap=False,
         net=None, rank=4, step_s=None, batch=16, status="completed", knobs=None, overrides=()) -> Path:
    """A finished run dir: one row per iteration (its phase), test accuracy at the iterations in ``accs``."""
    d = root / name
    d.mkdir(parents=True)
    config = {"world_size": 4, "seed": seed, "batch_size": batch, "L_t": 50,
              "aggregator": {"overlap": overlap, "rank": rank, **(knobs or {})}, "net": net or {"clock": "wall"}}
    (d / "summary.json").write_text(json.dumps({"status": status, "config": config, "job_type": agg,
                                                "overrides": [f"aggregator={agg}", *overrides, f"seed={seed}"]}))
    with open(d / "metrics.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["iteration", "phase", "compute_s", "aggregate_s", "wall_s", "test_acc"])
        for i, ph in enumerate(phases):
            c, a = step_s(ph) if step_s else (0.01, 0.01)
            w.writerow([i, ph, c, a, i, accs.get(i, "")])
    return d


def test_each_phase_is_priced_at_its_own_option_in_each_variant(tmp_path):
    run = load_run(_run(tmp_path, "g", "gradiveq", ["warmup"] * 2 + ["sample"] * 3 + ["compress"] * 7,
                        {4: 0.5, 9: 0.81, 11: 0.85}))
    counts = tta.phase_counts(run, 0.8)
    assert counts == {"warmup": 2, "sample": 3, "compress": 5}            # up to the first eval >= 0.8
    secs = tta.bench_seconds(json.loads(_bench(tmp_path / "b.json").read_text()))
    cell = (4, 1.0, 200.0)
    assert tta.priced(counts, "gradiveq", "post", cell, secs) == pytest.approx(2 * 0.5 + 3 * 0.2 + 5 * 0.1)
    assert tta.priced(counts, "gradiveq", "overlap", cell, secs) == pytest.approx(2 * .4 + 3 * .25 + 5 * .12)
    with pytest.raises(ReportError, match="no seconds for gradiveq_pooled"):
        tta.priced(counts, "gradiveq_pooled", "post", cell, secs)
    assert tta.phase_counts(run, 0.9) is None                            # never reached


def test_gradiveqs_schedule_knobs_price_each_phase_as_it_was_summed(tmp_path):
    """warmup_by=qsgd: the warm-up at QSGD's seconds; samples_in_warmup: the first L_t samples as the
    warm-up sums them, later ones at the sampling option's."""
    secs = tta.bench_seconds(json.loads(_bench(tmp_path / "b.json").read_text()))
    cell = (4, 1.0, 200.0)
    phases = ["warmup"] * 2 + ["sample"] * 3 + ["compress"] * 5 + ["sample"] * 2 + ["compress"] * 2
    knobs = {"warmup_by": "qsgd", "sampling": "rar", "samples_in_warmup": True, "L_t": 3}
    run = load_run(_run(tmp_path, "k", "gradiveq", phases, {13: 0.9}, knobs=knobs))
    counts = tta.phase_counts(run, 0.8)
    assert counts == {"warmup": 2, "sample_in_warmup": 3, "compress": 7, "sample": 2}
    got = tta.priced(counts, "gradiveq", "post", cell, secs, tta.phase_options(run))
    assert got == pytest.approx((2 + 3) * 0.2 + 7 * 0.1 + 2 * 0.5)       # qsgd, qsgd, gradiveq, rar
    plain = load_run(_run(tmp_path, "p", "gradiveq", phases, {13: 0.9}))      # the defaults: the paper's
    assert tta.phase_options(plain)["warmup"] == "rar" and tta.phase_options(plain)["sample"] == "qsgd"
    assert "sample_in_warmup" not in tta.phase_counts(plain, 0.8)


def test_winner_gain_over_overlapped_fp16_and_seed_spread(tmp_path):
    bench = json.loads(_bench(tmp_path / "b.json").read_text())
    runs = [load_run(_run(tmp_path, f"fp16_{s}", "fp16", ["fp16"] * 20, {9: 0.85}, seed=s)) for s in (0, 1)]
    runs += [load_run(_run(tmp_path, f"qsgd_{s}", "qsgd", ["qsgd"] * 20, {it: 0.85}, seed=s))
             for s, it in ((0, 9), (1, 14))]
    runs.append(load_run(_run(tmp_path, "rar_0", "rar", ["rar"] * 20, {19: 0.7})))       # never reaches
    records = tta.tta_records(runs, bench, 0.8)
    cells = tta.cell_table(records)
    assert len(cells) == 1
    c = cells.iloc[0]
    qsgd_post = np.mean([10 * 0.2, 15 * 0.2])                            # 2.5 s: the best mean
    # qsgd's seeds spread over [1.79, 3.21] s, which reaches overlapped fp16's 2.8 s: a tie, qsgd best
    assert c["best"] == "qsgd (post)" and c["winner_s"] == pytest.approx(qsgd_post)
    assert c["winner"].startswith("tie: qsgd (post), ") and "fp16 (overlap)" in c["winner"]
    assert "rar (post)" not in c["winner"]                                # never reached: behind all
    assert c["winner_std"] == pytest.approx(np.std([2.0, 3.0], ddof=1))
    assert c["fp16_overlap_s"] == pytest.approx(10 * 0.28)
    assert c["gain_over_fp16"] == pytest.approx(10 * 0.28 / qsgd_post)
    assert np.isinf(c["rar (post)"])
    it = tta.iteration_table(runs, 0.8).set_index(["aggregator", "variant"])
    assert it.loc[("qsgd", "post"), "mean"] == 12.5 and it.loc[("rar", "post"), "reached"] == 0


def test_iterations_come_from_post_backward_runs_overlapped_ones_are_a_check(tmp_path):
    bench = json.loads(_bench(tmp_path / "b.json").read_text())
    post = load_run(_run(tmp_path, "p", "qsgd", ["qsgd"] * 20, {9: 0.85}))
    over = load_run(_run(tmp_path, "o", "qsgd", ["qsgd"] * 20, {19: 0.85}, overlap=True))
    records = tta.tta_records([post, over], bench, 0.8)
    assert set(records["variant"]) == {"post", "overlap"} and len(records) == 2
    assert records.set_index("variant").loc["overlap", "tta_s"] == pytest.approx(10 * 0.25)
    it = tta.iteration_table([post, over], 0.8).set_index("variant")
    assert it.loc["overlap", "mean"] == 20 and it.loc["post", "mean"] == 10


def test_virtual_runs_with_a_link_are_validated_against_their_composition(tmp_path):
    bench = json.loads(_bench(tmp_path / "b.json").read_text())
    net = {"clock": "virtual", "bandwidth_bps": 2e8, "compute_scale": 1.0}
    # measured: warm-up 0.45 s + 0.05 s, compressed 0.06 + 0.045 s per iteration: 2 x 0.5 + 8 x 0.105
    step = {"warmup": (0.45, 0.05), "compress": (0.06, 0.045)}
    run = load_run(_run(tmp_path, "v", "gradiveq", ["warmup"] * 2 + ["compress"] * 8, {9: 0.82}, net=net,
                        step_s=step.__getitem__))
    val = tta.validation([run, load_run(_run(tmp_path, "w", "gradiveq", ["compress"] * 10, {9: 0.82}))],
                         bench, 0.8)
    assert len(val) == 1                                                  # the wall-clock run is not a check
    v = val.iloc[0]
    assert v["measured_s"] == pytest.approx(2 * 0.5 + 8 * 0.105) and v["composed_s"] == pytest.approx(1.8)
    assert v["composed_over_measured"] == pytest.approx(1.8 / 1.84) and v["within"]


def test_runs_on_another_setting_are_refused_naming_the_key(tmp_path):
    """A run's setting is its option and aggregator overrides: a rank the bench did not time has no
    seconds (named); a bench-wide override (--set) or batch the run lacks is refused by key."""
    bench = json.loads(_bench(tmp_path / "b.json", {**SECS, ("powersgd rank=4", "post"): 0.15}).read_text())
    rank8 = load_run(_run(tmp_path, "p8", "powersgd", ["powersgd"] * 5, {4: 0.9}, rank=8,
                          overrides=["aggregator.rank=8"]))
    with pytest.raises(ReportError, match=r"no seconds for powersgd rank=8 at N=4"):
        tta.tta_records([rank8], bench, 0.8)
    rank4 = load_run(_run(tmp_path, "p4", "powersgd", ["powersgd"] * 5, {4: 0.9}, overrides=["aggregator.rank=4"]))
    assert tta.tta_records([rank4], bench, 0.8).query("variant == 'post'")["tta_s"].item() == pytest.approx(5 * .15)
    big = load_run(_run(tmp_path, "b", "rar", ["rar"] * 5, {4: 0.9}, batch=32))
    with pytest.raises(ReportError, match=r"batch_size=32 \(bench: 16\)"):
        tta.check_setting([big], SETTING)
    other = load_run(_run(tmp_path, "l", "gradiveq", ["gradiveq"] * 5, {4: 0.9}))
    other.config["L_t"] = 100
    with pytest.raises(ReportError, match=r"L_t=100 \(bench: 50\)"):
        tta.check_setting([other], SETTING)
    tta.check_setting([rank4], SETTING)


def test_settings_of_one_family_are_priced_apart_and_the_gain_over_its_default(tmp_path):
    """qsgd at 2 bits and at its default are two settings: each run is priced at its own setting's
    seconds, and the winner's gain over its family's default setting is reported."""
    secs = {**SECS, ("qsgd bits=2", "post"): 0.1, ("qsgd bits=2", "overlap"): 0.12}
    bench = json.loads(_bench(tmp_path / "b.json", secs).read_text())
    runs = [load_run(_run(tmp_path, f"q2_{s}", "qsgd", ["qsgd"] * 20, {9: 0.85}, seed=s,
                          overrides=["aggregator.compressor.bits=2"])) for s in (0, 1)]
    runs += [load_run(_run(tmp_path, f"q4_{s}", "qsgd", ["qsgd"] * 20, {9: 0.85}, seed=s)) for s in (0, 1)]
    runs += [load_run(_run(tmp_path, "fp16", "fp16", ["fp16"] * 20, {9: 0.85}))]
    assert {r.setting for r in runs} == {"qsgd bits=2", "qsgd", "fp16"}
    records = tta.tta_records(runs, bench, 0.8)
    c = tta.cell_table(records, bench["setting"]["defaults"]).iloc[0]
    assert c["best"] == "qsgd bits=2 (post)" and c["winner_s"] == pytest.approx(10 * 0.1)
    assert c["gain_over_default"] == pytest.approx(10 * 0.2 / (10 * 0.1))      # over qsgd's faster variant
    assert c["gain_over_fp16"] == pytest.approx(10 * 0.28 / (10 * 0.1))
    it = tta.iteration_table(runs, 0.8).set_index(["aggregator", "variant"])
    assert it.loc[("qsgd bits=2", "post"), "seeds"] == 2 and it.loc[("qsgd", "post"), "seeds"] == 2
    assert tta.family_gain({"x (post)": tta._seed_band(1.0, 0.1)}, "x (post)", {}) == pytest.approx(1.0)
    # a run that wrote the default out (bits=4) is the default setting, by name: priced at its seconds
    explicit = load_run(_run(tmp_path, "q4x", "qsgd", ["qsgd"] * 20, {9: 0.85},
                             overrides=["aggregator.compressor.bits=4"]))
    assert explicit.setting == "qsgd"
    assert tta.tta_records([explicit], bench, 0.8).query("variant == 'post'")["tta_s"].item() == pytest.approx(2.0)
    # and its family's winner is measured against it under that name (two seeds each: ranked)
    explicit_1 = load_run(_run(tmp_path, "q4x1", "qsgd", ["qsgd"] * 20, {9: 0.85}, seed=1,
                               overrides=["aggregator.compressor.bits=4"]))
    records = tta.tta_records([*runs[:2], explicit, explicit_1], bench, 0.8)
    c = tta.cell_table(records, bench["setting"]["defaults"]).iloc[0]       # no alias needed: one name
    assert c["best"] == "qsgd bits=2 (post)" and c["gain_over_default"] == pytest.approx(2.0)


def test_cli_writes_tta_md_and_refuses_a_bad_json_in_one_line(tmp_path, capsys):
    runs = tmp_path / "sweep"
    for agg in ("fp16", "qsgd"):
        _run(runs, agg, agg, [agg] * 10, {9: 0.85})
    _run(runs, "rar", "rar", ["rar"] * 10, {9: 0.4}, status="diverged")       # trained, never reached: counted
    _run(runs, "powersgd", "powersgd", ["powersgd"] * 3, {}, status="failed")  # says nothing: left out
    bench = _bench(tmp_path / "b.json")
    assert main(["tta", str(runs), "--bench", str(bench), "target_acc=0.8"]) == 0
    md = (runs / "report" / "tta.md").read_text()
    assert "| rar          |   4 | post      | not reached  | 0/1       |" in md and "powersgd" not in md
    assert "qsgd (post)" in md and "0.80" not in md.split("\n")[0][:10]
    assert "| 4 |" in md.replace("|   4 |", "| 4 |") and (runs / "report" / "tta.csv").is_file()
    (tmp_path / "bad.json").write_text("{")
    capsys.readouterr()
    assert main(["tta", str(runs), "--bench", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a gvq.bench overlap --out JSON" in err[0]


def test_a_bench_run_in_parts_is_read_as_one_table_and_another_workload_or_a_mode_twice_refused(tmp_path, capsys):
    """``--tta A.json B.json``: B timed a family A lacks (PowerSGD) on the same workload; the cells price
    each run at its own file's seconds, fp16 overlapped from A; a file of another workload (batch) or one
    that measured a mode A has is refused in one line naming it."""
    runs = tmp_path / "sweep"
    for agg in ("fp16", "qsgd", "powersgd"):
        _run(runs, agg, agg, [agg] * 10, {9: 0.85})
    first = {k: v for k, v in SECS.items() if k[0] != "powersgd"}
    a = _bench(tmp_path / "a.json", first)
    b = _bench(tmp_path / "b.json", {k: v for k, v in SECS.items() if k[0] == "powersgd"})
    assert main(["tta", str(runs), "--bench", str(a), "target_acc=0.8"]) == 2          # alone, PowerSGD has none
    assert "no seconds for powersgd" in capsys.readouterr().err
    assert main(["tta", str(runs), "--bench", str(a), str(b), "target_acc=0.8"]) == 0
    rows = {(r["aggregator"], r["variant"]): r for r in
            csv.DictReader(open(runs / "report" / "tta.csv"))}
    assert float(rows[("powersgd", "post")]["tta_s"]) == pytest.approx(10 * 0.15)   # B's seconds
    assert float(rows[("qsgd", "post")]["tta_s"]) == pytest.approx(10 * 0.2)        # A's seconds
    md = (runs / "report" / "tta.md").read_text()
    assert f"{a} + {b}" in md and "powersgd (post)" in md
    other = json.loads(b.read_text())
    other["setting"] = {**other["setting"], "batch_per_rank": 32}
    (tmp_path / "c.json").write_text(json.dumps(other))
    capsys.readouterr()
    assert main(["tta", str(runs), "--bench", str(a), str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "c.json: another workload than" in err[0] and "batch_per_rank=32 (there: 16)" in err[0]
    assert main(["tta", str(runs), "--bench", str(a), str(a)]) == 2
    assert "is also in" in capsys.readouterr().err


def test_measured_time_to_target_counts_iteration_zero_as_a_typical_iteration_of_its_phase(tmp_path):
    """Iteration 0's one-off start-up (0.56 s where its phase's iterations take 0.06 s) is left out of the
    run's own time to the target, as the bench's medians leave it out of the composition."""
    seconds = iter([(0.5, 0.06)] + [(0.04, 0.02)] * 9)           # iteration 0 first, then the rest
    run = load_run(_run(tmp_path, "s", "qsgd", ["compress"] * 10, {9: 0.82}, step_s=lambda ph: next(seconds)))
    assert run.metrics.loc[0, "compute_s"] == pytest.approx(0.5)
    assert tta.measured_time(run, 0.8) == pytest.approx(10 * 0.06)


def test_without_an_fp16_run_the_missing_baseline_is_said_not_printed_as_not_reached(tmp_path):
    """No fp16 run: tta.md's overlapped-fp16 column says so (never "not reached", a gain of "nanx"), and a
    setting not run in a cell is "—", never "nan"; a run that never reached the target still says so."""
    runs = tmp_path / "sweep"
    _run(runs, "qsgd", "qsgd", ["qsgd"] * 10, {9: 0.85})
    _run(runs, "rar", "rar", ["rar"] * 10, {9: 0.4})
    assert main(["tta", str(runs), "--bench", str(_bench(tmp_path / "b.json")), "target_acc=0.8"]) == 0
    md = (runs / "report" / "tta.md").read_text()
    winner = next(ln for ln in md.splitlines() if ln.startswith("|") and "qsgd (post)" in ln and "no fp16 run" in ln)
    assert winner.count("no fp16 run") == 2                     # the reference column and the gain
    assert "nan" not in md.lower()
    assert "not reached" in md                                  # rar never reached 0.8: that is still said


def _bench_with_spread(path: Path, spread: dict) -> Path:
    """``_bench`` whose modes carry the bench's interval of their median seconds (``iter_lo_s``,
    ``iter_hi_s``), ``spread``: (setting, variant) -> (lo, hi)."""
    bench = json.loads(_bench(path).read_text())
    for r in bench["modes"]:
        r["iter_lo_s"], r["iter_hi_s"] = spread.get((r["setting"], r["variant"]), (r["iter_s"], r["iter_s"]))
    path.write_text(json.dumps(bench))
    return path


def test_one_seed_is_listed_unranked_and_a_never_reached_setting_is_never_in_a_tie(tmp_path):
    """One seed per setting (the issue's lm_tta screen): the winner read ``tie: ...`` of every mode, a setting
    that never reached the target among them.  Now: no ranking (< 2 seeds), every figure still listed; the
    fastest one-seed mode is named with the modes the bench's intervals cannot tell from it; never-reached
    modes are in no tie."""
    spread = {("qsgd", "post"): (0.19, 0.21), ("qsgd", "overlap"): (0.2, 0.3), ("rar", "post"): (0.45, 0.55)}
    bench = json.loads(_bench_with_spread(tmp_path / "b.json", spread).read_text())
    runs = [load_run(_run(tmp_path, "q", "qsgd", ["qsgd"] * 20, {9: 0.85})),
            load_run(_run(tmp_path, "r", "rar", ["rar"] * 20, {9: 0.85})),
            load_run(_run(tmp_path, "p", "powersgd", ["powersgd"] * 20, {19: 0.5}))]       # never reaches
    c = tta.cell_table(tta.tta_records(runs, bench, 0.8)).iloc[0]
    assert not c["winner"].startswith("tie") and "unranked" in c["winner"]
    assert "powersgd" not in c["one_seed"] and "rar" not in c["one_seed"]
    # qsgd post: 10 x [0.19, 0.21] s; its overlap: 10 x [0.2, 0.3] s overlaps it, rar's [4.5, 5.5] does not
    assert c["one_seed"].startswith("qsgd (post) 2.0 s") and "qsgd (overlap)" in c["one_seed"]
    assert c["qsgd (post)"] == pytest.approx(2.0) and np.isinf(c["powersgd (post)"])   # every figure listed
    it = tta.iteration_table(runs, 0.8).set_index(["aggregator", "variant"])
    assert it.loc[("qsgd", "post"), "ranked"] == "unranked (< 2 seeds)"


def test_a_one_seed_tie_says_where_the_bench_has_no_intervals(tmp_path):
    """A bench file without ``iter_lo_s`` (an older one): one seed's fastest is named and the missing
    intervals said, never a tie of everything."""
    bench = json.loads(_bench(tmp_path / "b.json").read_text())
    runs = [load_run(_run(tmp_path, "q", "qsgd", ["qsgd"] * 20, {9: 0.85})),
            load_run(_run(tmp_path, "r", "rar", ["rar"] * 20, {9: 0.85}))]
    c = tta.cell_table(tta.tta_records(runs, bench, 0.8)).iloc[0]
    assert "unranked" in c["winner"] and "no intervals" in c["one_seed"]


def test_two_seeds_rank_and_one_seed_beside_them_stays_unranked(tmp_path):
    """A 2-seed setting is ranked by its seed band; a 1-seed setting faster than it is listed beside the
    winner, never the winner."""
    bench = json.loads(_bench_with_spread(tmp_path / "b.json", {}).read_text())
    runs = [load_run(_run(tmp_path, f"r{s}", "rar", ["rar"] * 20, {9 + s: 0.85}, seed=s)) for s in (0, 1)]
    runs.append(load_run(_run(tmp_path, "g", "gradiveq", ["compress"] * 20, {9: 0.85})))
    c = tta.cell_table(tta.tta_records(runs, bench, 0.8)).iloc[0]
    assert c["best"] == "rar (overlap)" and c["winner"] == "rar (overlap)"
    assert c["one_seed"].startswith("gradiveq (post)")


def test_tta_md_says_validation_loss_and_marks_one_seed_figures(tmp_path):
    """tta.md named a loss target "test loss" where the frontier and curves say validation; a one-seed
    figure is marked unranked in every table."""
    runs = tmp_path / "sweep"
    for agg in ("fp16", "qsgd"):
        d = _run(runs, agg, agg, [agg] * 10, {})
        text = (d / "metrics.csv").read_text().replace("test_acc", "test_loss").splitlines()
        text[10] = text[10] + "2.0"                                      # iteration 9: validation loss 2.0
        (d / "metrics.csv").write_text("\n".join(text) + "\n")
    assert main(["tta", str(runs), "--bench", str(_bench(tmp_path / "b.json")), "target_loss=2.4"]) == 0
    md = (runs / "report" / "tta.md").read_text()
    assert "validation loss 2.4" in md and "test loss" not in md
    assert "unranked (< 2 seeds)" in md and "tie:" not in md
