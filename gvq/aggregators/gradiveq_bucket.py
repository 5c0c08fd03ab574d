"""GradiVeQ one DDP bucket at a time (``aggregator=gradiveq aggregator.overlap=true``): what the
per-bucket path keeps beside the aggregator's schedule, :class:`PerBucket`.

The schedule moves once per iteration, not per bucket, and stays the aggregator's: its
``start_iteration`` decides the iteration's phase (warm-up, sampling, compressed) before its first bucket,
every bucket is averaged in that phase (:meth:`PerBucket.average`), and its ``finish_iteration`` counts
the iteration after its last bucket (a sample taken, a compressed iteration done), votes on the monitor
and refits.  Everything that outlives an iteration is per layer: the PCA state belongs to the layer's
groups (a bucket's codec shares it, ``GradiVeQ.restricted_to``), the samples are rows of the whole
gradient in the codec's layout, each bucket writing its layers' share.  So a DDP bucket rebuild, or any
bucketing, reuses the same bases and loses no sample, and the checkpoint is the post-backward one.

As in post-backward aggregation, the monitor (Eq. 7) votes on the iteration's loss read off the buckets'
own payloads, after the last bucket, so a stop applies from the next iteration on; the refit runs after
the last bucket of the L_t-th sampling iteration.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gvq.aggregators.base import equal_segments
from gvq.aggregators.gradiveq_sync import payload_balanced_segments
from gvq.comm import clock, ring
from gvq.compressors.base import split_on_cuts

NAN = float("nan")


@dataclass
class Totals:
    """One iteration's buckets, summed: values averaged, payload values sent, the Eq. 7 sums."""
    phase: str
    numel: int = 0
    payload: float = 0.0
    c2: float = 0.0
    p2: float = 0.0
    g2: float = 0.0

    def loss(self) -> float:
        return max(self.c2 - self.p2, 0.0) / self.g2 if self.g2 > 0 else 0.0

    def ratio(self) -> float:
        """The iteration's ``compression_ratio``: values averaged over payload values sent."""
        return self.numel / self.payload if self.payload > 0 else NAN


class PerBucket:
    """The per-bucket path of a :class:`gvq.aggregators.gradiveq.GradiVeQAggregator` (its public
    members only): the open iteration's sums and each bucket layout's codec."""

    def __init__(self, agg):
        self.agg = agg                      # the aggregator whose schedule the buckets follow
        # per bucket layout (its parameters): (the PCA state it was made from, codec, compressed-phase
        # ring segments), kept until the next refit
        self.codecs: dict[tuple[int, ...], tuple] = {}
        self.totals: Totals | None = None   # the open iteration's (from begin on)

    def begin(self, phase: str) -> None:
        """Open an iteration averaged in ``phase``."""
        self.totals = Totals(phase)

    def codec(self, params: list[int]):
        """The codec of a bucket holding ``params`` and its compressed-phase ring segments."""
        agg = self.agg
        key, pca = tuple(params), agg.compressor.pca
        hit = self.codecs.get(key)
        if hit is None or hit[0] is not pca:
            codec = agg.compressor.restricted_to(params)
            segs = None if pca is None else payload_balanced_segments(codec, codec.layout.numel,
                                                                      agg.ctx.world_size, agg.pieces)
            hit = self.codecs[key] = (pca, codec, segs)
        return hit[1], hit[2]

    def average(self, flat: torch.Tensor, params: list[int]) -> dict:
        """Average one bucket in place (``flat``: the gradients of ``params``, concatenated) in the
        iteration's phase; returns ``aggregate_s``."""
        t0, agg = clock.now(), self.agg
        codec, segs = self.codec(params)
        views = [v.view(agg.params[i].shape) for i, v in zip(params, flat.split([agg.params[i].numel()
                                                                                   for i in params]))]
        # the paper's conv layout, this bucket's layers, in float32 as post-backward (16-bit sums unrounded)
        x = codec.flatten(views, out=torch.empty(flat.numel(), dtype=torch.float32, device=flat.device))
        n, tot = agg.ctx.world_size, self.totals
        tot.numel += x.numel()
        if tot.phase == "compress":
            self._algorithm1(codec, segs, x)
        elif tot.phase == "sample" and agg.sampling == "qsgd":
            ring.reencode_allreduce_(x, split_on_cuts(agg.qsgd.cuts(x.numel()), n), agg.qsgd, agg.p2p,
                                     agg.stopwatch)
            tot.payload += x.numel() / agg.qsgd.ratio(x.numel())
        else:
            ring.allreduce_(x, equal_segments(x.numel(), n), agg.p2p)
            tot.payload += x.numel()
        if tot.phase == "sample":
            self._keep_sample(x, params)
        x.div_(n)
        codec.unflatten(x, views)
        return {"aggregate_s": clock.now() - t0}

    def _algorithm1(self, codec, segs, x: torch.Tensor) -> None:
        """Algorithm 1 on the bucket (payloads summed in the compressed domain, Eq. 1), with its Eq. 7 sums."""
        agg, tot, whole = self.agg, self.totals, slice(0, x.numel())
        codec.track(x)
        try:
            if agg.ctx.world_size == 1:                 # no ring: compress and decompress locally
                with agg.stopwatch("compress"):
                    payload = codec.compress(x, whole)
                with agg.stopwatch("decompress"):
                    x.copy_(codec.decompress(payload, whole))
            else:
                ring.additive_allreduce_(x, segs, codec, agg.p2p, agg.stopwatch)
            c2, p2, g2 = codec.tracked_sums()
        finally:
            codec.track(None)
        tot.c2, tot.p2, tot.g2 = tot.c2 + c2, tot.p2 + p2, tot.g2 + g2
        tot.payload += codec.payload_spec(whole)[1]

    def _keep_sample(self, x: torch.Tensor, params: list[int]) -> None:
        """The bucket's sum into this sampling iteration's row, at its layers' places in the whole layout."""
        agg = self.agg
        offsets, row, off = agg.compressor.layout.offsets, agg.sample_row(x.device), 0
        for i in params:
            k = agg.params[i].numel()
            row[offsets[i]: offsets[i] + k].copy_(x[off: off + k])
            off += k

    def end(self) -> Totals:
        """The iteration's sums, after its last bucket (the aggregator counts it in the schedule)."""
        return self.totals
