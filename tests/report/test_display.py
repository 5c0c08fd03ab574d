"""gvq/report/display.py: the notes under the summary table say what its figures are: a default target, a
missing baseline, and seconds measured on unshaped loopback, which are the host's, not a link's."""
from __future__ import annotations

import json
from pathlib import Path

from gvq.report.__main__ import main


def _run(d: Path, agg: str, net: dict) -> None:
    """A finished run on ``net`` (its config's): 20 iterations, test accuracy 0.95 from iteration 9."""
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"status": "completed", "job_type": agg,
                                                "overrides": [f"aggregator={agg}"],
                                                "config": {"world_size": 2, "net": net}}))
    rows = ["iteration,phase,compute_s,aggregate_s,bytes_sent,wall_s,train_loss,test_acc"]
    rows += [f"{i},{agg},0.01,0.01,1000,{0.02 * (i + 1)},1.0,{0.95 if i % 10 == 9 else ''}" for i in range(20)]
    (d / "metrics.csv").write_text("\n".join(rows) + "\n")


def test_wall_clock_time_on_unshaped_loopback_is_labelled_as_the_hosts(tmp_path):
    """The main report's time to target on unshaped loopback read like an answer: table.md and report.html
    now say the clock, that loopback without shaping measures the host, and where priced time comes from."""
    _run(tmp_path / "loop" / "0", "rar", {"clock": "wall", "bandwidth_bps": None})
    assert main([str(tmp_path / "loop"), "target_acc=0.9"]) == 0
    md = (tmp_path / "loop" / "report" / "table.md").read_text()
    assert "wall clock over unshaped loopback" in md and "measure this host" in md
    assert "python -m gvq.report tta RUNS --bench" in md
    page = (tmp_path / "loop" / "report" / "report.html").read_text()
    assert "unshaped loopback" in page and "gvq.report tta RUNS --bench" in page
    _run(tmp_path / "shaped" / "0", "rar", {"clock": "virtual", "bandwidth_bps": 1e8, "compute_scale": 1.0})
    assert main([str(tmp_path / "shaped"), "target_acc=0.9"]) == 0
    assert "loopback" not in (tmp_path / "shaped" / "report" / "table.md").read_text()


def test_a_group_without_its_rar_baseline_is_named_under_the_table(tmp_path):
    _run(tmp_path / "s" / "0", "qsgd", {"clock": "wall"})
    assert main([str(tmp_path / "s"), "target_acc=0.9"]) == 0
    md = (tmp_path / "s" / "report" / "table.md").read_text()
    assert "No completed rar run of its setting: qsgd: speed-ups and compression ratio —" in md
