"""(a) Uncompressed ring all-reduce: the baseline every compressor is measured against.
``python cli.py aggregator=rar``."""
from __future__ import annotations

from gvq.aggregators.base import FlatAggregator, equal_segments
from gvq.comm import ring


class RingAllReduce(FlatAggregator):
    """(a) Uncompressed ring all-reduce over N equal segments (the baseline)."""

    name = "rar"

    def allreduce_(self, flat, iteration):
        ring.allreduce_(flat, equal_segments(flat.numel(), self.ctx.world_size), self.p2p)
