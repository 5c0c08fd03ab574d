"""python -m gvq.bench aggregate runs and reports what it claims (no timing targets: those are the
benchmark's own output)."""
from __future__ import annotations

import json

import pytest

from gvq.bench.__main__ import main as bench_main
from tests.helpers.cli import refusal
from tests.helpers.records import assert_records_match


@pytest.mark.slow
def test_aggregate_bench_writes_records_with_bounds(tmp_path, capsys):
    out = tmp_path / "r.json"
    bench_main(["aggregate", "model=cnn", "num_classes=10", "grid.world_sizes=[2]", "reps=3", "warmup=1",
                "grid.settings=[rar,allreduce]", "grid.links_bps=[5e8]", "--out", str(out)])
    recs = json.loads(out.read_text())
    assert_records_match(recs, "bench_aggregate")              # as the flags' version wrote them (issue 62)
    assert [r["aggregator"] for r in recs] == ["rar"]          # gloo's collective is not shaped
    r = recs[0]
    for key in ("aggregator", "world_size", "bandwidth_bps", "bytes_per_rank", "median_s", "min_s", "bound_s"):
        assert key in r
    n_params = 15_338                                           # DigitsCNN(width=16), 10 classes
    assert r["bytes_per_rank"] == 4 * n_params                  # 2 ranks: 2(N-1)/N * S = S
    assert r["bound_s"] == pytest.approx(4 * n_params * 8 / 5e8)
    assert r["median_s"] >= r["min_s"] and r["min_s"] >= 0.9 * r["bound_s"]
    assert "aggregation: model=cnn, N=2" in capsys.readouterr().out


@pytest.mark.parametrize("keys, says", [
    (["grid.links_bps=[0]"], "grid.links_bps: each > 0"),
    (["net.bandwidth_bps=1e9"], "net.bandwidth_bps: this benchmark sets it"),
    (["grid.world_sizes=[3]", "net.ranks_per_node=2", "net.intra_bandwidth_bps=1e12"],
     "net.ranks_per_node=2: must divide world_size=3"),
    (["net.clock=virtual", "grid.links_bps=[]"], "net.clock=virtual: there is no link model"),
    (["net.compute_scale=0.5"], "net.compute_scale=0.5: scales apply to the virtual clock only"),
    (["rank=0"], "rank: needs one of grid.world_sizes"),
    (["world_size=2"], "world_size"),
])
def test_a_bad_key_is_one_line_before_any_rank_starts(keys, says, capsys):
    assert says in refusal(bench_main, ["aggregate", *keys], capsys)


def _args(keys):
    from gvq.bench.__main__ import COMMANDS
    from gvq.bench.aggregate import aggregation_args
    from gvq.schema.tool import parse_command
    paths, cfg = parse_command("python -m gvq.bench aggregate", COMMANDS["aggregate"], keys)
    return aggregation_args(cfg, paths)


def test_the_default_bench_is_the_grid_make_bench_names():
    """``make bench`` runs ``gvq.bench aggregate`` bare: its defaults are conf/grid/bench.yaml's, typed once
    there (not a list of flags in the Makefile); a key given replaces its own; ``grid.links_bps=[]`` is
    one unshaped table (netns's ranks: the kernel shapes their links, not the emulator)."""
    from pathlib import Path

    from gvq.schema.compose import load_grid

    grid, args = load_grid("bench"), _args([])
    assert (args.aggregators, args.world_size, args.bandwidth, args.set) == \
        (list(grid.settings), list(grid.world_sizes), list(grid.links_bps), list(grid.set))
    assert "powersgd:aggregator.rank=6" in args.set and args.world_size == [4]
    given = _args(["grid.world_sizes=[2,8]", "grid.links_bps=[]", "grid.set=[lambda=0.05]", "net.latency_s=0.001"])
    assert (given.world_size, given.bandwidth, given.set, given.latency) == ([2, 8], [None], ["lambda=0.05"], 0.001)
    make = Path(__file__).resolve().parents[2].joinpath("Makefile").read_text()
    recipe = make.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    assert "gvq.bench aggregate" in recipe and "--" not in recipe.split("#")[0], recipe


def test_netns_ranks_run_the_aggregation_bench_unshaped():
    """A namespaced rank's link is shaped by the kernel: the bench it runs emulates none (not the grid's)."""
    from types import SimpleNamespace

    from gvq.bench.netns import aggregation_rank_argv
    argv = aggregation_rank_argv(SimpleNamespace(world_size=2, reps=3, model="cnn"), 1, "/tmp/x", "/tmp/x/r.json")
    assert argv[:2] == ["gvq.bench", "aggregate"]
    got = _args(argv[2:])
    assert (got.bandwidth, got.world_size, got.rank, got.aggregators, got.set) == ([None], [2], 1, ["rar"], [])
    assert (got.init, got.reps, got.model, str(got.out)) == ("file:///tmp/x/rendezvous", 3, "cnn", "/tmp/x/r.json")
