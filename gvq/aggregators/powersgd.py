"""PowerSGD through our ring: ``python cli.py aggregator=powersgd aggregator.rank=4``.

See docs/design.md#gvqaggregatorspowersgdpy for how it works and why.
"""
from __future__ import annotations

import contextlib
import torch

from gvq.aggregators.base import check_int, equal_segments
from gvq.aggregators.flat import FlatAggregator
from gvq.aggregators.dtypes import widest_dtype
from gvq.aggregators.error_feedback import ErrorFeedback
from gvq.aggregators.nodes import average_on_nodes, tensor_cuts
from gvq.comm.ring import Ring
from gvq.compressors._kernels import check_kernels
from gvq.compressors.powersgd import PowerSGD, block_balanced_segments


class PowerSGDAggregator(FlatAggregator):
    """Rank-r PowerSGD with warm start and error feedback, both sums on the pipelined ring."""

    name = "powersgd"
    extra_fields = FlatAggregator.extra_fields + ("compression_error",)

    def __init__(self, *, rank: int, start_iter: int, min_compression_rate: float, warm_start: bool, kernels: str,
                 topology: str):
        """Every knob as given (its default lives in ``PowerSGDSchema``: :func:`gvq.schema.options.knobs`)."""
        self.rank = check_int("aggregator.rank", rank, 1)
        self.start_iter = check_int("aggregator.start_iter", start_iter, 0)
        if isinstance(min_compression_rate, bool) or not isinstance(min_compression_rate, (int, float)) \
                or not min_compression_rate > 0:
            raise ValueError(f"aggregator.min_compression_rate={min_compression_rate!r}: must be > 0")
        if not isinstance(warm_start, bool):
            raise ValueError(f"aggregator.warm_start={warm_start!r}: must be true or false")
        self.min_compression_rate, self.warm_start = float(min_compression_rate), warm_start
        self.kernels = check_kernels(kernels)
        # hierarchical: the node is PowerSGD's worker (gvq/aggregators/nodes.py): its shard holds whole matrices,
        # whose low-rank factors are per matrix, summed inside the node, then PowerSGD across nodes
        self.topology = topology
        #: this iteration is compressed (iteration >= start_iter; set by aggregate)
        self.compressing = False

    def bind(self, params, ctx):
        super().bind(params, ctx)
        device = self.params[0].device if self.params else torch.device("cpu")
        # P, Q and payloads in the flat gradient's dtype (the widest parameter's), float32 at least:
        # 16-bit gradients are factored in float32 (no 16-bit QR; their sums would round at every hop)
        self.low_rank = PowerSGD([p.shape for p in self.params], self.rank, self.min_compression_rate,
                                 self.warm_start, seed=ctx.seed, dtype=self.compute_dtype(self.params),
                                 kernels=self.kernels)
        # error memory (blocks are parameters) in that dtype too: no parameter's share is rounded below
        # its precision; its steps around the rings on the path ``kernels`` chooses (one kernel each on Triton)
        self.feedback = ErrorFeedback(self.offsets[-1], self.low_rank.dtype, device, kernels=self.kernels)

    def per_parameter(self):
        """The error memory: a bucket feeds back its share."""
        return self.feedback.per_parameter()

    @staticmethod
    def compute_dtype(tensors) -> torch.dtype:
        """The dtype P and Q are computed and sent in for gradients of ``tensors``' dtypes."""
        return widest_dtype((t.dtype for t in tensors), at_least=torch.float32)

    def plan(self, params: tuple[int, ...]) -> PowerSGD:
        """The low-rank plan of a vector of ``params`` (the whole plan, or a subset sharing its Q and P^:
        the same blocks, whichever bucket they land in)."""
        if params == self.everything:
            return self.low_rank
        return self.memo(("plan", params), lambda: self.low_rank.subset(list(params)))

    def rings(self, params, n):
        """Hierarchical: declared as the two passes across nodes on shards of whole matrices (run by
        :func:`gvq.aggregators.nodes.average_on_nodes`, not by :meth:`Ring.run_`)."""
        if self.topology == "hierarchical":
            cuts = tensor_cuts(self, params)
            if not self.compressing:
                return [Ring("hierarchical", cuts, inner="plain")]
            low = self.plan(params)
            return [Ring("hierarchical", cuts, low.p_stage, "P", inner="additive"),
                    Ring("hierarchical", cuts, low.q_stage, "Q", inner="additive")]
        return self.flat_rings(params, n)

    def flat_rings(self, params, n):
        """The flat algorithm's rings at ``n`` ranks: uncompressed, or pass P and pass Q."""
        if not self.compressing:
            return [Ring("plain", equal_segments(self.numel_of(params), n))]
        low = self.plan(params)
        p_segs, q_segs = self.memo(("segs", params, n), lambda: (
            block_balanced_segments(low.blocks, lambda b: b.p_len, n),
            block_balanced_segments(low.blocks, lambda b: b.q_len, n)))
        return [Ring("additive", p_segs, low.p_stage, "P"), Ring("additive", q_segs, low.q_stage, "Q")]

    def extra_passes(self) -> int:
        """Compressed: M = g + e, its copies into ``flat`` and the P pass's scratch, e -= the mean."""
        return 4 if self.compressing else 0

    @property
    def compression_ratio(self) -> float:
        """fp32 gradient bytes over the payload bytes of both passes."""
        return 4.0 * self.low_rank.numel / max(1, self.low_rank.bytes_per_iteration)

    def start_iteration(self, iteration: int) -> None:
        """Compressed or not, and a fresh iteration of the P / Q state, once for all buckets."""
        self.compressing = iteration >= self.start_iter
        if self.compressing:
            self.low_rank.begin()

    def measure(self, bucket):
        # ||M||^2 for compression_error, untimed; every rank pays it so none waits for rank 0 (hierarchical: the
        # node's M is known only on its shard, measured there inside the step)
        if self.compressing and self.topology != "hierarchical":
            self._note_norms(bucket)
        return {}

    def _note_norms(self, bucket) -> None:
        flat, error = bucket.flat, self.feedback.share(bucket)
        bucket.notes["m_sq"] = float(torch.linalg.vector_norm(flat + error)) ** 2
        bucket.notes["raw_sq"] = sum(float(flat[s].pow(2).sum()) for s in self._raw(bucket.params))

    def _raw(self, params) -> list[slice]:
        """The blocks sent uncompressed (their error memory stays 0)."""
        return self.memo(("raw", params), lambda: [slice(b.start, b.stop) for b in self.plan(params).blocks
                                                    if not b.rank])

    def average(self, bucket):
        if self.topology == "hierarchical":
            average_on_nodes(self, bucket, self.mean_among)
        else:
            self.mean_among(bucket, self.p2p, self.ctx.world_size)
        return {"phase": "powersgd" if self.compressing else "allreduce"}

    def mean_among(self, bucket, p2p, n: int) -> None:
        """The flat algorithm: ``bucket.flat`` replaced by its mean over the ``n`` ranks of ``p2p``."""
        rings = self.flat_rings(bucket.params, n)
        if not self.compressing:
            rings[0].run_(bucket.flat, p2p, self.stopwatch)
            bucket.flat.div_(n)
            return
        if self.topology == "hierarchical":         # the node's M: measured on its shard
            self._note_norms(bucket)
        flat, fb = bucket.flat, self.feedback
        error = fb.share(bucket)
        p_ring, q_ring = rings
        self.plan(bucket.params).q_local = []
        with self.stopwatch("compress"):
            scratch = fb.fold_in_(error, flat)      # M = g + e, in the memory, in ``flat`` and the scratch
        p_ring.run_(scratch, p2p, self.stopwatch)
        q_ring.run_(flat, p2p, self.stopwatch)
        with self.stopwatch("compress"):           # e = M - the mean P^ P^T M (raw blocks 0); flat /= n
            fb.keep_mean_(error, flat, n, self._raw(bucket.params), lambda: self._raw_mask(bucket.params, error.device))
        if self.topology == "hierarchical":
            bucket.notes["error"] = self.compression_error(bucket)

    def _raw_mask(self, params, device: torch.device) -> torch.Tensor:
        """1 on the values of the blocks sent raw in ``params``' vector (uint8): the Triton path's fills."""
        def build():
            mask = torch.zeros(self.numel_of(params), dtype=torch.uint8)
            for s in self._raw(params):
                mask[s] = 1
            return mask.to(device)
        return self.memo(("raw mask", params, device), build)

    def codec_session(self, flat, params=None):
        """A fresh iteration of the P / Q state (a new random Q without warm start) around both passes:
        pass P's decompress leaves P^ that pass Q's compress reads."""
        self.low_rank.begin()
        return contextlib.nullcontext()

    def measure_after(self, bucket):
        if not self.compressing:
            return {"compression_error": 0.0}
        if self.topology == "hierarchical":       # the shard's, from its step (an empty shard: none)
            return {"compression_error": bucket.notes.get("error", float("nan"))}
        return {"compression_error": self.compression_error(bucket)}

    def compression_error(self, bucket) -> float:
        """This rank's ||M - P^ P^T M||^2 / ||M||^2 on the vector just averaged (M = g + e; raw blocks
        count as exact), from the norm :meth:`measure` took before the rings and this rank's pass-Q
        payloads: no pass over the gradient, never part of ``aggregate_s``."""
        # per low-rank block ||M - P^ P^T M||^2 = ||M||^2 - ||P^T M||^2 (P^ orthonormal), and P^T M is
        # this rank's pass-Q payload; raw blocks lose nothing but count in the denominator
        m_sq = bucket.notes["m_sq"]
        q_sq = sum(float(q.pow(2).sum()) for q in self.plan(bucket.params).q_local)
        lost = max(0.0, m_sq - bucket.notes["raw_sq"] - q_sq)
        return lost / m_sq if m_sq > 0 else 0.0

    def prepare_benchmark(self, grads, args=None) -> None:
        """``gvq.bench``: time the compressed iterations only (and measure as they do)."""
        self.start_iter, self.compressing = 0, True

    def state_dict(self) -> dict:
        return {"powersgd": self.low_rank.state_dict(), **self.feedback.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.low_rank.load_state_dict(state["powersgd"])
        self.feedback.load_state_dict(state)
