"""python -m gvq.bench aggregate runs and reports what it claims (no timing targets: those are the
benchmark's own output)."""
from __future__ import annotations

import json

import pytest

from gvq.bench.__main__ import main as bench_main


@pytest.mark.slow
def test_aggregate_bench_writes_records_with_bounds(tmp_path, capsys):
    out = tmp_path / "r.json"
    bench_main(["aggregate", "--model", "cnn", "--num-classes", "10", "--world-size", "2", "--reps", "3",
                "--warmup", "1", "--aggregators", "rar", "allreduce", "--bandwidth", "5e8",
                "--out", str(out)])
    recs = json.loads(out.read_text())
    assert [r["aggregator"] for r in recs] == ["rar"]          # gloo's collective is not shaped
    r = recs[0]
    for key in ("aggregator", "world_size", "bandwidth_bps", "bytes_per_rank", "median_s", "min_s", "bound_s"):
        assert key in r
    n_params = 15_338                                           # DigitsCNN(width=16), 10 classes
    assert r["bytes_per_rank"] == 4 * n_params                  # 2 ranks: 2(N-1)/N * S = S
    assert r["bound_s"] == pytest.approx(4 * n_params * 8 / 5e8)
    assert r["median_s"] >= r["min_s"] and r["min_s"] >= 0.9 * r["bound_s"]
    assert "aggregation: model=cnn, N=2" in capsys.readouterr().out


def test_bad_bench_flags_exit_with_usage():
    with pytest.raises(SystemExit):
        bench_main(["aggregate", "--bandwidth", "0"])
