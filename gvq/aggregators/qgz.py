"""ZeRO++'s qgZ as an aggregator: a quantizer's payloads through an all-to-all inside the node, then across
nodes, then an all-gather (:mod:`gvq.comm.alltoall_quant`).  ``python cli.py world_size=8 net=nodes2x4
aggregator=qgz``; on a flat net (one rank a node) a flat all-to-all reduce.

Against the re-encode ring (``aggregator=qsgd``), whose every hop quantizes a partial sum again (N - 1 times
on the way to the last rank), a value is quantized three times at any N: once by its rank, once as its
node's sum, once as the global sum its owner gathers; the hierarchical ring (``topology=hierarchical``)
puts fewer bytes on the node's links but re-quantizes M - 1 times across nodes."""
from __future__ import annotations

from gvq.aggregators.compressed import CompressedAggregator
from gvq.comm.ring import Ring
from gvq.compressors.base import Compressor


class QgZAggregator(CompressedAggregator):
    """qgZ: ``intra`` the intra-node reduce's wire (``compressed``: the codec's payloads; ``fp16`` /
    ``fp32``: plain values), ``gather`` the all-gather's (``compressed`` or ``fp32``)."""

    def __init__(self, compressor: Compressor, *, intra: str, gather: str):
        super().__init__(compressor, topology="qgz", hop="auto", ef_decay=1.0, ef_units="gradient")
        self.intra, self.gather = intra, gather
        self.name = "qgz"

    def rings(self, params, n):
        numel = self.numel_of(params)
        return [Ring("qgz", self.node_cuts(numel), self.codec_for(params),
                     inner=self.intra, gather=self.gather)]
