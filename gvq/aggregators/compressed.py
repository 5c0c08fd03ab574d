"""A compressor on a topology: modes (b)-(d) of the spec.  ``python cli.py aggregator=qsgd`` (and every
other ``conf/aggregator/`` option whose ``_target_`` is :class:`CompressedAggregator`).

The ring hop follows the compressor's declared ``additive`` property: payloads that add up in the
compressed domain are summed as they travel (b); others are decoded, added and re-encoded at every hop (c).
``allgather`` / ``ps`` gather every rank's payload instead (d); ``sparse_ring`` sums a sparse codec's
entries as unions of chunks around the ring (:mod:`gvq.comm.ring_sparse`).
"""
from __future__ import annotations

import torch

from gvq.aggregators.flat import FlatAggregator
from gvq.comm.hierarchy import compact_cuts
from gvq.comm.ring import Ring
from gvq.compressors.base import Compressor, split_on_cuts


class CompressedAggregator(FlatAggregator):
    """A compressor on a topology: ``ring`` picks mode (b) for additive compressors, else (c);
    ``allgather`` / ``ps`` is mode (d).  Logs rank 0's relative compression error per iteration."""

    extra_fields = FlatAggregator.extra_fields + ("compression_error",)
    #: whether its ranks feed back what their payloads left out (the only reader of ``ef_decay`` / ``ef_units``)
    feeds_back: bool = False

    def __init__(self, compressor: Compressor, *, topology: str, hop: str, ef_decay: float, ef_units: str):
        """The knobs as given (their defaults live in the compressed options' schema).  ``ef_decay`` and
        ``ef_units`` are error feedback's (:class:`gvq.aggregators.error_feedback.ErrorFeedbackAggregator`):
        without it a value other than theirs is refused, as it would change nothing."""
        if hop == "sum" and not compressor.additive:
            raise ValueError(f"aggregator.hop=sum: compressor {compressor.name!r} is not additive, its "
                             "payloads cannot be summed in the compressed domain; use hop=auto or reencode")
        if not self.feeds_back and (ef_decay != 1.0 or ef_units != "gradient"):
            key = "ef_decay" if ef_decay != 1.0 else "ef_units"
            raise ValueError(f"aggregator.{key}={ef_decay if key == 'ef_decay' else ef_units!r}: only error "
                             "feedback reads it (aggregator._target_=gvq.aggregators.error_feedback."
                             "ErrorFeedbackAggregator)")
        if topology == "sparse_ring" and not compressor.sparse:
            raise ValueError(f"aggregator.topology=sparse_ring: compressor {compressor.name!r} is not sparse; "
                             "the sparse ring sums top-k's and topk_chunk's entries (use ring or allgather)")
        if topology == "sparse_ring":       # the densest chunk it sent: where the supports fill in
            self.extra_fields = type(self).extra_fields + ("ring_density",)
        self.compressor, self.topology = compressor, topology
        # ring hop: sum payloads (mode b) when the compressor allows it, unless forced to re-encode
        self.sum_hop = compressor.additive and hop != "reencode"
        self.name = compressor.name

    def bind(self, params, ctx):
        super().bind(params, ctx)
        self.compressor.reseed(ctx.seed * 1000 + ctx.rank)       # per-rank dither (a no-op if none)

    def bucket_of(self, flat, params, iteration):
        bucket = super().bucket_of(flat, params, iteration)
        # named before measure() and average() code it, by what every rank knows alike (a codec's shared
        # draws: random-k's indices)
        self.compressor.begin_vector(self.ctx.seed, iteration, bucket.params[0] if bucket.params else -1)
        return bucket

    def state_dict(self) -> dict:
        # the compressor's own state (dither generator and lanes, learned bases) as tensors: a checkpoint
        # is data, never objects to unpickle
        return {"compressor": self.compressor.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.compressor.load_state_dict(state["compressor"])

    def codec_for(self, params) -> Compressor:
        """The compressor for a vector of ``params`` (positions, in order), told their shapes
        (``Compressor.grouped``: per-tensor codecs); built once per layout."""
        params = tuple(params)
        return self.memo(("codec", params), lambda: self.compressor.grouped(
            [tuple(self.params[i].shape) for i in params]))

    def segments(self, numel: int, n: int) -> list[slice]:
        """The ring's N segments of a vector of ``numel`` values, on the compressor's cuts."""
        return self.memo(("segments", numel, n), lambda: split_on_cuts(self.compressor.cuts(numel), n))

    def node_cuts(self, numel: int) -> list[int] | int:
        """The codec's cuts of a vector of ``numel`` as the two-level rings take them (the length where every
        offset is one: :func:`gvq.comm.hierarchy.compact_cuts`)."""
        return self.memo(("cuts", numel), lambda: compact_cuts(self.compressor.cuts(numel)))

    @property
    def across(self) -> str:
        """``topology=hierarchical``: the ring across nodes, by the hop rule (summed payloads, else decode-add-
        encode)."""
        return "additive" if self.sum_hop else "reencode"

    def rings(self, params, n):
        numel, codec = self.numel_of(params), self.codec_for(params)
        if self.topology == "sparse_ring":       # compressed whole, summed as N segments' sparse chunks
            return [Ring("sparse", self.segments(numel, n), codec)]
        if self.topology == "hierarchical":
            return [Ring("hierarchical", self.node_cuts(numel), codec, inner=self.across)]
        if self.topology != "ring":
            return [Ring(self.topology, [[slice(0, numel)]], codec)]
        return [Ring("additive" if self.sum_hop else "reencode", self.segments(numel, n), codec)]

    def measure(self, bucket):
        # every rank pays the same cost, so no rank waits for rank 0's measurement
        if not self.ctx.compression_error:
            return {"compression_error": float("nan")}
        return {"compression_error": self.local_error(bucket.flat, self.codec_for(bucket.params))}

    def average(self, bucket):
        measured = super().average(bucket)
        # the codec's NaN/Inf/range watch, read once the ring is done: every rank finishes the ring (a rank
        # raising mid-ring would leave its peers waiting), then each one that saw garbage raises
        self.compressor.check_health()
        return measured

    def local_error(self, flat: torch.Tensor, codec: Compressor | None = None) -> float:
        """||Q(G) - G||^2 / ||G||^2 on this rank's own gradient (not timed as aggregation); ``codec``:
        the vector's (:meth:`codec_for`), the compressor itself unless given."""
        whole, codec = slice(0, flat.numel()), codec or self.compressor
        with torch.no_grad():
            q = codec.decompress(codec.compress(flat, whole), whole)
            self.compressor.check_health()
            denom = float(flat.pow(2).sum())
            return float((q - flat).pow(2).sum()) / denom if denom > 0 else 0.0
