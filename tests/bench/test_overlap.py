"""gvq/bench/overlap.py: the modes one spawn times, the per-cell winner and its gain over overlapped fp16,
RAR's hiding check, and the wall-clock comparison with torch DDP run end to end on a tiny model."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gvq.bench import overlap
from gvq.bench.__main__ import COMMANDS, main
from gvq.bench.train import COLS
from gvq.schema.errors import ConfigError
from gvq.schema.tool import compose_command
from tests.helpers.records import load_record

#: the fields and the timing-free values the table's records had before its keys were typed (issue 62)
BEFORE = load_record("bench_overlap")


def args_of(*overrides):
    """What ``python -m gvq.bench overlap OVERRIDES`` runs on (its composed, checked keys)."""
    return overlap.overlap_args(compose_command(COMMANDS["overlap"], overrides), SimpleNamespace(out=None))


def test_one_spawn_times_compute_alone_once_then_every_aggregator_variant_and_link():
    specs = overlap.cell_specs([5e7, 1e9], ["rar", "powersgd"], 0.5)
    assert specs[0].option == "local" and specs[0].bandwidth is None
    assert len(specs) == 1 + 2 * 2 * 3
    labels = [s.label for s in specs[1:]]
    assert len(set(labels)) == len(labels)
    post, default, small = [s for s in specs if s.option == "powersgd" and s.bandwidth == 1e9]
    assert post.overrides == ("aggregator.rank=4",)
    assert "aggregator.overlap=true" in default.overrides and not any("bucket_cap" in o for o in default.overrides)
    assert "aggregator.bucket_cap_mb=0.5" in small.overrides


def test_variants_and_common_overrides_pick_what_one_spawn_times():
    specs = overlap.cell_specs([2e8], ["qsgd", "powersgd"], 0.25, kinds=["post", "overlap"],
                               common=(*overlap.table_grid().set, "L_t=50"))
    assert [(s.option, s.variant, s.bucket_mb, s.bandwidth) for s in specs[1:]] == [
        ("qsgd", "post", None, 2e8), ("qsgd", "overlap", None, 2e8), ("powersgd", "post", None, 2e8),
        ("powersgd", "overlap", None, 2e8)]
    assert all("L_t=50" in s.overrides for s in specs[1:])
    assert specs[3].overrides[0] == "aggregator.rank=4"          # the table's own setting stays first
    args = args_of("variants=[post]", "input_shape=[1,28,28]", "model=resnet20")
    assert args.variants == ["post"] and overlap.setting(args)["input_shape"] == [1, 28, 28]
    assert overlap.setting(args_of())["input_shape"] == [3, 32, 32]   # the ResNets' default
    for bad in ("variants=[later]", "net.clock=wall", "net.compute_scale=0.5", "grid.set=[net.exclusive=false]",
                "bucket_mb=0", "grid.world_sizes=[]"):
        with pytest.raises(ConfigError, match=bad.split("=")[0].split(".")[-1] if "set" not in bad else "net"):
            args_of(bad)


def test_settings_of_one_family_are_modes_named_as_the_report_names_runs(tmp_path):
    """``qsgd`` and ``qsgd:compressor.bits=2`` are two modes, each with its own overrides, named by the
    report's name (``Setting.name``: a run with ``aggregator.compressor.bits=2`` finds its seconds); a
    ``name:key=value`` --set of that option is part of its name; a malformed entry is one line."""
    from gvq.report.runs import Run
    from gvq.schema.setting import aliases, name_of as setting_label
    specs = overlap.cell_specs([2e8], ["qsgd", "qsgd:compressor.bits=2", "powersgd:rank=8"], 0.25, kinds=["post"],
                               common=("L_t=50", "qsgd:aggregator.stochastic=true"))
    got = {s.setting: s.overrides for s in specs[1:]}
    assert set(got) == {"qsgd stochastic=true", "qsgd bits=2 stochastic=true", "powersgd rank=8"}
    assert "aggregator.compressor.bits=2" in got["qsgd bits=2 stochastic=true"]
    assert "aggregator.rank=4" not in got["powersgd rank=8"]      # the entry's own rank replaces the table's
    run = Run(tmp_path, "completed", "", "qsgd", ["aggregator=qsgd", "aggregator.compressor.bits=2",
                                                  "aggregator.stochastic=true", "seed=1"], {}, None)
    assert run.setting == "qsgd bits=2 stochastic=true"
    assert setting_label("signsgd", ["aggregator._target_=gvq.aggregators.error_feedback.ErrorFeedbackAggregator"]
                         ) == "signsgd _target_=ErrorFeedbackAggregator"
    for bad in ("qsgd:", "qsgd:bits", "qsgd:=2"):
        with pytest.raises(ConfigError, match="grid.settings"):
            args_of(f"grid.settings=['{bad}']")
    args = args_of("grid.settings=[qsgd:compressor.bits=2,fp16]")
    assert overlap.setting(args)["defaults"] == {"fp16": "fp16", "qsgd": "qsgd"}
    # a default written out is the same setting: the bench names it so (the option file's bits: 4), and an
    # entry that only restates its option's default (gradiveq_pooled's K/d is 8) is named by the option
    assert aliases(["qsgd", "qsgd:compressor.bits=2", "gradiveq_pooled:compressor.target_ratio=8",
                    "gradiveq:samples_in_warmup=true", "gradiveq"], overlap.table_grid().set) == {
        "qsgd bits=4": "qsgd", "gradiveq samples_in_warmup=false": "gradiveq",
        "gradiveq_pooled target_ratio=8": "gradiveq_pooled"}
    assert setting_label("g", ["aggregator.a=True", "aggregator.b=8.0", "aggregator.c=null"]) == "g a=true b=8 c=null"
    # the variant (overlapped, bucket size) is not the setting: the bench times it beside
    assert setting_label("g", ["aggregator.overlap=true", "aggregator.bucket_cap_mb=0.25", "aggregator.b=2"]) == "g b=2"


def test_a_modes_name_carries_each_value_that_differs_from_its_options_defaults_and_no_other():
    """The records' ``setting``: PowerSGD under the grid's ``set`` is ``powersgd rank=4``, an entry restating
    QSGD's default (``qsgd:compressor.bits=4``) is ``qsgd`` (it was ``qsgd bits=4``, a second name for the
    default setting); two entries of one setting are refused in one line, before any rank starts."""
    specs = overlap.cell_specs([2e8], ["qsgd:compressor.bits=4", "powersgd", "qsgd:compressor.bits=2"], 0.25,
                               kinds=["post"])
    assert [s.setting for s in specs[1:]] == ["qsgd", "powersgd rank=4", "qsgd bits=2"]
    assert specs[1].label == "qsgd (post) at 2e+08 bit/s"
    with pytest.raises(ConfigError, match=r"grid.settings qsgd:compressor.bits=4: the same setting as qsgd \('qsgd'\)"):
        args_of("grid.settings=[qsgd,qsgd:compressor.bits=4]")


def test_the_table_grid_is_the_flags_defaults_and_names_powersgd_at_the_runs_rank():
    """conf/grid/overlap.yaml is what ``python -m gvq.bench overlap`` runs with no keys; its settings start
    from the grid's ``set`` (PowerSGD at rank 4, the rank the time-to-accuracy runs train at)."""
    g, args = overlap.table_grid(), args_of()
    assert (args.aggregators, args.world_size, args.bandwidth, args.compute_scale) == (
        g.settings, g.world_sizes, g.links_bps, g.compute_scales)
    assert overlap.setting(args)["defaults"]["powersgd"] == "powersgd rank=4"
    powersgd = [s for s in overlap.cell_specs([1e9], ["powersgd", "powersgd:rank=8"], 0.25, ["post"])[1:]]
    assert [s.overrides for s in powersgd] == [("aggregator.rank=4",), ("aggregator.rank=8",)]


def test_each_cell_is_its_own_spawn_so_a_rank_holds_one_links_aggregators(monkeypatch):
    spawned = []

    def fake(run, world):
        spawned.append((world, run.net["compute_scale"], run.bandwidth, {s.bandwidth for s in run.specs[1:]}))
        rows = {s.label: [dict.fromkeys(COLS, 0.0)] for s in run.specs}
        return {"rows": rows}

    monkeypatch.setattr(overlap, "run_iterations", fake)
    records, cells = overlap.run_table(args_of("grid.world_sizes=[2,3]", "grid.links_bps=[5e7,1e9]",
                                               "grid.compute_scales=[1]", "grid.settings=[rar]"))
    assert spawned == [(w, 1.0, b, {b}) for w in (2, 3) for b in (5e7, 1e9)]
    assert len(records) == 2 * 2 * 3 and len(cells) == 4


def _rec(agg, variant, it, aggregate=0.1, exposed=0.0, last=0.0, backward=1.0, link=50.0, compute=None,
         spread=0.0):
    """A mode's record; its interval of seconds per iteration is ``it`` +- ``spread``."""
    return {"N": 4, "compute_scale": 1.0, "link_Mbps": link, "aggregator": agg.split(" ")[0], "setting": agg,
            "variant": variant, "alone_s": 1.1, "backward_s": backward,
            "compute_s": backward if compute is None else compute,
            "iter_s": it, "iter_lo_s": it - spread, "iter_hi_s": it + spread, "aggregate_s": aggregate,
            "comm_s": 0.0, "exposed_s": exposed, "last_bucket_s": last}


def test_the_winner_and_its_gain_over_overlapped_fp16_per_cell():
    recs = [_rec("fp16", "overlap", 2.0), _rec("fp16", "post", 2.5), _rec("qsgd", "overlap", 1.6),
            _rec("rar", "post", 3.0, aggregate=0.9), _rec("rar", "overlap", 2.2, exposed=0.15, last=0.1),
            _rec("rar", "post", 9.0, link=1000.0)]
    cells = overlap.cell_summary(recs)
    assert [c["link_Mbps"] for c in cells] == [50.0, 1000.0]
    c = cells[0]
    assert c["winner"] == "qsgd (overlap)" and c["gain_over_fp16"] == pytest.approx(2.0 / 1.6)
    # post-backward RAR aggregates in 0.9 s < 1.0 s of backward: exposed 0.15 <= 0.1 + 0.1 x 1.0
    assert c["rar_bound_s"] == pytest.approx(0.2) and c["rar_hides"] is True
    assert cells[1]["gain_over_fp16"] is None and cells[1]["rar_hides"] is None


def test_rar_hiding_does_not_apply_where_its_aggregation_outlasts_backward_and_fails_when_exposed():
    long = overlap.rar_hiding([_rec("rar", "post", 3, aggregate=1.5), _rec("rar", "overlap", 2, exposed=1.0)])
    assert long["rar_hides"] is None and long["rar_exposed_s"] == 1.0
    short = overlap.rar_hiding([_rec("rar", "post", 3, aggregate=0.5), _rec("rar", "overlap", 2, exposed=0.5,
                                                                            last=0.1)])
    assert short["rar_hides"] is False


def test_rar_hiding_applies_against_backward_alone_and_allows_a_tenth_of_forward_plus_backward():
    """Buckets exist only once backward runs: an aggregation longer than backward (0.9 s > 0.8 s) cannot
    hide, even if shorter than forward + backward (1.2 s); where it applies the slack is 0.1 x 1.2 s."""
    def cell(aggregate):
        return overlap.rar_hiding([_rec("rar", "post", 3, aggregate=aggregate, backward=0.8, compute=1.2),
                                   _rec("rar", "overlap", 2, exposed=0.2, last=0.1)])
    assert cell(0.9)["rar_hides"] is None
    short = cell(0.7)
    assert short["rar_bound_s"] == pytest.approx(0.1 + 0.12) and short["rar_hides"] is True


@pytest.mark.slow
def test_the_wall_clock_comparison_with_torch_ddp_runs_end_to_end():
    recs = main(["overlap", "wall=true", "grid.world_sizes=[2]", "model=cnn", "iters=2", "warmup=1"])
    assert [r["aggregator"] for r in recs] == ["torch_ddp", "rar_overlap"]
    assert all(r["iter_s"] > 0 for r in recs) and recs[1]["MB_per_rank"] > 0


@pytest.mark.slow
def test_the_virtual_time_table_runs_end_to_end_with_one_timed_phase_at_a_time(capfd):
    """Overlapped modes hold no clock lock while they wait for peers (DDP's bucket rebuild, backward's
    tail): a rank that did would stall the others until they gave the lock up, and say so.  Its records
    have the fields and the timing-free values the flags' version wrote (tests/records)."""
    out = main(["overlap", "grid.world_sizes=[2]", "model=cnn", "iters=2", "warmup=1", "grid.links_bps=[5e7]",
                "grid.compute_scales=[1]", "grid.settings=[rar,fp16]", "bucket_mb=0.001", "timeout=120"])
    assert "clock lock" not in capfd.readouterr().err
    assert (out["version"], out["setting"]) == (BEFORE["version"], BEFORE["setting"])
    assert [sorted(r) for r in out["modes"]] == [BEFORE["mode_fields"]] * len(BEFORE["modes"])
    assert [{k: r[k] for k in BEFORE["modes"][0]} for r in out["modes"]] == BEFORE["modes"]
    assert [sorted(c) for c in out["cells"]] == [BEFORE["cell_fields"]] * len(BEFORE["cells"])
    assert [{k: c[k] for k in BEFORE["cells"][0]} for c in out["cells"]] == BEFORE["cells"]
    assert {(r["aggregator"], r["variant"]) for r in out["modes"]} == {
        (a, v) for a in ("rar", "fp16") for v in ("post", "overlap", "overlap@0.001MB")}
    assert all(r["iter_s"] > 0 and r["comm_s"] >= r["exposed_s"] >= 0 for r in out["modes"])
    assert out["cells"][0]["winner"]


def test_a_winner_is_named_only_where_its_interval_lies_below_every_other():
    recs = [_rec("fp16", "overlap", 2.0, spread=0.1), _rec("qsgd", "overlap", 1.6, spread=0.1),
            _rec("rar", "post", 3.0, spread=0.1)]
    c = overlap.cell_summary(recs)[0]
    assert c["winner"] == "qsgd (overlap)" and c["tied"] == ["qsgd (overlap)"]
    assert (c["winner_lo_s"], c["winner_hi_s"]) == (pytest.approx(1.5), pytest.approx(1.7))
    assert c["gain_lo"] == pytest.approx(1.9 / 1.7) and c["gain_hi"] == pytest.approx(2.1 / 1.5)
    assert c["gain_within_noise"] is False
    assert overlap.cell_row(c)["gain_range"] == "[1.12, 1.4]"


def test_overlapping_intervals_make_the_cell_a_tie_listing_exactly_the_tied():
    recs = [_rec("fp16", "overlap", 1.7, spread=0.15), _rec("qsgd", "overlap", 1.6, spread=0.1),
            _rec("powersgd", "post", 1.85, spread=0.1), _rec("rar", "post", 3.0, spread=0.1)]
    c = overlap.cell_summary(recs)[0]
    # powersgd reaches fp16's interval (1.55-1.85) but not qsgd's (1.5-1.7): not tied with the best
    assert c["tied"] == ["qsgd (overlap)", "fp16 (overlap)"]
    assert c["winner"] == "tie: qsgd (overlap), fp16 (overlap)" and c["winner_s"] == 1.6
    assert c["gain_over_fp16"] == pytest.approx(1.7 / 1.6) and c["gain_within_noise"] is True
    assert overlap.cell_row(c)["gain_range"].endswith(" within noise")


def test_each_mode_keeps_every_iteration_and_the_interval_of_its_median():
    """Scripted rows (seconds per iteration first, as COLS): the record's median, its interval, the
    iterations themselves; compute alone has its medians only."""
    def rows(seconds):
        return [{**dict.fromkeys(COLS, 0.0), "iter_s": s} for s in seconds]
    its = [0.50, 0.52, 0.49, 0.70, 0.51, 0.50, 0.48, 0.53, 0.50, 0.51, 0.49, 0.52]
    specs = overlap.cell_specs([5e7], ["rar"], 0.5, ["post", "small"])
    raw = {"rows": {"local": rows([0.4] * 3), specs[1].label: rows(its), specs[2].label: rows(its)}}
    rec, small = overlap.mode_records(raw, specs, 4, 1.0)
    # the record's fields come from its mode's spec, not from parsing a label
    assert (rec["aggregator"], rec["variant"], rec["overlapped"], rec["bucket_mb"], rec["link_Mbps"]) == \
        ("rar", "post", False, None, 50.0)
    assert (small["variant"], small["overlapped"], small["bucket_mb"]) == ("overlap@0.5MB", True, 0.5)
    assert rec["iters_s"] == its and rec["iter_s"] == pytest.approx(0.505) and rec["alone_s"] == 0.4
    assert rec["iter_lo_s"] <= rec["iter_s"] <= rec["iter_hi_s"] < 0.70
    assert overlap.mode_records(raw, specs, 4, 1.0) == [rec, small]    # the seed fixes the interval


def test_the_default_takes_enough_iterations_for_an_interval_and_says_how_it_is_taken():
    args = args_of()
    assert args.iters >= 10 and "bootstrap" in overlap.setting(args)["interval"]
