"""Benchmarks run and report what they claim (no timing targets here: those are for gvq.bench)."""
from __future__ import annotations

import json

import pytest

from gvq import bench, netns


def test_aggregate_bench_writes_records_with_bounds(tmp_path, capsys):
    out = tmp_path / "r.json"
    bench.main(["aggregate", "--model", "cnn", "--num-classes", "10", "--world-size", "2", "--reps", "3",
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
        bench.main(["aggregate", "--bandwidth", "0"])


@pytest.mark.skipif(netns.available() is not None, reason=f"kernel shaping: {netns.available()}")
def test_kernel_shaped_ring_is_bounded_by_the_link(tmp_path):
    """Root only: per-rank veth + tbf really shape (a ring cannot beat its links), and the emulator
    comparison runs end to end."""
    rows = netns.main(["--rates", "2e8", "--world-size", "2", "--reps", "3", "--model", "resnet20",
                       "--out", str(tmp_path / "n.json")])
    (row,) = rows
    assert row["kernel_over_bound"] >= 0.9 and row["emulated_over_bound"] >= 0.9
    assert 0.2 < row["emulated_over_kernel"] < 5


def test_train_bench_interleaves_runner_and_ddp_modes_on_loopback(capsys):
    """gvq.bench train: every mode timed through the runner's path, PowerSGD only once compressed."""
    from gvq import bench_train
    recs = bench.main(["train", "--world-size", "2", "--model", "cnn", "--iters", "3", "--warmup", "1",
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
        bench.main(["train", "--rank", "0", "--world-size", "2"])


def test_nonfinite_check_is_one_reduction_and_still_exact(monkeypatch):
    """The per-iteration non-finite check (gvq.train.nonfinite) is a sum, not an elementwise
    isfinite scan (~40x the cost on a ResNet gradient), yet names NaN / +-Inf and ignores finite
    values whose sum overflows."""
    import torch

    from gvq import train
    from gvq.aggregate import RingAllReduce, RunContext

    class _NoDist(RingAllReduce):
        def setup(self, params, ctx):          # the bucket only: no P2P, no process group
            self.params, self.ctx = list(params), ctx
            self.bucket = self._grad_bucket()

    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    agg = _NoDist()
    agg.setup(list(net.parameters()), RunContext(0, 1))
    ddp_like = type("NoBucket", (), {})()      # aggregators without a flat buffer (torch DDP)

    calls = []
    real = torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: calls.append(t.numel()) or real(t))
    assert train.nonfinite(net, agg) is None and train.nonfinite(net, ddp_like) is None
    assert calls == []                         # finite gradient: no elementwise scan at all
    monkeypatch.setattr(torch, "isfinite", real)

    for bad in (float("nan"), float("inf"), -float("inf")):
        net[1].weight.grad[0, 1] = bad
        assert train.nonfinite(net, agg) == "1.weight"
        assert train.nonfinite(net, ddp_like) == "1.weight"
        net[1].weight.grad[0, 1] = 1.0
    net[0].bias.grad[0], net[1].bias.grad[0] = float("inf"), -float("inf")   # sum is NaN
    assert train.nonfinite(net, agg) == "0.bias"
    net[0].bias.grad[0] = net[1].bias.grad[0] = 3e38                         # sum overflows, all finite
    assert train.nonfinite(net, agg) is None and train.nonfinite(net, ddp_like) is None
