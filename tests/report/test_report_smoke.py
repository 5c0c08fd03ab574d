"""The report on a sweep of real (tiny) runs: every file, table values recomputed from the CSVs,
failed / incomplete runs marked, a non-run directory rejected with one line."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pandas as pd
import pytest

from tests.helpers.cli import ROOT, cli

pytestmark = pytest.mark.slow          # every test here starts processes (make test-fast skips them)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep") / "s"
    r = cli("-m", "aggregator=rar,signsgd", "iterations=20", "eval_every=10", "logger=csv",
            f"hydra.sweep.dir={d}")
    assert r.returncode == 0, r.stderr[-2000:]
    broken = d / "2"                                     # an incomplete run: killed, no summary
    shutil.copytree(d / "1", broken)
    (broken / "summary.json").unlink()
    lines = (broken / "metrics.csv").read_text().splitlines()[:8]
    (broken / "metrics.csv").write_text("\n".join(lines) + "\n")
    return d


def _report(*args):
    return subprocess.run([sys.executable, "-m", "gvq.report", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_report_writes_every_file_with_values_from_the_csvs(sweep):
    r = _report(sweep, "target_acc=0.5")
    assert r.returncode == 0, r.stderr[-2000:]
    out = sweep / "report"
    for name in ("report.html", "table.csv", "table.md", "curves.png", "breakdown.png"):
        assert (out / name).stat().st_size > 0
    table = pd.read_csv(out / "table.csv")
    for job, agg in (("0", "rar"), ("1", "signsgd")):
        m = pd.read_csv(sweep / job / "metrics.csv")
        row = table[(table.aggregator == agg) & (table.status == "completed")].iloc[0]
        assert row.aggregate_s_per_iter == pytest.approx(m.aggregate_s.mean(), rel=1e-6)
        assert row.bytes_per_iter == pytest.approx(m.bytes_sent.mean(), rel=1e-6)
        assert row.bytes_received_per_iter == pytest.approx(m.bytes_received.mean(), rel=1e-6)
        assert row.final_top1 == pytest.approx(m.test_acc.dropna().iloc[-1], abs=1e-6)
    rar = pd.read_csv(sweep / "0" / "metrics.csv").aggregate_s.mean()
    sign = table[(table.aggregator == "signsgd") & (table.status == "completed")].iloc[0]
    assert sign.aggregation_speedup == pytest.approx(rar / sign.aggregate_s_per_iter, rel=1e-6)
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64") >= 2 and "<table" in html and "received / iter" in html


def test_incomplete_run_is_marked_not_dropped(sweep):
    assert _report(sweep).returncode == 0
    table = pd.read_csv(sweep / "report" / "table.csv")
    assert (table.status != "completed").any()
    marks = " ".join(table.status.astype(str)) + " " + " ".join(table.reason.fillna("").astype(str))
    assert "incomplete" in marks


def test_non_run_directory_is_a_one_line_error(tmp_path):
    r = _report(tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
