"""gvq/report/stats.py: a run's means come from the column registry, so a newly declared column is in
the report without a second list."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gvq.report.runs import Run
from gvq.report.stats import run_stats
from gvq.schema import columns


def _run(metrics: pd.DataFrame) -> Run:
    return Run(Path("."), "completed", "", "qsgd", [], {}, metrics)


def test_every_declared_amount_is_averaged_and_clock_readings_are_not():
    rng = np.random.default_rng(0)
    # iter_s is the training bench's whole step; a run's iteration is compute_s + aggregate_s (below)
    logged = [c.name for c in columns.COLUMNS if c.unit in ("s", "B") and c.name != "iter_s"]
    m = pd.DataFrame({k: rng.random(5) for k in logged})
    m["test_acc"] = np.nan
    out = run_stats(_run(m), target=0.5)
    for name in set(columns.AMOUNTS) - {"iter_s"}:
        assert out[name] == pytest.approx(m[name].mean()), name
    assert "wall_s" not in out and "real_wall_s" not in out     # readings at a step's end, not amounts
    assert {"straggle_s", "last_bucket_s", "bytes_sent"} <= set(columns.AMOUNTS)
    assert out["iter_s"] == pytest.approx((m["compute_s"] + m["aggregate_s"]).mean())


def _startup_run(startup: float = 0.5) -> Run:
    """20 iterations of 0.06 s (compute 0.04 + aggregation 0.02); iteration 0 also pays ``startup``; test
    accuracy 0.95 at iteration 9."""
    step = 0.06
    m = pd.DataFrame({"iteration": range(20), "compute_s": 0.04, "aggregate_s": 0.02,
                      "wall_s": [startup + step * (i + 1) for i in range(20)],
                      "test_acc": [0.95 if i == 9 else np.nan for i in range(20)]})
    m.loc[0, "compute_s"] += startup
    return Run(Path("."), "completed", "", "qsgd", [], {}, m)


def test_time_to_target_leaves_out_iteration_zeros_one_off_start_up():
    """Iteration 0 took 0.56 s where the others take 0.06 s (the first forward and backward, the ranks'
    first contact): time to the target counts it as one typical iteration, 10 x 0.06 s to iteration 9."""
    out = run_stats(_startup_run(0.5), target=0.9)
    assert out["target_s"] == pytest.approx(10 * 0.06) and out["target_iters"] == 10
    assert run_stats(_startup_run(0.0), target=0.9)["target_s"] == pytest.approx(10 * 0.06)


def test_the_status_column_says_summary_jsons_status_and_one_reason():
    """Two seeds, both collapsed, each with its own long reason: the table says ``collapsed`` (the runs'
    status, not ``completed, 2/2 at chance``) and one reason, once."""
    from gvq.report.display import display_table
    from gvq.report.runs import group_runs
    from gvq.report.stats import build_table, group_stats
    why = ("train loss back at chance since iteration {} to the end (smoothed 2.301 >= 0.95 x ln 10 = 2.187); "
           "final test accuracy 0.100, chance 0.100")
    runs = [Run(Path(str(seed)), "collapsed", why.format(100 + seed), "qsgd",
                ["aggregator=qsgd", "aggregator.compressor.bits=2", f"seed={seed}"], {}, _startup_run().metrics)
            for seed in (0, 1)]
    mixed = [Run(Path(str(seed)), status, why.format(7) if status == "collapsed" else "", "qsgd",
                 ["aggregator=qsgd", "aggregator.compressor.bits=4", f"seed={seed}"], {}, _startup_run().metrics)
             for seed, status in ((0, "completed"), (1, "collapsed"))]
    groups = group_runs(runs + mixed)
    stats = {id(g): group_stats(g, 0.9) for g in groups}
    table = build_table(groups, stats)
    by = {g: r for g, r in zip(table["group"], table.to_dict("records"))}
    assert by["qsgd bits=2"]["run_status"] == "collapsed" and by["qsgd"]["run_status"] == "completed 1/2, collapsed 1/2"
    shown = dict(zip(table["group"], display_table(table, 0.9)["status"]))
    assert shown["qsgd bits=2"].startswith("collapsed: train loss back at chance since iteration 100")
    assert shown["qsgd bits=2"].count("back at chance") == 1 and "+1 other reasons" in shown["qsgd bits=2"]
    assert shown["qsgd"] == "completed 1/2, collapsed 1/2: " + why.format(7)


def test_aggregate_error_is_carried_as_mean_and_std_over_seeds_where_a_run_logged_it():
    """Runs with ``aggregate_error=true`` have the column: the table's mean ± std over seeds, shown; runs
    without it: NaN in table.csv, and no column in the shown table."""
    from gvq.report.display import display_table
    from gvq.report.runs import group_runs
    from gvq.report.stats import build_table, group_stats

    def run(seed, errors):
        m = _startup_run().metrics
        if errors is not None:
            m["aggregate_error"] = errors
        return Run(Path(str(seed)), "completed", "", "qsgd", ["aggregator=qsgd", f"seed={seed}"], {}, m)

    logged = group_runs([run(0, 0.1), run(1, [0.3] * 10 + [np.nan] * 10)])
    table = build_table(logged, {id(g): group_stats(g, 0.9) for g in logged})
    assert table["aggregate_error"][0] == pytest.approx(0.2) and table["aggregate_error_std"][0] > 0
    assert display_table(table, 0.9)["aggregate error"][0].startswith("0.2 ± ")
    plain = group_runs([run(0, None)])
    table = build_table(plain, {id(g): group_stats(g, 0.9) for g in plain})
    assert np.isnan(table["aggregate_error"][0]) and "aggregate error" not in display_table(table, 0.9)


def test_a_language_model_run_without_its_csv_reads_bpb_from_its_summary():
    run = Run(Path("."), "completed", "", "rar", [], {}, None,
              {"final_test_acc": 0.3, "mean_aggregate_s": 0.02, "final_test_bpb": 3.41})
    assert run_stats(run, target=0.5) == {"final_acc": 0.3, "aggregate_s": 0.02, "final_bpb": 3.41}


def _bytes_run(agg: str, seed: int, sent: list[float], logged_ratio: list[float] | None = None) -> Run:
    m = _startup_run().metrics.iloc[:len(sent)].copy()
    m["bytes_sent"] = sent
    if logged_ratio is not None:
        m["compression_ratio"] = logged_ratio
    return Run(Path(f"{agg}{seed}"), "completed", "", agg, [f"aggregator={agg}", f"seed={seed}"], {}, m)


def test_the_compression_ratio_is_one_definition_whatever_company_a_run_keeps():
    """The same GradiVeQ run read 2.84 beside rar and 4.21 alone (a silent fallback to the mean of the
    logged per-iteration column).  The report's compression ratio is one quantity, rar's mean bytes per
    iteration over the group's: alone it is missing (NaN, shown as —, and the note says why), never
    another quantity."""
    from gvq.report.display import display_table, table_note
    from gvq.report.runs import group_runs
    from gvq.report.stats import build_table, group_stats
    # warm-up at rar's 1500 B, then compressed at 150 B: ratio of the means 1500 / 825 = 1.82; the mean of
    # the logged per-iteration ratios (1 and 10, as GradiVeQ logs them) 5.5
    gvq = _bytes_run("gradiveq", 0, [1500.0] * 5 + [150.0] * 5, [1.0] * 5 + [10.0] * 5)
    rar = _bytes_run("rar", 0, [1500.0] * 10)

    def table_of(runs):
        groups = group_runs(runs)
        return build_table(groups, {id(g): group_stats(g, 0.9) for g in groups}).set_index("aggregator")

    beside, alone = table_of([rar, gvq]), table_of([gvq])
    assert beside.loc["gradiveq", "compression_ratio"] == pytest.approx(1500 / 825)
    assert np.isnan(alone.loc["gradiveq", "compression_ratio"])
    assert np.isnan(alone.loc["gradiveq", "aggregation_speedup"])
    shown = display_table(alone.reset_index(), 0.9)
    assert list(shown["compression ratio vs rar (bytes)"]) == ["—"]
    assert "No completed rar run of its setting: gradiveq:" in table_note(alone.reset_index())
    assert "No completed rar run" not in table_note(beside.reset_index())


def test_a_method_that_syncs_less_often_is_compared_with_rar_every_step():
    """DiLoCo on rar sends rar's bytes every 10th step: its ratio is 10 against every-step rar, not 1
    against its own rar runs (a post-local SGD report read 1 for every=4 and every=16); with no every-step
    rar beside it there is no baseline."""
    from gvq.report.runs import group_runs
    from gvq.report.stats import build_table, group_stats
    rar = _bytes_run("rar", 0, [1500.0] * 10)
    diloco = _bytes_run("rar", 1, [0.0] * 9 + [1500.0])
    diloco.overrides += ["method=diloco", "method.every=10"]
    rar.config, diloco.config = {"method": {"_target_": "every_step"}}, {"method": {"_target_": "diloco", "every": 10}}

    def table_of(runs):
        groups = group_runs(runs)
        return build_table(groups, {id(g): group_stats(g, 0.9) for g in groups}).set_index("group")

    beside = table_of([rar, diloco])
    assert beside.loc["rar diloco every=10", "compression_ratio"] == pytest.approx(10)
    assert beside.loc["rar", "compression_ratio"] == pytest.approx(1)
    assert np.isnan(table_of([diloco]).loc["rar diloco every=10", "compression_ratio"])
