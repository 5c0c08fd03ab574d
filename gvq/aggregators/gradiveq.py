"""GradiVeQ as an aggregator: the paper's schedule (sec. 3, Fig. 6) and runtime monitor (Eq. 7).

    python cli.py aggregator=gradiveq lambda=0.01 warmup=20 L_t=20 L_c=60

See docs/design.md#gvqaggregatorsgradiveqpy for how it works and why.
"""
from __future__ import annotations

import contextlib
import logging
import math

import torch

from gvq.aggregators.gradiveq_bucket import PerBucket
from gvq.aggregators.base import FlatAggregator, check_int, equal_segments
from gvq.aggregators.gradiveq_sync import fit_everywhere, payload_balanced_segments, write_layer_stats
from gvq.comm import clock, ring
from gvq.compressors.base import split_on_cuts
from gvq.compressors.gradiveq.codec import GradiVeQ
from gvq.compressors.qsgd import QSGD

log = logging.getLogger("gvq")
NAN = float("nan")


class GradiVeQAggregator(FlatAggregator):
    """Warm-up, then {L_t sampling iterations, PCA refresh, <= L_c compressed iterations} forever."""

    name = "gradiveq"
    extra_fields = ("phase", "compression_error", "compression_ratio", "fit_s", "monitor_s")
    #: 16-bit gradients are averaged in float32 (its flat buffers); float64 would travel as float32
    refused_dtypes = ((torch.float64, "its payloads, PCA bases and samples are float32: cast the model "
                       "to float32 or bfloat16, or use rar, powersgd or a quantizer, which keep float64"),)

    def __init__(self, compressor: GradiVeQ, L_t: int = 100, L_c: int = 400, warmup: int = 0,
                 sampling: str = "qsgd", qsgd_bits: int = 4, qsgd_bucket: int = 2048, qsgd_norm: str = "max",
                 monitor_threshold: float | None = None, pieces: int = 4):
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
        self.compressor, self.sampling = compressor, sampling
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
        comp.world_size = n
        comp.bind([tuple(p.shape) for p in self.params])
        numel = comp.layout.numel
        self.qsgd.reseed(ctx.seed * 1000 + ctx.rank)       # as CompressedAggregator: per-rank dither
        self._device = self.params[0].device if self.params else torch.device("cpu")
        self._flat = torch.empty(numel, dtype=torch.float32, device=self._device)
        self._raw_segs = equal_segments(numel, n)
        self._q_segs = split_on_cuts(self.qsgd.cuts(numel), n)
        self._q_ratio = self.qsgd.ratio(numel) if self.sampling == "qsgd" else 1.0
        self._c_segs: list[list[slice]] = []
        self._c_ratio = NAN
        self._per_bucket = PerBucket(self)                  # aggregator.overlap's buckets

    def flatten(self) -> torch.Tensor:
        # the paper's conv layout (Fig. 3a); one persistent buffer (samples are copied out of it)
        return self.compressor.flatten([p.grad for p in self.params], out=self._flat)

    def unflatten(self, flat: torch.Tensor) -> None:
        self.compressor.unflatten(flat, [p.grad for p in self.params])

    # -- one DDP bucket at a time (aggregator.overlap): the schedule here, the buckets in gradiveq_bucket --
    def start_iteration(self, iteration: int) -> None:
        """The iteration's phase, decided before its first bucket: every bucket is averaged in it."""
        self._per_bucket.begin(self._enter(iteration))

    def allreduce_bucket_(self, flat: torch.Tensor, params: list[int], iteration: int) -> dict:
        return self._per_bucket.average(flat, params)

    def finish_iteration(self, iteration: int) -> dict:
        """After the last bucket, the iteration counts in the schedule (monitor vote, refit) as a
        post-backward one does after its ring; its run-level columns."""
        tot = self._per_bucket.end()
        out = {"phase": tot.phase, "compression_error": NAN, "fit_s": NAN, "monitor_s": NAN,
               "compression_ratio": tot.ratio()}
        if tot.phase == "compress":
            out["compression_error"] = loss = tot.loss()
            out["monitor_s"] = self._after_compressed(loss)
        elif tot.phase == "sample":
            out["fit_s"] = self._after_sample()
        return out

    # -- one iteration -------------------------------------------------------------------------------
    def aggregate(self, iteration: int) -> dict:
        self._it = iteration                               # measure() needs it for the warm-up edge
        return super().aggregate(iteration)

    def measure(self, flat: torch.Tensor) -> dict:
        """Phase of this iteration (the warm-up ends here, before its ring)."""
        return {"phase": self._enter(self._it), "compression_error": NAN, "monitor_s": NAN}

    def _enter(self, iteration: int) -> str:
        """The phase ``iteration`` runs in: the warm-up ends before the first ring of iteration ``warmup``."""
        self._it = iteration
        if self.phase == "warmup" and iteration >= self.warmup:
            self._start_sampling()
        return self.phase

    def _after_compressed(self, loss: float) -> float:
        """Count a compressed iteration; the monitor (Eq. 7) votes on its loss, read off this rank's own
        payloads during the ring (no second projection), so a stop applies from the next iteration on, as
        in the per-bucket path.  Returns the vote's seconds (NaN with the monitor off)."""
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

    def allreduce_(self, flat: torch.Tensor, iteration: int) -> dict:
        if self.phase == "compress":
            loss = self._compressed_ring(flat)
            return {"compression_ratio": self._c_ratio, "fit_s": NAN, "compression_error": loss,
                    "monitor_s": self._after_compressed(loss)}
        if self.phase == "sample" and self.sampling == "qsgd":
            ring.reencode_allreduce_(flat, self._q_segs, self.qsgd, self.p2p, self.stopwatch)
            ratio = self._q_ratio
        else:
            ring.allreduce_(flat, self._raw_segs, self.p2p)
            ratio = 1.0
        fit_s = self._add_sample(flat) if self.phase == "sample" else NAN
        return {"compression_ratio": ratio, "fit_s": fit_s}

    def _compressed_ring(self, flat: torch.Tensor) -> float:
        """Algorithm 1; returns this rank's Eq. 7 loss, read off its own payloads as they are made."""
        comp = self.compressor
        with self.codec_session(flat):
            if self.ctx.world_size == 1:                   # no ring: compress and decompress locally
                whole = slice(0, flat.numel())
                with self.stopwatch("compress"):
                    payload = comp.compress(flat, whole)
                with self.stopwatch("decompress"):
                    flat.copy_(comp.decompress(payload, whole))
            else:
                ring.additive_allreduce_(flat, self._c_segs, comp, self.p2p, self.stopwatch)
            return comp.tracked_loss()

    @contextlib.contextmanager
    def codec_session(self, flat: torch.Tensor):
        """The compressed phase's Eq. 7 loss tracking on this rank's gradient ``flat`` (the codec's
        ``track``): its compress calls inside must cover ``flat`` exactly once, as the additive ring's do."""
        self.compressor.track(flat)
        try:
            yield
        finally:
            self.compressor.track(None)

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

    def _add_sample(self, flat: torch.Tensor) -> float:
        self.sample_row(flat.device).copy_(flat)
        return self._after_sample()

    def _after_sample(self) -> float:
        """Count a sampling iteration whose sum is stored; after the L_t-th, refresh the compressor
        (returns fit_s or NaN)."""
        self.count += 1
        return self._refresh() if self.count >= self.L_t else NAN

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
        numel = self.compressor.layout.numel
        self._c_segs = payload_balanced_segments(self.compressor, numel, self.ctx.world_size, self.pieces)
        self._c_ratio = self.compressor.wire_ratio(numel)

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
                "compressor": self.compressor.state_dict(), "qsgd": self.qsgd.state_dict()}   # its dither too

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
        if self.compressor.fitted:
            self._after_fit()

    def summary(self) -> dict:
        """Run-level numbers (summary.json's ``aggregator``)."""
        return {"refreshes": self.refreshes, "relays": self.relays, "monitor_stops": self.monitor_stops,
                "mean_K_over_d": self.compressor.mean_ratio if self.compressor.fitted else math.nan}
