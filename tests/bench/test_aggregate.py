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


def test_the_default_bench_is_the_grid_make_bench_names():
    """``make bench`` runs ``gvq.bench aggregate`` bare: its defaults are conf/grid/bench.yaml's, typed once
    there (not a list of flags in the Makefile); a flag given replaces its key; ``--bandwidth`` alone is
    one unshaped table (netns's ranks: the kernel shapes their links, not the emulator)."""
    from pathlib import Path

    from gvq.bench.aggregate import parse_aggregation_args
    from gvq.schema.compose import load_grid

    grid, args = load_grid("bench"), parse_aggregation_args([])
    assert (args.aggregators, args.world_size, args.bandwidth, args.set) == \
        (list(grid.settings), list(grid.world_sizes), list(grid.links_bps), list(grid.set))
    assert "powersgd:aggregator.rank=6" in args.set and args.world_size == [4]
    given = parse_aggregation_args(["--world-size", "2", "8", "--bandwidth", "--set", "lambda=0.05"])
    assert (given.world_size, given.bandwidth, given.set) == ([2, 8], [None], ["lambda=0.05"])
    make = Path(__file__).resolve().parents[2].joinpath("Makefile").read_text()
    recipe = make.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    assert "gvq.bench aggregate" in recipe and "--" not in recipe.split("#")[0], recipe


def test_netns_ranks_run_the_aggregation_bench_unshaped():
    """A namespaced rank's link is shaped by the kernel: the bench it runs emulates none (not the grid's)."""
    import argparse

    from gvq.bench.aggregate import parse_aggregation_args
    from gvq.bench.netns import aggregation_rank_argv
    argv = aggregation_rank_argv(argparse.Namespace(world_size=2, reps=3, model="cnn"), 1, "/tmp/x", "/tmp/x/r.json")
    assert argv[:2] == ["gvq.bench", "aggregate"]
    got = parse_aggregation_args(argv[2:])
    assert (got.bandwidth, got.world_size, got.rank, got.aggregators) == ([None], [2], 1, ["rar"])
