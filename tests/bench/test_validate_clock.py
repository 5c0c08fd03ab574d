"""python -m gvq.bench clock (V1-V3): pairs the right figures and flags the right cases (the runs
themselves are benchmarks: replaced here by fixed records)."""
from __future__ import annotations

import argparse

import pytest

from gvq.bench import validate_clock as V


def _records(scale: float, world: int = 2) -> dict:
    return {a: {"median_s": 0.1 * scale, "iter_s": 0.5 * scale, "compress_s": 0.01 * scale * world,
                "decompress_s": 0.02 * scale} for a in V.AGGREGATORS}


def test_validation_pairs_wall_and_virtual_and_flags_out_of_band(monkeypatch):
    def aggregation(args, world, bw, clock, pin=False):
        if world == 4:
            return _records(1.0, world=4)             # compress doubles at N = 4: out of the 15% band
        return _records({"wall": 1.0, "virtual": 0.95}[clock] * (2.0 if pin and clock == "wall" else 1.0))

    monkeypatch.setattr(V, "_aggregation", aggregation)
    monkeypatch.setattr(V, "_iterations", lambda args, bw, clock, pin=False: _records(1.0 if clock == "wall" else 0.8))
    monkeypatch.setattr(V.shutil, "which", lambda name: "/usr/bin/taskset")
    rows = V.validate_clock(argparse.Namespace(bandwidth=[5e7], model="cnn", reps=1, iters=1))
    by = {(r["check"], r["what"], r["aggregator"]): r for r in rows}
    v1_agg, v1_iter = by[("V1", "aggregation", "qsgd")], by[("V1", "iteration", "rar")]
    assert v1_agg["ratio"] == pytest.approx(0.95) and v1_agg["within"]
    assert v1_iter["ratio"] == pytest.approx(0.8) and not v1_iter["within"]
    assert by[("V2 (wall, for scale)", "aggregation, 1 core", "rar")]["ratio"] == pytest.approx(2.0)
    assert by[("V2", "aggregation, 1 core", "rar")]["within"]
    qd = by[("V3", "decompress_s per iteration, N=4", "qsgd")]        # (2N-1)/N of the vector: 7/4 vs 3/2
    assert qd["quiet_s"] == pytest.approx(0.02 * 0.95 * (7 / 4) / (3 / 2))
    assert not by[("V3", "compress_s per iteration, N=4", "gradiveq_bf16")]["within"]
    assert ("V3", "compress_s per iteration, N=4", "rar") not in by   # no codec


@pytest.mark.parametrize("pin", [False, True])
def test_each_check_runs_the_benches_on_the_clock_grid_as_keys(monkeypatch, pin):
    """The keys V1-V3 pass ``gvq.bench aggregate`` and ``train`` compose against each command's schema and
    carry the clock grid's settings, the cell's world size and link, and the clock being checked."""
    from gvq.bench.__main__ import COMMANDS
    from gvq.schema.tool import compose_command
    seen = []
    monkeypatch.setattr(V, "run_bench", lambda sub, keys, p=False: seen.append(
        (sub, compose_command(COMMANDS[sub], keys), p)) or [])
    args = argparse.Namespace(model="cnn", reps=2, iters=3)
    V._aggregation(args, 4, 5e7, "virtual", pin)
    V._iterations(args, 2e8, "wall", pin)
    (_, agg, p1), (_, it, p2) = seen
    assert (p1, p2) == (pin, pin)
    assert (list(agg.grid.world_sizes), list(agg.grid.links_bps), agg.net.clock.name, agg.reps) == \
        ([4], [5e7], "virtual", 2)
    assert (list(it.grid.world_sizes), list(it.grid.links_bps), it.net.clock.name, it.iters, it.compressed_only) == \
        ([2], [2e8], "wall", 3, True)
    assert all(list(c.grid.settings) == list(V.AGGREGATORS) and list(c.grid.set) == list(V.SETTINGS)
               for c in (agg, it))
