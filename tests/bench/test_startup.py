"""python -m gvq.bench startup: a real 1-iteration CLI run, split by the stamps in its summary.json."""
from __future__ import annotations

import pytest

from gvq.bench.__main__ import main as bench_main
from gvq.bench.startup import PHASES

pytestmark = pytest.mark.slow          # every test here starts processes (make test-fast skips them)


def test_startup_split_adds_up_to_the_total_and_prints_its_setting(capsys, tmp_path):
    out = tmp_path / "r.json"
    rows = bench_main(["startup", "reps=1", "loggers=[csv]", "start=[forkserver]", "--out", str(out)])
    (row,) = rows
    phases = [p for p, _, _ in PHASES]
    assert (row["logger"], row["start"], row["runs"]) == ("csv", "forkserver", 1)
    assert all(row[p] >= 0 for p in phases), row
    assert sum(row[p] for p in phases) == pytest.approx(row["total"], abs=1e-6)   # nothing unaccounted
    printed = capsys.readouterr().out
    assert "python cli.py world_size=2 iterations=1" in printed and "wall clock, median of 1" in printed
    assert out.exists()
