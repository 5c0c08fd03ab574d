"""GradiVeQ as an aggregator: the paper's schedule (sec. 3, Fig. 6) and runtime monitor (Eq. 7).

    python cli.py aggregator=gradiveq lambda=0.01 warmup=20 L_t=20 L_c=60

See docs/design.md#gvqaggregatorsgradiveqpy for how it works and why.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from gvq.aggregators.base import check_int, equal_segments
from gvq.aggregators.error_feedback import ErrorFeedback
from gvq.aggregators.flat import FlatAggregator
from gvq.aggregators.gradiveq_relay import fit_everywhere
from gvq.comm import clock
from gvq.comm.hierarchy import inner_ring, node_phases
from gvq.comm.ring import Ring
from gvq.compressors.base import split_on_cuts
from gvq.compressors.gradiveq.codec import GradiVeQ, relative_loss
from gvq.compressors.gradiveq.segments import payload_balanced_segments
from gvq.compressors.qsgd import QSGD

log = logging.getLogger("gvq")
NAN = float("nan")


@dataclass
class Totals:
    """One iteration's vectors, summed: values averaged, payload values sent, the Eq. 7 sums."""
    phase: str
    numel: int = 0
    payload: float = 0.0
    sums: torch.Tensor | None = None      # on the gradient's device until loss() reads it

    def add(self, sums: torch.Tensor) -> None:
        self.sums = sums if self.sums is None else self.sums + sums

    def loss(self) -> float:
        """Eq. 7 of the iteration's vectors: one host read per iteration, after the last bucket."""
        return relative_loss(*self.sums.tolist()) if self.sums is not None else 0.0

    def ratio(self) -> float:
        """The iteration's ``compression_ratio``: values averaged over payload values sent."""
        return self.numel / self.payload if self.payload > 0 else NAN


def write_layer_stats(run_dir: str | None, comp: GradiVeQ, extra: dict) -> None:
    """Append one JSON line per compressor group (layer, K, d, K/d, energy, ...) to
    ``<run_dir>/gradiveq_layers.jsonl``; no run dir (tests, library use) -> nothing written."""
    if run_dir is None:
        return
    with open(Path(run_dir) / "gradiveq_layers.jsonl", "a") as f:
        for st in comp.layer_stats():
            f.write(json.dumps({**extra, **st, "shape": list(st["shape"])}) + "\n")


class GradiVeQAggregator(FlatAggregator):
    """Warm-up, then {L_t sampling iterations, PCA refresh, <= L_c compressed iterations} forever."""

    name = "gradiveq"
    bucket_codecs = True           # a bucket's codec holds its own layers' bases only
    fits_whole_vectors = True      # a refit needs every layer's samples from the iterations it sampled
    extra_fields = FlatAggregator.extra_fields + ("phase", "compression_error", "compression_ratio", "fit_s",
                                                  "monitor_s")
    #: 16-bit gradients are averaged in float32 (its flat buffers); float64 would travel as float32
    refused_dtypes = ((torch.float64, "its payloads, PCA bases and samples are float32: cast the model "
                       "to float32 or bfloat16, or use rar, powersgd or a quantizer, which keep float64"),)

    def __init__(self, compressor: GradiVeQ, *, L_t: int, L_c: int, warmup: int, sampling: str, qsgd_bits: int,
                 qsgd_bucket: int | None, qsgd_norm: str, monitor_threshold: float | None, pieces: int,
                 warmup_by: str, samples_in_warmup: bool, error_feedback: bool, topology: str):
        """Every knob as given (its default lives in ``GradiVeQAggregatorSchema``; build one from it with
        :func:`gvq.schema.options.knobs`)."""
        if not isinstance(compressor, GradiVeQ):
            raise ValueError(f"aggregator.compressor: must be a GradiVeQ compressor, got "
                             f"{type(compressor).__name__}")
        self.L_t = check_int("L_t", L_t, 2)            # PCA needs >= 2 samples
        self.L_c = check_int("L_c", L_c, 1)
        self.warmup = check_int("warmup", warmup, 0)
        self.pieces = check_int("aggregator.pieces", pieces, 1)
        if monitor_threshold is not None and (isinstance(monitor_threshold, bool) or not isinstance(
                monitor_threshold, (int, float)) or not monitor_threshold > 0):
            raise ValueError(f"aggregator.monitor_threshold={monitor_threshold!r}: must be > 0 or null")
        if warmup_by not in ("rar", "qsgd") or sampling not in ("rar", "qsgd"):
            raise ValueError(f"aggregator.warmup_by={warmup_by!r}, aggregator.sampling={sampling!r}: each rar or qsgd")
        if not isinstance(samples_in_warmup, bool):
            raise ValueError(f"aggregator.samples_in_warmup={samples_in_warmup!r}: must be true or false")
        self.compressor, self.sampling, self.warmup_by = compressor, sampling, warmup_by
        # the first L_t samples are the warm-up's last L_t sums (the warm-up's ring), not L_t more
        # iterations after it: compression starts L_t iterations sooner
        self.samples_in_warmup = samples_in_warmup
        if not isinstance(error_feedback, bool):
            raise ValueError(f"aggregator.error_feedback={error_feedback!r}: must be true or false")
        # error feedback on the projection's residual: what a rank's payload left out is added to its next
        # vector (an ErrorFeedback, bound with the parameters)
        self.error_feedback = error_feedback
        if topology == "hierarchical" and error_feedback:
            raise ValueError("aggregator.topology=hierarchical: aggregator.error_feedback=true is not supported (a "
                             "rank's residual would be of its own vector, but it compresses its node's shard)")
        # hierarchical: summed inside the node on whole codec units (a slice group's basis is never split), its
        # rings across nodes on each rank's shard; the nodes are the codec's N (each sends mu / M of the sum)
        self.topology = topology
        self.feedback: ErrorFeedback | None = None
        self.monitor_threshold = None if monitor_threshold is None else float(monitor_threshold)
        try:        # built here so that bad bits / bucket fail at preflight, like every other knob
            self.qsgd = QSGD(bits=qsgd_bits, bucket=qsgd_bucket, norm=qsgd_norm)
        except ValueError as e:                            # "bits=1: ..." -> "aggregator.qsgd_bits=1: ..."
            raise ValueError(f"aggregator.qsgd_{e}") from None
        self.phase, self.count, self.refreshes, self.monitor_stops = "warmup", 0, 0, 0
        self.relays = 0                                     # refreshes whose state had to be relayed
        self._samples: torch.Tensor | None = None
        self._it = 0

    # -- binding -------------------------------------------------------------------------------------
    def preflight(self, params) -> None:
        """What needs the model's shapes, checked by the launcher before ranks start: K against every
        conv layer's F*D (a ValueError naming K and the layer)."""
        self.compressor.bind([tuple(p.shape) for p in params])

    def bind(self, params, ctx):
        super().bind(params, ctx)
        comp, n = self.compressor, ctx.world_size
        comp.world_size = n // ctx.cluster.ranks_per_node if self.topology == "hierarchical" else n
        comp.bind([tuple(p.shape) for p in self.params])
        self.qsgd.reseed(ctx.seed * 1000 + ctx.rank)       # as CompressedAggregator: per-rank dither
        self._device = self.params[0].device if self.params else torch.device("cpu")
        self._c_ratio = NAN
        if self.error_feedback:     # in the codec's layout, float32; each parameter's block where its values are
            self.feedback = ErrorFeedback(comp.layout.numel, torch.float32, self._device, key="residual")

    def per_parameter(self):
        """With error feedback, its memory (the projection's residual): a bucket feeds back its share."""
        return self.feedback.per_parameter() if self.feedback is not None else {}

    # -- one vector: the whole gradient after backward, or one DDP bucket ------------------------------
    def start_iteration(self, iteration: int) -> None:
        """The iteration's phase, decided before its first vector (the warm-up ends here): every vector
        of the iteration is averaged in it."""
        self._totals = Totals(self._enter(iteration))

    def codec(self, params: tuple[int, ...]) -> GradiVeQ:
        """The codec of a vector of ``params``: the whole one, or one sharing its layers' PCA state (a
        layer's basis is the layer's, whatever bucket it lands in); kept until the next fit."""
        if params == self.everything:
            return self.compressor
        return self.memo(("codec", params), lambda: self.compressor.restricted_to(list(params)))

    def rings(self, params, n):
        (ring,) = self.flat_rings(params, n)
        if self.topology != "hierarchical":
            return [ring]
        numel = self.codec(params).layout.numel
        units = {"additive": lambda: self.codec(params).cuts(numel), "reencode": lambda: self.qsgd.cuts(numel),
                 "plain": lambda: numel}[ring.kind]
        return [Ring("hierarchical", self.memo(("cuts", params, ring.kind), units), ring.codec, inner=ring.kind)]

    def flat_rings(self, params, n):
        """The phase's ring on one flat ring of ``n`` ranks."""
        codec = self.codec(params)
        numel = codec.layout.numel
        if self.phase == "compress":
            segs = self.memo(("segs", params, n),
                             lambda: payload_balanced_segments(codec, numel, n, self.pieces))
            return [Ring("additive", segs, codec)]
        if self._ring_option() == "qsgd":
            return [Ring("reencode", split_on_cuts(self.qsgd.cuts(numel), n), self.qsgd)]
        return [Ring("plain", equal_segments(numel, n))]

    def _ring_option(self) -> str:
        """How an uncompressed phase's vectors are summed: the warm-up's by ``warmup_by``, sampling by
        ``sampling``, the first samples by the warm-up's option where they are taken inside it."""
        first_in_warmup = self.samples_in_warmup and self.refreshes == 0
        return self.sampling if self.phase == "sample" and not first_in_warmup else self.warmup_by

    def average(self, bucket) -> None:
        """Average in the iteration's phase, in the paper's conv layout (Fig. 3a), in float32 (16-bit
        sums unrounded); a sampling iteration's sum goes to the PCA samples at its layers' places."""
        codec, n, tot, params = self.codec(bucket.params), self.ctx.world_size, self._totals, bucket.params
        views = [v.view(self.params[i].shape) for i, v in
                 zip(params, bucket.flat.split([self.params[i].numel() for i in params]))]
        # one buffer per vector kept across iterations (a fresh allocation of this size costs page faults)
        buf = self.memo(("x", params, bucket.flat.device), lambda: torch.empty(
            bucket.flat.numel(), dtype=torch.float32, device=bucket.flat.device))
        x = codec.flatten(views, out=buf)
        (ring,) = self.rings(params, n)
        tot.numel += x.numel()
        if self.feedback is not None:
            self._feed_back(codec, x, self.feedback.share(bucket), tot.phase == "compress")
        if tot.phase == "compress" and ring.kind == "hierarchical":
            self._compress_on_nodes(codec, x, ring)
            tot.payload += codec.payload_spec(slice(0, x.numel()))[1]
        elif tot.phase == "compress":
            with self.codec_session(x, params):   # Eq. 7's sums, read off this rank's own payloads
                ring.run_(x, self.p2p, self.stopwatch)
                tot.add(codec.tracked_sums())
            tot.payload += codec.payload_spec(slice(0, x.numel()))[1]
        else:
            ring.run_(x, self.p2p, self.stopwatch)
            tot.payload += x.numel() / (self.qsgd.ratio(x.numel()) if "reencode" in (ring.kind, ring.inner) else 1.0)
        if tot.phase == "sample":
            self._keep_sample(x, params)
        x.div_(n)
        codec.unflatten(x, views)

    def _compress_on_nodes(self, codec: GradiVeQ, x: torch.Tensor, ring: Ring) -> None:
        """The hierarchical compressed ring, Eq. 7 tracked on what this rank compresses: its node's sum of
        its shard (its loss the node's, on the shard)."""
        with node_phases(x, ring.segs, self.p2p) as (shard, across, nodes):
            codec.track(x[shard], shard)
            try:
                inner_ring(ring, shard, nodes).run_(x, across, self.stopwatch)
                self._totals.add(codec.tracked_sums())
            finally:
                codec.track(None)

    def _feed_back(self, codec: GradiVeQ, x: torch.Tensor, residual: torch.Tensor, compressed: bool) -> None:
        """x <- x + e.  Compressed: e <- what this rank's payload of x leaves out (a compress and a
        decompress more, timed as the codec's).  Uncompressed: the held-back e goes out whole in this exact
        sum, e <- 0."""
        self.feedback.feed_(x, residual)
        if not compressed:
            residual.zero_()
            return
        with self.stopwatch("compress"):
            codec.own_residual(x, out=residual)             # e <- what the payload left out, in place

    def _keep_sample(self, x: torch.Tensor, params: tuple[int, ...]) -> None:
        """A vector's sum into this sampling iteration's row, at its layers' places in the whole layout."""
        offsets, row, off = self.compressor.layout.offsets, self.sample_row(x.device), 0
        for i in params:
            k = self.params[i].numel()
            row[offsets[i]: offsets[i] + k].copy_(x[off: off + k])
            off += k

    def finish_iteration(self, iteration: int) -> dict:
        """After the last vector, the iteration counts in the schedule (monitor vote, refit); its columns."""
        tot = self._totals
        out = {"phase": tot.phase, "compression_error": NAN, "fit_s": NAN, "monitor_s": NAN,
               "compression_ratio": tot.ratio()}
        if tot.phase == "compress":
            out["compression_error"] = loss = tot.loss()
            out["monitor_s"] = self._after_compressed(loss)
        elif tot.phase == "sample":
            self.count += 1
            out["fit_s"] = self._refresh() if self.count >= self.L_t else NAN
        return out

    def _enter(self, iteration: int) -> str:
        """The phase ``iteration`` runs in: the warm-up ends before the first ring of iteration ``warmup``."""
        self._it = iteration
        first_sample = self.warmup - self.L_t if self.samples_in_warmup else self.warmup
        if self.phase == "warmup" and iteration >= first_sample:
            self._start_sampling()
        return self.phase

    def _after_compressed(self, loss: float) -> float:
        """Count a compressed iteration; the monitor (Eq. 7) votes on its loss, read off the ranks' own
        payloads during the ring (no second projection), so a stop applies from the next iteration on.
        Returns the vote's seconds (NaN with the monitor off)."""
        self.count += 1
        monitor_s = NAN
        if self.monitor_threshold is not None:
            t0 = clock.now()
            if self._majority_above(loss):
                self.monitor_stops += 1
                log.info("gradiveq: monitor stopped compression after iteration %d (%d compressed "
                         "iterations, rank 0 loss %.3g)", self._it, self.count, loss)
                self._start_sampling()
            monitor_s = clock.now() - t0
        if self.phase == "compress" and self.count >= self.L_c:
            self._start_sampling()
        return monitor_s

    def _majority_above(self, loss: float) -> bool:
        votes = torch.tensor([int(loss > self.monitor_threshold)], dtype=torch.int64)
        if self.ctx.world_size > 1:
            self.p2p.all_reduce(votes)                     # 8 bytes: every rank learns the count
        return 2 * int(votes) > self.ctx.world_size      # strict majority

    @contextlib.contextmanager
    def codec_session(self, flat: torch.Tensor, params=None):
        """The compressed phase's Eq. 7 loss tracking on this rank's vector ``flat`` of ``params`` (its
        codec's ``track``): the compress calls inside must cover ``flat`` exactly once, as the additive
        ring's do."""
        codec = self.codec(self.everything if params is None else tuple(params))
        codec.track(flat)
        try:
            yield
        finally:
            codec.track(None)

    # -- schedule ------------------------------------------------------------------------------------
    def _start_sampling(self) -> None:
        self.phase, self.count = "sample", 0

    def sample_row(self, device) -> torch.Tensor:
        """The PCA sample this sampling iteration's aggregated sum goes to: a row of the whole gradient in
        the codec's layout (a DDP bucket writes its layers' share)."""
        if self._samples is None:
            self._samples = torch.empty(self.L_t, self.compressor.layout.numel, dtype=torch.float32,
                                        device=device)
        return self._samples[self.count]

    def _refresh(self) -> float:
        t0 = clock.now()
        with clock.phase("codec"):                         # PCA; the relay's waits are the link's
            relayed = fit_everywhere(self.compressor, self._samples, self.p2p)
        fit_s = clock.now() - t0
        self._after_fit()
        self.refreshes += 1
        self.relays += int(relayed)
        self.phase, self.count = "compress", 0
        if self.ctx.rank == 0:
            write_layer_stats(self.ctx.run_dir, self.compressor,
                              {"refresh": self.refreshes, "iteration": self._it, "fit_s": fit_s,
                               "relayed": relayed})
            log.info("gradiveq: refresh %d at iteration %d: mean K/d %.2f, wire ratio %.2f, fit %.3fs",
                     self.refreshes, self._it, self.compressor.mean_ratio, self._c_ratio, fit_s)
        return fit_s

    def _after_fit(self) -> None:
        self.forget()                                       # every bucket's codec and segments are stale
        self._c_ratio = self.compressor.wire_ratio(self.compressor.layout.numel)

    def prepare_benchmark(self, grads: list[torch.Tensor], args=None) -> None:
        """For ``gvq.bench``: fit on L_t isotropic random samples -- d = L_t - 1 per layer at lambda 0.01,
        the paper's regime (d near L_t - 1) and the lowest ratio Eq. 6 allows -- make it identical on all
        ranks, and pin the compressed phase (no refresh, no monitor) so every timed call is Algorithm 1."""
        numel = self.compressor.layout.numel
        gen = torch.Generator().manual_seed(0)
        samples = torch.randn(self.L_t, numel, generator=gen)
        fit_everywhere(self.compressor, samples, self.p2p)
        self._after_fit()
        self.phase, self.count, self.L_c, self.monitor_threshold = "compress", 0, 1 << 62, None

    # -- checkpoint ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Schedule position, the samples collected so far, the compressor's state, the QSGD dither."""
        keep = self.phase == "sample" and self.count > 0 and self._samples is not None
        return {"phase": self.phase, "count": self.count, "refreshes": self.refreshes,
                "relays": self.relays, "monitor_stops": self.monitor_stops,
                "samples": self._samples[: self.count].clone() if keep else None,
                "compressor": self.compressor.state_dict(), "qsgd": self.qsgd.state_dict(),   # its dither too
                **(self.feedback.state_dict() if self.feedback is not None else {})}

    def load_state_dict(self, sd: dict) -> None:
        """Restore after :meth:`setup` (same model, same world size)."""
        if sd["phase"] not in ("warmup", "sample", "compress"):
            raise ValueError(f"GradiVeQAggregator.load_state_dict: unknown phase {sd['phase']!r}")
        comp = dict(sd["compressor"])
        if comp.get("values") is not None:                 # the bases onto the gradient's device (a resume
            comp["values"] = comp["values"].to(self._device)   # loads on the host)
        self.compressor.load_state_dict(comp)
        if sd["phase"] == "compress" and not self.compressor.fitted:
            raise ValueError("GradiVeQAggregator.load_state_dict: compress phase without a fitted state")
        self.phase, self.count = sd["phase"], int(sd["count"])
        self.refreshes, self.monitor_stops = int(sd["refreshes"]), int(sd["monitor_stops"])
        self.relays = int(sd.get("relays", 0))             # absent in checkpoints before the counter
        self._samples = None
        if sd["samples"] is not None:
            self._samples = torch.empty(self.L_t, sd["samples"].shape[1], dtype=torch.float32,
                                        device=self._device)
            self._samples[: self.count].copy_(sd["samples"])
        self.qsgd.load_state_dict(sd["qsgd"])
        if self.feedback is not None:
            self.feedback.load_state_dict(sd)
        if self.compressor.fitted:
            self._after_fit()

    def summary(self) -> dict:
        """Run-level numbers (summary.json's ``aggregator``)."""
        return {"refreshes": self.refreshes, "relays": self.relays, "monitor_stops": self.monitor_stops,
                "mean_K_over_d": self.compressor.mean_ratio if self.compressor.fitted else math.nan}
