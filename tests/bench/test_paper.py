"""The paper-table driver (gvq/bench/paper.py): the 850/650 link solved from one run, job dirs, completed
jobs kept, and the command a job runs."""
from __future__ import annotations

import pytest

from gvq.bench import paper
from gvq.bench import BenchError


def test_solve_bandwidth_puts_rar_aggregation_at_the_papers_ratio_of_compute():
    # 1 MB a rank = 8 Mbit: 0.8 s of wire at 10 Mbit/s; 0.9 s measured => 0.1 s is not the wire
    bps = paper.solve_bandwidth(compute_s=0.65, aggregate_s=0.9, bytes_sent=1e6, bps=1e7)
    assert bps == pytest.approx(8e6 / (0.85 - 0.1), rel=5e-3)          # 3 significant digits
    assert 0.1 + 8e6 / bps == pytest.approx(850 / 650 * 0.65, rel=5e-3)


def test_solve_bandwidth_refuses_when_no_link_can_reach_the_ratio():
    with pytest.raises(BenchError, match="no link gives the paper's ratio"):
        paper.solve_bandwidth(compute_s=0.1, aggregate_s=1.0, bytes_sent=1e3, bps=1e9)


def test_completed_jobs_are_kept_and_others_run_the_preset(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(paper.subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    done = paper.job_dir(tmp_path, 6, 5.26e7, 1 / 6, "rar")
    assert done == tmp_path / "N6-52.6Mbps-compute0.166667" / "rar"
    done.mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    assert paper.run_job(tmp_path, 6, 5.26e7, 1 / 6, "rar", 12) == done and calls == []
    paper.run_job(tmp_path, 8, 1e9, 1.0, "gradiveq", 110, ["seed=1"])
    (cmd,) = calls
    assert cmd[2:] == ["experiment=paper_time", "aggregator=gradiveq", "world_size=8", "net.bandwidth_bps=1e+09",
                       "net.compute_scale=1", "iterations=110", "aggregator.monitor_threshold=null",
                       f"hydra.run.dir={tmp_path / 'N8-1000Mbps-compute1' / 'gradiveq'}", "seed=1"]
    paper.run_job(tmp_path, 6, 5.26e7, 1 / 6, "rar", 12, force=True)
    assert len(calls) == 2                                               # --force reruns a completed job


def test_read_columns_takes_medians_after_start_up(tmp_path):
    rows = ["compute_s,aggregate_s,bytes_sent"] + ["9,9,5"] * 2 + ["1,2,5", "3,4,5", "2,3,5"]
    (tmp_path / "metrics.csv").write_text("\n".join(rows) + "\n")
    assert paper.read_columns(tmp_path) == {"compute_s": 2.0, "aggregate_s": 3.0, "bytes_sent": 5.0}


def test_the_command_runs_every_cell_of_its_grid_then_the_cycle_report(tmp_path, monkeypatch):
    """``gvq.bench paper`` with keys: world sizes x links (auto: the solved one) x compute scales x methods,
    GradiVeQ's runs long enough for a whole cycle; then one ``gvq.report cycle`` over them."""
    from gvq.bench.__main__ import main as bench_main
    jobs, reports = [], []
    monkeypatch.setattr(paper, "calibrate_link", lambda args: 5.26e7)
    monkeypatch.setattr(paper, "run_job", lambda out, w, bps, scale, method, iters, extra, force: jobs.append(
        (w, bps, scale, method, iters, list(extra), force)) or out / method)
    monkeypatch.setattr(paper.subprocess, "run", lambda cmd, **kw: reports.append(cmd))
    links = bench_main(["paper", "links=[auto,1e9]", "grid.world_sizes=[8]", "grid.compute_scales=[1]",
                        "grid.settings=[rar,gradiveq]", "grid.set=[seed=1]", "force=true", "--out", str(tmp_path)])
    assert links == [5.26e7, 1e9]
    assert jobs == [(8, 5.26e7, 1.0, "rar", 12, ["seed=1"], True), (8, 5.26e7, 1.0, "gradiveq", 110, ["seed=1"], True),
                    (8, 1e9, 1.0, "rar", 12, ["seed=1"], True), (8, 1e9, 1.0, "gradiveq", 110, ["seed=1"], True)]
    (report,) = reports
    assert report[2:4] == ["gvq.report", "cycle"] and report[-2:] == ["--out", str(tmp_path / "report")]


def test_a_link_that_is_neither_a_rate_nor_auto_is_one_line(capsys):
    from gvq.bench.__main__ import main as bench_main
    with pytest.raises(SystemExit) as e:
        bench_main(["paper", "links=[fast]"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == "gvq.bench: error: links=fast: each bit/s > 0 or auto\n"
