"""(a) Uncompressed ring all-reduce: the baseline every compressor is measured against.
``python cli.py aggregator=rar``."""
from __future__ import annotations

from gvq.aggregators.base import equal_segments
from gvq.aggregators.flat import FlatAggregator
from gvq.comm.ring import Ring


class RingAllReduce(FlatAggregator):
    """(a) Uncompressed ring all-reduce over N equal segments (the baseline)."""

    name = "rar"

    def rings(self, params, n):
        return [Ring("plain", equal_segments(self.numel_of(params), n))]
