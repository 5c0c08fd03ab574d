"""gvq/hooks/layout.py in one process: a bucket is averaged with its parameters in the aggregator's
order and written back in DDP's; a recorded layout cuts a fresh DDP's single bucket into the recorded
groups, and is ignored where it does not cover the bucket."""
from __future__ import annotations

import torch

from gvq.hooks.layout import groups, reduce_bucket


class _Recorder:
    """An aggregator stand-in that records the vectors it is asked to average (and doubles them)."""

    def __init__(self, sizes):
        self.params = [torch.zeros(n) for n in sizes]
        self.seen = []

    def average_bucket_(self, flat, params, iteration):
        self.seen.append((list(params), flat.clone()))
        flat.mul_(2)
        return {"aggregate_s": 1.0}


def test_a_bucket_is_averaged_in_parameter_order_and_written_back_in_ddps():
    agg = _Recorder([2, 3, 1])
    flat = torch.arange(6.0)                     # DDP's order: parameter 2 (1 value), 0 (2), 1 (3)
    out = reduce_bucket(agg, flat, [2, 0, 1], iteration=0)
    assert agg.seen[0][0] == [0, 1, 2]
    torch.testing.assert_close(agg.seen[0][1], torch.tensor([1.0, 2, 3, 4, 5, 0]))
    torch.testing.assert_close(flat, 2 * torch.arange(6.0))
    assert [(g, n) for g, n, _ in out] == [([2, 0, 1], 6)]


def test_a_recorded_layout_cuts_the_first_bucket_after_a_resume():
    agg = _Recorder([2, 3, 1])
    flat = torch.arange(6.0)                     # one bucket: parameters 0, 1, 2
    out = reduce_bucket(agg, flat, [0, 1, 2], 0, layout=[[2, 0], [1]])
    assert [p for p, _ in agg.seen] == [[0, 2], [1]]
    torch.testing.assert_close(agg.seen[0][1], torch.tensor([0.0, 1, 5]))
    torch.testing.assert_close(flat, 2 * torch.arange(6.0))
    assert [(g, n) for g, n, _ in out] == [([2, 0], 3), ([1], 3)]


def test_a_layout_that_does_not_cover_the_bucket_is_ignored():
    assert groups([0, 1, 2], [[0, 1], [2, 3]]) == [[0, 1, 2]]
    assert groups([0, 1], None) == [[0, 1]]
    assert groups([1, 0], [[0], [1]]) == [[0], [1]]
