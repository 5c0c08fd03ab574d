"""GradiVeQ one DDP bucket at a time (``aggregator=gradiveq aggregator.overlap=true``).

The schedule moves once per iteration, not per bucket: :func:`begin_iteration` decides the iteration's phase
(warm-up, sampling, compressed) before its first bucket, every bucket is averaged in that phase, and
:func:`end_iteration` counts the iteration after its last bucket (a sample taken, a compressed iteration
done), votes on the monitor and refits.  Everything that outlives an iteration is per layer: the PCA
state belongs to the layer's groups (a bucket's codec shares it, ``GradiVeQ.restricted_to``), the samples are
rows of the whole gradient in the codec's layout, each bucket writing its layers' share.  So a DDP
bucket rebuild, or any bucketing, reuses the same bases and loses no sample, and the checkpoint is the
post-backward one.

As in post-backward aggregation, the monitor (Eq. 7) votes on the iteration's loss read off the buckets'
own payloads, after the last bucket, so a stop applies from the next iteration on; the refit runs after
the last bucket of the L_t-th sampling iteration.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from gvq.aggregators.base import equal_segments
from gvq.aggregators.gradiveq_sync import payload_balanced_segments
from gvq.comm import clock, ring
from gvq.compressors.base import split_on_cuts

log = logging.getLogger("gvq")
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


def begin_iteration(agg, iteration: int) -> None:
    """The iteration's phase, the same for all its buckets."""
    agg._it = iteration
    if agg.phase == "warmup" and iteration >= agg.warmup:
        agg._start_sampling()
    agg._totals = Totals(agg.phase)


def _bucket_codec(agg, params: list[int]):
    """The codec of a bucket holding ``params`` (their layers, the whole codec's bases), cached until
    the next refit; and its compressed-phase ring segments."""
    key, pca = tuple(params), agg.compressor.pca
    hit = agg._bucket_codecs.get(key)
    if hit is None or hit[0] is not pca:
        codec = agg.compressor.restricted_to(params)
        segs = None if pca is None else payload_balanced_segments(codec, codec.layout.numel,
                                                                  agg.ctx.world_size, agg.pieces)
        hit = agg._bucket_codecs[key] = (pca, codec, segs)
    return hit[1], hit[2]


def average_bucket(agg, flat: torch.Tensor, params: list[int]) -> dict:
    """Average one bucket in place (``flat``: the gradients of ``params``, concatenated) in the
    iteration's phase; returns ``aggregate_s``."""
    t0 = clock.now()
    codec, segs = _bucket_codec(agg, params)
    views = [v.view(agg.params[i].shape) for i, v in zip(params, flat.split([agg.params[i].numel()
                                                                               for i in params]))]
    # the paper's conv layout, this bucket's layers, in float32 as post-backward (16-bit sums unrounded)
    x = codec.flatten(views, out=torch.empty(flat.numel(), dtype=torch.float32, device=flat.device))
    n, tot = agg.ctx.world_size, agg._totals
    tot.numel += x.numel()
    if tot.phase == "compress":
        _algorithm1(agg, codec, segs, x)
    elif tot.phase == "sample" and agg.sampling == "qsgd":
        ring.reencode_allreduce_(x, split_on_cuts(agg.qsgd.cuts(x.numel()), n), agg.qsgd, agg.p2p, agg.clock)
        tot.payload += x.numel() / agg.qsgd.ratio(x.numel())
    else:
        ring.allreduce_(x, equal_segments(x.numel(), n), agg.p2p)
        tot.payload += x.numel()
    if tot.phase == "sample":
        _keep_sample(agg, x, params)
    x.div_(n)
    codec.unflatten(x, views)
    return {"aggregate_s": clock.now() - t0}


def _algorithm1(agg, codec, segs, x: torch.Tensor) -> None:
    """Algorithm 1 on the bucket (payloads summed in the compressed domain, Eq. 1), with its Eq. 7 sums."""
    tot, whole = agg._totals, slice(0, x.numel())
    codec.track(x)
    try:
        if agg.ctx.world_size == 1:                 # no ring: compress and decompress locally
            with agg.clock("compress"):
                payload = codec.compress(x, whole)
            with agg.clock("decompress"):
                x.copy_(codec.decompress(payload, whole))
        else:
            ring.additive_allreduce_(x, segs, codec, agg.p2p, agg.clock)
        c2, p2, g2 = codec.tracked_sums()
    finally:
        codec.track(None)
    tot.c2, tot.p2, tot.g2 = tot.c2 + c2, tot.p2 + p2, tot.g2 + g2
    tot.payload += codec.payload_spec(whole)[1]


def _keep_sample(agg, x: torch.Tensor, params: list[int]) -> None:
    """The bucket's sum into this sampling iteration's row, at its layers' places in the whole layout."""
    layout = agg.compressor.layout
    if agg._samples is None:
        agg._samples = torch.empty(agg.L_t, layout.numel, dtype=torch.float32, device=x.device)
    row, off = agg._samples[agg.count], 0
    for i in params:
        k = agg.params[i].numel()
        row[layout.offsets[i]: layout.offsets[i] + k].copy_(x[off: off + k])
        off += k


def end_iteration(agg, iteration: int) -> dict:
    """Count the iteration in the schedule (monitor vote, refit); its run-level columns."""
    tot = agg._totals
    out = {"phase": tot.phase, "compression_error": NAN, "fit_s": NAN, "monitor_s": NAN,
           "compression_ratio": tot.numel / tot.payload if tot.payload > 0 else NAN}
    if tot.phase == "compress":
        out["compression_error"] = loss = tot.loss()
        agg.count += 1
        if agg.monitor_threshold is not None:
            t0 = clock.now()
            if agg._majority_above(loss):
                agg.monitor_stops += 1
                log.info("gradiveq: monitor stopped compression after iteration %d (%d compressed "
                         "iterations, rank 0 loss %.3g)", iteration, agg.count, loss)
                agg._start_sampling()
            out["monitor_s"] = clock.now() - t0
        if agg.phase == "compress" and agg.count >= agg.L_c:
            agg._start_sampling()
    elif tot.phase == "sample":
        agg.count += 1
        if agg.count >= agg.L_t:
            out["fit_s"] = agg._refresh()
    return out
