"""Per-cycle counting (gvq/report/cycle.py): exact sums on scripted metrics, ratios against the setting's
rar / qsgd, the paper's claims, refusals naming the run, and the preset -> run -> ``--cycle`` path."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from gvq.bench.paper import UNINTERRUPTED
from gvq.report import cycle
from gvq.report.__main__ import main as report_main
from gvq.report.runs import ReportError, Run
from tests.helpers.launch import launch_job

L_T, L_C = 5, 10


def _cfg(scale: float = 1.0) -> dict:
    return {"world_size": 6, "L_t": L_T, "L_c": L_C,
            "net": {"bandwidth_bps": 5e7, "clock": "virtual", "compute_scale": scale, "codec_scale": 1.0}}


def _run(name: str, rows: list[dict], scale: float = 1.0) -> Run:
    df = pd.DataFrame(rows)
    df["iteration"] = range(len(df))
    return Run(Path(f"/runs/{name}-{scale}"), "completed", "", name, [], _cfg(scale), df)


def _flat(agg: float, n: int = 6, compute: float = 0.5, first: float = 9.0) -> list[dict]:
    """Rows of a one-phase run; the first two (start-up) are slow and must not count."""
    return [{"compute_s": compute if i >= 2 else first, "aggregate_s": agg if i >= 2 else first,
             "phase": None, "fit_s": math.nan, "compression_ratio": 1.0, "bytes_sent": 800.0} for i in range(n)]


def _gradiveq(n_comp: int, first: float = 9.0) -> list[dict]:
    """L_t sampling rows (1.0 s; the L_t-th holds a 2.0 s refresh), then n_comp compressed rows (0.2 s)."""
    rows = [{"compute_s": 0.5, "aggregate_s": 1.0, "phase": "sample", "fit_s": math.nan,
             "compression_ratio": 8.0, "bytes_sent": 100.0} for _ in range(L_T)]
    rows[0]["compute_s"] = rows[0]["aggregate_s"] = first
    rows[1]["compute_s"] = rows[1]["aggregate_s"] = first
    rows[-1].update(aggregate_s=3.0, fit_s=2.0, bytes_sent=5000.0)   # a refresh whose state was relayed
    rows += [{"compute_s": 0.5, "aggregate_s": 0.2, "phase": "compress", "fit_s": math.nan,
              "compression_ratio": 20.0, "bytes_sent": 40.0} for _ in range(n_comp)]
    return rows


def test_gradiveq_cycle_counts_sampling_refresh_and_extrapolated_compressed_phase():
    c = cycle.cycle_of(_run("gradiveq", _gradiveq(4)))
    # (L_t - 1) ordinary sampling iterations at their mean after the 2 start-up rows, the refresh row as
    # logged, L_c x the compressed mean; compute: (L_t + L_c) x its mean after start-up
    assert c["aggregation"] == pytest.approx(4 * 1.0 + 3.0 + L_C * 0.2)
    assert c["compute"] == pytest.approx((L_T + L_C) * 0.5)
    assert c["end_to_end"] == pytest.approx(c["aggregation"] + c["compute"])
    assert c["steady_agg"] == pytest.approx(0.2) and c["fit_s"] == 2.0 and c["wire_ratio"] == 20.0
    assert "x mean of 4 compressed" in c["counted"]
    assert c["bytes"] == pytest.approx(4 * 100.0 + 5000.0 + L_C * 40.0)   # the relay counted once, as logged


def test_a_whole_logged_compressed_phase_is_summed_not_extrapolated():
    rows = _gradiveq(L_C)
    rows[-1]["aggregate_s"] = 1.2                      # one slow compressed iteration counts once, as logged
    c = cycle.cycle_of(_run("gradiveq", rows))
    assert c["aggregation"] == pytest.approx(4 + 3.0 + 9 * 0.2 + 1.2)
    assert f"{L_C} compressed as logged" in c["counted"]


def test_one_phase_runs_count_cycle_times_their_mean_after_start_up():
    c = cycle.cycle_of(_run("rar", _flat(2.0)))
    assert c["aggregation"] == pytest.approx((L_T + L_C) * 2.0) and c["compute"] == pytest.approx(7.5)


def test_a_run_without_a_refresh_is_refused_naming_it():
    rows = _gradiveq(0)[:L_T - 1]                      # stopped inside the sampling phase
    with pytest.raises(ReportError, match=r"/runs/gradiveq-1.0: logged 4 of the 5 sampling"):
        cycle.cycle_of(_run("gradiveq", rows))
    with pytest.raises(ReportError, match="no compressed iteration"):
        cycle.cycle_of(_run("gradiveq", _gradiveq(0)))


def test_table_ratios_are_against_the_same_regime_and_claims_follow_the_regime():
    runs = [_run("rar", _flat(2.0)), _run("qsgd", _flat(1.0)), _run("gradiveq", _gradiveq(4)),
            _run("rar", _flat(2.0, compute=0.1), 1 / 6), _run("gradiveq", _gradiveq(4), 1 / 6)]
    df = cycle.cycle_table(runs)
    assert list(df["regime"]) == ["cpu"] * 3 + ["gpu"] * 2
    g = df[(df["method"] == "gradiveq") & (df["regime"] == "cpu")].iloc[0]
    assert g["rar/x agg"] == pytest.approx(30.0 / 9.0) and g["qsgd/x agg"] == pytest.approx(15.0 / 9.0)
    assert g["rar/x e2e"] == pytest.approx((30 + 7.5) / (9 + 7.5))
    gpu_rar = df[(df["method"] == "rar") & (df["regime"] == "gpu")].iloc[0]
    assert gpu_rar["agg share"] == pytest.approx(30 / (30 + 1.5))
    assert df[df["regime"] == "gpu"]["qsgd/x agg"].isna().all()          # no qsgd run in that regime
    cl = cycle.claims(df).set_index(["regime", "claim"])
    assert cl.loc[("cpu", "RAR / GradiVeQ aggregation"), "paper"] == 5.25
    assert cl.loc[("cpu", "RAR / GradiVeQ aggregation"), "gradiveq"] == pytest.approx(30 / 9)
    assert cl.loc[("cpu", "end-to-end cut vs RAR"), "gradiveq"] == pytest.approx(1 - 16.5 / 37.5)
    assert cl.loc[("gpu", "RAR aggregation share"), "gradiveq"] == pytest.approx(30 / 31.5)
    assert ("gpu", "RAR / GradiVeQ aggregation") not in cl.index   # a CPU-only claim


def test_preset_runs_then_cycle_report(tmp_path):
    """experiment=paper_time, shrunk (2 ranks, small CNN, L_t = 4), runs in virtual time and --cycle
    counts it: the table, its markdown with the clock named, and the bar figure are written."""
    shrink = ["world_size=2", "model=cnn", "model.width=4", "dataset.image_size=8", "dataset.n_train=256",
              "L_t=4", "iterations=7", "logger.progress=false"]
    for agg in ("rar", "gradiveq_pooled"):
        code, summary = launch_job(tmp_path / agg, "experiment=paper_time", f"aggregator={agg}", *shrink,
                                   *UNINTERRUPTED.get(agg, []))   # as gvq.bench paper runs it
        assert code == 0, summary
    out = tmp_path / "report"
    assert report_main(["cycle", str(tmp_path / "rar"), str(tmp_path / "gradiveq_pooled"), "--out", str(out)]) == 0
    df = pd.read_csv(out / "cycle.csv")
    assert sorted(df["method"]) == ["gradiveq_pooled", "rar"] and set(df["cycle"]) == {404}
    g = df.set_index("method").loc["gradiveq_pooled"]
    assert g["wire_ratio"] > 1 and g["rar/x agg"] > 0 and "x mean of 3 compressed" in g["counted"]
    md = (out / "cycle.md").read_text()
    assert "virtual time (compute ×1, codec ×1)" in md and "RAR / GradiVeQ aggregation" in md
    assert (out / "cycle.png").stat().st_size > 1000
