"""python -m gvq.bench method-cost: every_step's compute-only path against DiLoCo's non-sync steps, both
through train.step, paired over the non-sync iterations only.  What it measures is never asserted (a
benchmark, not a timed test): its pairing, its verdict's rule and its refusals are."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gvq.bench.__main__ import main as bench_main
from gvq.bench.method_cost import summarize
from tests.helpers.cli import refusal

ARGS = SimpleNamespace(model="cnn", batch_size=8, every=3, warmup=0)


def _raw(diloco: list[float], every_step: list[float], syncs: list[bool]) -> dict:
    def rows(seconds):
        return [{"iter_s": s, "compute_s": s / 2, "aggregate_s": 0.0} for s in seconds]
    return {"rows": {"diloco": rows(diloco), "every_step": rows(every_step)}, "syncs": syncs}


def test_the_ratio_pairs_non_sync_iterations_only_and_says_a_cost_only_beyond_its_interval():
    """Sync iterations (100x slower here) are left out of the pairs; a ratio whose interval reaches 1 is
    "no measurable cost", one wholly above 1 a cost."""
    syncs = [it % 3 == 2 for it in range(12)]
    same = summarize(_raw([100.0 if s else 1.0 + 0.01 * (it % 2) for it, s in enumerate(syncs)],
                          [1.005] * 12, syncs), ARGS, 1)
    assert same["pairs"] == 8 and same["sync_iters"] == 4 and same["diloco_sync_iter_s"] == 100.0
    assert same["ratio_lo"] <= 1 <= same["ratio_hi"] and same["verdict"] == "no measurable cost"
    dearer = summarize(_raw([1.2 + 0.01 * (it % 2) for it in range(12)], [1.0] * 12, syncs), ARGS, 1)
    assert dearer["ratio_lo"] > 1 and dearer["verdict"].startswith("costs 20.00%")


def test_too_few_non_sync_iterations_is_one_line():
    from gvq.bench import BenchError
    with pytest.raises(BenchError, match="1 non-sync iteration"):
        summarize(_raw([1.0, 1.0], [1.0, 1.0], [True, False]), ARGS, 1)


@pytest.mark.slow
def test_the_bench_runs_both_modes_through_train_step_and_prints_its_verdict(capsys):
    """One rank, 6 iterations at H = 3 (syncs after 2 and 5): 4 pairs, both modes' rows from train.step
    (compute_s inside iter_s, nothing aggregated on a step that sends nothing)."""
    (rec,) = bench_main(["method-cost", "iters=6", "warmup=0", "every=3", "batch_size=8"])
    assert (rec["pairs"], rec["sync_iters"], rec["N"], rec["clock"]) == (4, 2, 1, "wall")
    for mode in ("every_step", "diloco"):
        assert 0 < rec[f"{mode}_compute_s"] <= rec[f"{mode}_iter_s"] and rec[f"{mode}_aggregate_s"] == 0
    assert rec["ratio"] > 0 and rec["verdict"] in capsys.readouterr().out


@pytest.mark.parametrize("keys", [["every=1"], ["iters=1"], ["world_size=0"]])
def test_a_bad_key_is_one_line_before_any_rank_starts(keys, capsys):
    assert "method-cost: world_size >= 1, every >= 2" in refusal(bench_main, ["method-cost", *keys], capsys)
