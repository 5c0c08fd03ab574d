"""(a) Uncompressed ring all-reduce: the baseline every compressor is measured against.
``python cli.py aggregator=rar``."""
from __future__ import annotations

from gvq.aggregators.base import equal_segments
from gvq.aggregators.flat import FlatAggregator
from gvq.comm.ring import Ring


class RingAllReduce(FlatAggregator):
    """(a) Uncompressed ring all-reduce over N equal segments (the baseline); ``topology=hierarchical``:
    inside each node, then across nodes on each rank's shard (:mod:`gvq.comm.hierarchy`)."""

    name = "rar"

    def __init__(self, *, topology: str):
        self.topology = topology

    def rings(self, params, n):
        if self.topology == "hierarchical":
            return [Ring("hierarchical", self.numel_of(params), inner="plain")]
        return [Ring("plain", equal_segments(self.numel_of(params), n))]
