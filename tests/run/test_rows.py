"""gvq/run/rows.py on 3 gloo ranks: how one iteration's row is reduced from every rank's statistics (times:
the slowest rank's; loss / accuracy: the mean; an overlapped aggregator's exposed communication: the rank
that ended backward last, with the others' wait for it as straggle_s)."""
from __future__ import annotations

import pytest

from gvq.run.rows import reduce_row
from tests.helpers.dist import run_ranks

BASE = {"aggregate_s": 0.0, "compress_s": 0.0, "decompress_s": 0.0, "wire_s": 0.0, "stage_s": 0.0, "skipped": 0}


def _post_backward(rank, world):
    return reduce_row({**BASE, "compute_s": 0.1 * (rank + 1), "bytes_sent": 100 * rank,
                       "train_loss": float(rank), "train_acc": 0.5, "phase": f"rank {rank}"})


def _overlapped(rank, world):
    # rank 2 ends backward 30 ms after rank 0: every ring ends together, so rank 0 waits 30 ms longer
    exposed = {0: 0.050, 1: 0.035, 2: 0.020}[rank]
    last = {0: 0.022, 1: 0.019, 2: 0.018}[rank]
    return reduce_row({**BASE, "compute_s": 0.1, "bytes_sent": 10, "train_loss": 1.0, "train_acc": 1.0,
                       "comm_s": 0.06 + 0.01 * rank, "exposed_s": exposed, "last_bucket_s": last, "buckets": 2})


def test_post_backward_rows_take_the_slowest_rank_and_the_mean_loss(tmp_path):
    rows = run_ranks(_post_backward, 3, tmp_path)
    for rank, row in enumerate(rows):
        assert row["compute_s"] == pytest.approx(0.3) and row["bytes_sent"] == 200
        assert row["train_loss"] == pytest.approx(1.0) and row["train_acc"] == pytest.approx(0.5)
        assert row["phase"] == f"rank {rank}"                 # not reduced: the rank's own
        assert "straggle_s" not in row


def test_overlapped_rows_read_exposed_at_the_last_rank_to_end_backward(tmp_path):
    for row in run_ranks(_overlapped, 3, tmp_path):
        assert row["exposed_s"] == pytest.approx(0.020)       # rank 2: its backward ended last
        assert row["last_bucket_s"] == pytest.approx(0.018)
        assert row["straggle_s"] == pytest.approx(0.030)      # rank 0 waited that much for rank 2's backward
        assert row["comm_s"] == pytest.approx(0.08)           # the slowest rank's
        assert row["comm_s"] >= row["exposed_s"] >= row["last_bucket_s"]


def _uneven(rank, world):
    # rank 1 ends backward last (smallest exposed_s) but rank 0 has the smallest last_bucket_s
    exposed = {0: 0.050, 1: 0.010, 2: 0.020}[rank]
    last = {0: 0.001, 1: 0.009, 2: 0.004}[rank]
    return reduce_row({**BASE, "compute_s": 0.1, "bytes_sent": 10, "train_loss": 1.0, "train_acc": 1.0,
                       "comm_s": 0.06, "exposed_s": exposed, "last_bucket_s": last, "buckets": 2})


def test_the_last_rank_to_end_backwards_values_come_from_that_one_rank(tmp_path):
    for row in run_ranks(_uneven, 3, tmp_path):
        assert row["exposed_s"] == pytest.approx(0.010) and row["last_bucket_s"] == pytest.approx(0.009)
        assert row["straggle_s"] == pytest.approx(0.040)
