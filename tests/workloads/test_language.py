"""Text: bits per byte are nats per token over ln 2 and over the bytes a token holds; a synthetic batch is
windows of ids of the workload's context."""
from __future__ import annotations

import math

import pytest
import torch

from gvq.workloads import LanguageModelling


def test_bits_per_byte_is_nats_per_token_over_ln2_and_bytes_per_token():
    work = LanguageModelling(256, 64, bytes_per_token=2.0)
    row = {"test_loss": math.log(2) * 3.0}
    work.row_metrics(row, targets=1000, step_s=0.5)
    assert row["test_bpb"] == pytest.approx(1.5) and row["tokens_per_second"] == pytest.approx(2000)
    assert work.bits_per_byte(math.log(2)) == pytest.approx(0.5)
    row = {}
    work.row_metrics(row, targets=1000, step_s=0.0)                      # no evaluation, no time: NaN
    assert list(row) == ["tokens_per_second"] and math.isnan(row["tokens_per_second"])
    assert work.extra_fields == ("test_bpb", "tokens_per_second")


def test_the_summary_reports_bits_per_byte_and_tokens_per_second_of_the_whole_run():
    work = LanguageModelling(256, 64, bytes_per_token=1.0)
    got = work.summary_metrics(math.log(2) * 2.0, samples=100, wall_s=4.0)     # 100 windows of 64 tokens
    assert got == {"final_test_bpb": pytest.approx(2.0), "tokens_per_second": pytest.approx(1600.0)}


def test_a_synthetic_batch_is_windows_of_ids_and_a_next_token_per_position():
    work = LanguageModelling(50, 12)
    x, y = work.synthetic_batch(3, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (3, 12) and x.dtype == y.dtype == torch.int64
    assert int(x.max()) < 50 and int(y.max()) < 50 and work.in_channels == 1 and work.context == 12
