"""python -m gvq.bench train: every mode timed through the runner's own per-iteration path."""
from __future__ import annotations

import pytest
import torch

from gvq.bench.__main__ import main as bench_main


@pytest.mark.slow
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
    assert all(r["device"] == "cpu" and r["plan"] is None for r in recs)
    out = capsys.readouterr().out
    assert "unshaped loopback, N=2" in out and "interleaved" in out and "cpu, 1 thread/rank" in out
    assert bench_train.DEFAULT_MODES[0] == "rar"


def test_train_bench_rank_mode_needs_init():
    with pytest.raises(SystemExit):
        bench_main(["train", "--rank", "0", "--world-size", "2"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no GPU is visible")
def test_train_bench_on_cuda_without_a_gpu_is_one_line():
    with pytest.raises(SystemExit, match="--device cuda --world-size 2: device=cuda: "):
        bench_main(["train", "--world-size", "2", "--device", "cuda", "--aggregators", "rar"])


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")
def test_train_bench_times_gpu_iterations():
    recs = bench_main(["train", "--world-size", "1", "2", "--device", "cuda", "--model", "resnet32",
                       "--num-classes", "100", "--iters", "3", "--warmup", "2", "--aggregators", "rar", "qsgd",
                       "gradiveq", "powersgd", "--compressed-only", "--bandwidth", "1e9"])
    assert {r["device"] for r in recs} == {"cuda"} and all(r["iter_s"] >= r["compute_s"] > 0 for r in recs)
