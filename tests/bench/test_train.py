"""python -m gvq.bench train: every mode timed through the runner's own per-iteration path."""
from __future__ import annotations

import pytest

from gvq.bench.__main__ import main as bench_main


def test_train_bench_interleaves_runner_and_ddp_modes_on_loopback(capsys):
    """gvq.bench train: every mode timed through the runner's path, PowerSGD only once compressed."""
    from gvq.bench import train as bench_train
    recs = bench_main(["train", "--world-size", "2", "--model", "cnn", "--iters", "3", "--warmup", "1",
                       "--aggregators", "rar", "ddp", "ddp_powersgd", "torch_ddp", "local",
                       "--set", "ddp_powersgd:aggregator.start_iter=2"])
    by = {r["aggregator"]: r for r in recs}
    assert list(by) == ["rar", "ddp", "ddp_powersgd", "torch_ddp", "local"]
    for r in recs:
        assert r["iters"] == 3 and r["warmup"] == 3             # warm-up raised to start_iter + 1
        assert r["iter_s"] > 0 and r["compute_s"] > 0 and r["ref"] == "torch_ddp"
        assert r["iter_s"] >= r["compute_s"]
    assert by["torch_ddp"]["over_ref"] == 1.0
    assert by["rar"]["aggregate_s"] > 0 and by["rar"]["MB_per_rank"] == 4 * 15_338 / 1e6
    assert by["ddp"]["aggregate_s"] < by["rar"]["aggregate_s"]   # DDP communicates inside backward
    assert by["ddp_powersgd"]["MB_per_rank"] < by["ddp"]["MB_per_rank"]   # timed in its compressed phase
    assert by["local"]["MB_per_rank"] == 0
    out = capsys.readouterr().out
    assert "unshaped loopback, N=2" in out and "interleaved" in out
    assert bench_train.DEFAULT_MODES[0] == "rar"


def test_train_bench_rank_mode_needs_init():
    with pytest.raises(SystemExit):
        bench_main(["train", "--rank", "0", "--world-size", "2"])
