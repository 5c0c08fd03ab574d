"""python -m gvq.bench train: every mode timed through the runner's own per-iteration path."""
from __future__ import annotations

import argparse
import gc

import pytest
import torch
import torch.distributed as dist

from gvq.bench.__main__ import main as bench_main
from tests.helpers.cli import refusal
from tests.helpers.records import assert_records_match


@pytest.mark.slow
def test_train_bench_interleaves_runner_and_ddp_modes_on_loopback(capsys):
    """gvq.bench train: every mode timed through the runner's path, PowerSGD only once compressed."""
    from gvq.bench import train as bench_train
    recs = bench_main(["train", "grid.world_sizes=[2]", "model=cnn", "iters=3", "warmup=1",
                       "grid.settings=[rar,ddp,ddp_powersgd,torch_ddp,local]",
                       "grid.set=[ddp_powersgd:aggregator.start_iter=2]"])
    assert_records_match(recs, "bench_train")                   # as the flags' version wrote them (issue 62)
    by = {r["aggregator"]: r for r in recs}
    assert list(by) == ["rar", "ddp", "ddp_powersgd", "torch_ddp", "local"]
    for r in recs:
        assert r["iters"] == 3 and r["warmup"] == 3             # warm-up raised to start_iter + 1
        assert r["iter_s"] > 0 and r["compute_s"] > 0 and r["ref"] == "torch_ddp"
        assert r["iter_s"] >= r["compute_s"]
    assert by["torch_ddp"]["over_ref"] == 1.0
    assert by["rar"]["aggregate_s"] > 0 and by["rar"]["MB_per_rank"] == 4 * 15_338 / 1e6
    # DDP communicates inside backward (its own lane), RAR after it: a fact of the path, not a race of times
    assert by["ddp"]["comm_s"] > 0 and by["rar"]["comm_s"] == 0
    assert by["ddp_powersgd"]["MB_per_rank"] < by["ddp"]["MB_per_rank"]   # timed in its compressed phase
    assert by["local"]["MB_per_rank"] == 0
    assert all(r["device"] == "cpu" and r["plan"] is None for r in recs)
    out = capsys.readouterr().out
    assert "unshaped loopback, N=2" in out and "interleaved" in out and "cpu, 1 thread/rank" in out
    assert bench_train.__name__ == "gvq.bench.train"


@pytest.mark.parametrize("keys, says", [
    (["rank=0", "grid.world_sizes=[2]"], "rank: needs one of grid.world_sizes, at most one of grid.links_bps, "
                                          "and init"),
    (["grid.settings=[rar,rar]"], "grid.settings: each mode once"),
    (["device=tpu"], "device=tpu: expected one of cpu, cuda"),
    (["net.clock=virtual", "grid.links_bps=[1e9]"], "net.clock=virtual: ddp, torch_ddp communicate outside"),
    (["net.latency_s=0.01"], "net.latency_s: this benchmark sets it"),
    (["iters=0"], "iters >= 1"),
    (["grid.world_sizes=[4,3]", "net.ranks_per_node=2", "net.intra_bandwidth_bps=1e12"],
     "net.ranks_per_node=2: must divide world_size=3"),
])
def test_a_bad_train_key_is_one_line_before_any_rank_starts(keys, says, capsys):
    assert says in refusal(bench_main, ["train", *keys], capsys)


def test_train_bench_ranks_sit_on_the_nets_nodes(monkeypatch):
    """``net.ranks_per_node=2``: each mode's aggregator is set up on the net's nodes (its intra links), as a
    run's is, so ``aggregator.topology=hierarchical`` times two-level rings, not a flat one."""
    from gvq.bench import train as bench_train
    from gvq.bench.__main__ import COMMANDS
    from gvq.comm.links import Cluster
    from gvq.schema.tool import parse_command
    seen = []

    class Recording:
        def setup(self, params, ctx):
            seen.append(ctx)

        def wrap(self, net):
            return net

    monkeypatch.setattr(bench_train, "make_aggregator", lambda option, overrides: Recording())
    monkeypatch.setattr(bench_train.EveryStep, "setup", lambda self, params, agg: None)
    argv = ["grid.world_sizes=[4]", "grid.settings=[rar]", "net.ranks_per_node=2", "net.intra_bandwidth_bps=1e12",
            "net.intra_latency_s=1e-6", "model=cnn"]
    args = bench_train.iteration_args(*reversed(parse_command("python -m gvq.bench train", COMMANDS["train"], argv)))
    bench_train._Mode(bench_train.mode_specs(args)[0], 3, 4, bench_train.with_run_defaults(args),
                      bench_train.workload(args), torch.device("cpu"))
    (ctx,) = seen
    assert (ctx.rank, ctx.world_size, ctx.cluster) == (3, 4, Cluster(2, 1e12, 1e-6))


def test_netns_train_ranks_run_the_train_bench_with_the_workload_and_no_emulated_link():
    """netns-train passes its workload keys on to the ranks it starts in namespaces; their links are the
    kernel's, so the bench each runs emulates none."""
    from types import SimpleNamespace

    from gvq.bench.__main__ import COMMANDS
    from gvq.bench.netns import rank_overrides
    from gvq.bench.train import iteration_args
    from gvq.schema.tool import parse_command
    given = SimpleNamespace(model="resnet20", num_classes=10, batch_size=8, iters=4, warmup=2, input_shape=[1, 28, 28],
                            aggregators=["rar", "ddp"], set=["ddp_powersgd:aggregator.rank=4"], timeout=600.0)
    argv = ["rank=1", "grid.world_sizes=[2]", "init=file:///tmp/x/rendezvous", *rank_overrides(given)]
    paths, cfg = parse_command("python -m gvq.bench train", COMMANDS["train"], argv)
    got = iteration_args(cfg, paths)
    assert (got.model, got.batch_size, got.iters, got.warmup, got.input_shape) == ("resnet20", 8, 4, 2, [1, 28, 28])
    assert (got.aggregators, got.set, got.links, got.rank, got.world_size) == \
        (["rar", "ddp"], ["ddp_powersgd:aggregator.rank=4"], [None], 1, [2])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no GPU is visible")
def test_train_bench_on_cuda_without_a_gpu_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        bench_main(["train", "grid.world_sizes=[2]", "device=cuda", "grid.settings=[rar]"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("gvq.bench: error: train device=cuda, N=2: device=cuda: ")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")
def test_train_bench_times_gpu_iterations():
    recs = bench_main(["train", "grid.world_sizes=[1,2]", "device=cuda", "model=resnet32", "num_classes=100",
                       "iters=3", "warmup=2", "grid.settings=[rar,qsgd,gradiveq,powersgd]", "compressed_only=true",
                       "grid.links_bps=[1e9]"])
    assert {r["device"] for r in recs} == {"cuda"} and all(r["iter_s"] >= r["compute_s"] > 0 for r in recs)


class _Probe:
    """A scripted mode: makes cyclic garbage enough for the interpreter to collect, inside its timed span,
    and notes whether automatic collection was on there."""

    def __init__(self, name: str, inside: list[bool]):
        self.name, self.inside, self.enabled = name, inside, []

    def iterate(self, x, y, it: int) -> list[float]:
        from gvq.bench.train import COLS
        self.inside[0] = True
        for _ in range(10 * max(gc.get_threshold()[0], 1)):
            cycle = []
            cycle.append(cycle)
        self.enabled.append(gc.isenabled())
        self.inside[0] = False
        return [float(it)] * len(COLS)


def test_no_garbage_collection_runs_inside_a_timed_iteration_only_between(tmp_path):
    """One rank (gloo, world size 1) through the bench's own loop: gc's callbacks see no collection start
    inside a mode's span, and one after every span; collection is on again afterwards."""
    from gvq.bench.train import COLS, time_rounds
    inside, starts = [False], []

    def seen(phase, info):
        if phase == "start":
            starts.append(inside[0])
    probes = [_Probe("a", inside), _Probe("b", inside)]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    gc.callbacks.append(seen)
    try:
        rows = time_rounds(probes, None, None, warmup=1, iters=3)
    finally:
        gc.callbacks.remove(seen)
        dist.destroy_process_group()
    assert all(p.enabled == [False] * 4 for p in probes)
    assert True not in starts and len(starts) >= 2 * 4                 # collected between spans only
    assert rows == {p.name: [dict.fromkeys(COLS, float(it)) for it in (1, 2, 3)] for p in probes}
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_each_modes_seconds_and_its_paired_ratio_to_the_reference_carry_intervals():
    """Scripted rows, seconds per iteration first (as COLS): the reference's ratio to itself is exactly 1;
    a mode twice as slow in every iteration reads 2 with a point interval, whatever the load did."""
    from gvq.bench.train import COLS, summarize_iterations
    ddp = [0.10, 0.12, 0.11, 0.30, 0.10, 0.11]
    rows = {"ddp": [{**dict.fromkeys(COLS, 0.0), "iter_s": s} for s in ddp],
            "rar": [{**dict.fromkeys(COLS, 0.0), "iter_s": 2 * s} for s in ddp]}
    by = {r["aggregator"]: r for r in summarize_iterations({"rows": rows, "warmup": 1},
                                                           argparse.Namespace(model="cnn", batch_size=4), 2, "x")}
    assert by["ddp"]["ref"] == "ddp" and (by["ddp"]["over_ref_lo"], by["ddp"]["over_ref_hi"]) == (1.0, 1.0)
    assert (by["rar"]["over_ref"], by["rar"]["over_ref_lo"], by["rar"]["over_ref_hi"]) == (2.0, 2.0, 2.0)
    assert by["ddp"]["iter_lo_s"] <= by["ddp"]["iter_s"] <= by["ddp"]["iter_hi_s"] < 0.30


def test_each_record_names_the_setting_its_mode_ran():
    """A record's ``setting`` carries the values ``grid.set`` gave its option (``aggregator`` stays the
    mode): PowerSGD at rank 6 is ``powersgd rank=6``; a mode of a spec (the overlap bench's) its spec's."""
    from gvq.bench.train import COLS, ModeSpec, summarize_iterations
    rows = {m: [{**dict.fromkeys(COLS, 0.0), "iter_s": 0.1}] for m in ("powersgd", "local", "rar_overlap")}
    args = argparse.Namespace(model="cnn", batch_size=4, set=["powersgd:aggregator.rank=6", "K=x1"],
                              specs=[ModeSpec("rar_overlap", "rar", ("aggregator.overlap=true",))])
    recs = summarize_iterations({"rows": rows, "warmup": 1}, args, 2, "x")
    assert [(r["aggregator"], r["setting"]) for r in recs] == [
        ("powersgd", "powersgd rank=6"), ("local", "local"), ("rar_overlap", "rar")]


@pytest.mark.slow
def test_train_bench_times_the_language_model_on_token_windows(capsys):
    """model=gpt_tiny: every rank steps on windows of its context's tokens (a vocabulary of 256), through
    the runner's path for rar and alone for compute; the bytes are the transformer's gradient."""
    recs = bench_main(["train", "grid.world_sizes=[2]", "model=gpt_tiny", "num_classes=256", "batch_size=2",
                       "iters=1", "warmup=0", "grid.settings=[rar,local]"])
    by = {r["aggregator"]: r for r in recs}
    assert by["rar"]["MB_per_rank"] == pytest.approx(4 * 834_304 / 1e6) and by["local"]["MB_per_rank"] == 0
    assert all(r["iter_s"] >= r["compute_s"] > 0 and r["model"] == "gpt_tiny" for r in recs)
