"""PowerSGD through our ring: ``python cli.py aggregator=powersgd aggregator.rank=4``.

See docs/design.md#gvqaggregatorspowersgdpy for how it works and why.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from gvq.aggregators.base import FlatAggregator, check_int, equal_segments
from gvq.aggregators.dtypes import widest_dtype
from gvq.comm import ring
from gvq.compressors.powersgd import PowerSGD, block_balanced_segments


class _Plan(NamedTuple):
    """The blocks of a vector (the whole gradient or one DDP bucket) and its ring segments."""
    low_rank: PowerSGD
    p_segs: list
    q_segs: list
    raw: list[slice]


class PowerSGDAggregator(FlatAggregator):
    """Rank-r PowerSGD with warm start and error feedback, both sums on the pipelined ring."""

    name = "powersgd"
    extra_fields = ("compression_error",)

    def __init__(self, rank: int = 2, start_iter: int = 10, min_compression_rate: float = 2.0,
                 warm_start: bool = True):
        self.rank = check_int("aggregator.rank", rank, 1)
        self.start_iter = check_int("aggregator.start_iter", start_iter, 0)
        if isinstance(min_compression_rate, bool) or not isinstance(min_compression_rate, (int, float)) \
                or not min_compression_rate > 0:
            raise ValueError(f"aggregator.min_compression_rate={min_compression_rate!r}: must be > 0")
        if not isinstance(warm_start, bool):
            raise ValueError(f"aggregator.warm_start={warm_start!r}: must be true or false")
        self.min_compression_rate, self.warm_start = float(min_compression_rate), warm_start
        #: this iteration is compressed (iteration >= start_iter; set by aggregate)
        self.compressing = False
        self._m_sq, self._raw_sq = 0.0, 0.0

    def bind(self, params, ctx):
        super().bind(params, ctx)
        device = self.params[0].device if self.params else torch.device("cpu")
        # P, Q and payloads in the flat gradient's dtype (the widest parameter's), float32 at least:
        # 16-bit gradients are factored in float32 (no 16-bit QR; their sums would round at every hop)
        self.low_rank = PowerSGD([p.shape for p in self.params], self.rank, self.min_compression_rate,
                                 self.warm_start, seed=ctx.seed, dtype=self.compute_dtype(self.params))
        # error memory laid out as the whole gradient (blocks are parameters), in that dtype too, so no
        # parameter's share is rounded below its precision; a DDP bucket reads and writes its
        # parameters' share, so any bucketing sees the same memory
        self.error = torch.zeros(self.offsets[-1], dtype=self.low_rank.dtype, device=device)
        self._whole = self._plan(self.low_rank)
        self.p_segs, self.q_segs, self._raw = self._whole.p_segs, self._whole.q_segs, self._whole.raw
        self._buckets: dict[tuple[int, ...], _Plan] = {}

    @staticmethod
    def compute_dtype(tensors) -> torch.dtype:
        """The dtype P and Q are computed and sent in for gradients of ``tensors``' dtypes."""
        return widest_dtype((t.dtype for t in tensors), at_least=torch.float32)

    def _plan(self, low_rank: PowerSGD) -> "_Plan":
        n = self.ctx.world_size
        return _Plan(low_rank, block_balanced_segments(low_rank.blocks, lambda b: b.p_len, n),
                     block_balanced_segments(low_rank.blocks, lambda b: b.q_len, n),
                     [slice(b.start, b.stop) for b in low_rank.blocks if not b.rank])

    @property
    def compression_ratio(self) -> float:
        """fp32 gradient bytes over the payload bytes of both passes."""
        return 4.0 * self.low_rank.numel / max(1, self.low_rank.bytes_per_iteration)

    def aggregate(self, iteration: int) -> dict:
        self.start_iteration(iteration)
        return super().aggregate(iteration)

    def start_iteration(self, iteration: int) -> None:
        """Compressed or not, and a fresh iteration of the P / Q state, once for all buckets."""
        self.compressing = iteration >= self.start_iter
        if self.compressing:
            self.low_rank.begin()

    def measure(self, flat):
        # ||M||^2 for compression_error, untimed; every rank pays it so none waits for rank 0
        if self.compressing:
            plan, error = self._current or (self._whole, self.error)
            self._m_sq = float(torch.linalg.vector_norm(flat + error)) ** 2
            self._raw_sq = sum(float(flat[s].pow(2).sum()) for s in plan.raw)   # e is 0 there
        return {}

    #: the plan and error memory of the vector being averaged (the whole gradient's or a bucket's)
    _current: tuple[_Plan, torch.Tensor] | None = None

    def allreduce_(self, flat, iteration):
        if not self.compressing:
            ring.allreduce_(flat, equal_segments(flat.numel(), self.ctx.world_size), self.p2p)
            return {"phase": "allreduce"}
        plan, error = self._current
        with self.stopwatch("compress"):
            error.add_(flat)                        # M = g + e, kept in the memory buffer
            flat.copy_(error)                       # pass Q reads M from flat and overwrites it
            scratch = error.clone()                 # pass P reads M from scratch (its write-back is void)
        stages = plan.low_rank
        ring.additive_allreduce_(scratch, plan.p_segs, stages.p_stage, self.p2p, self.stopwatch)
        ring.additive_allreduce_(flat, plan.q_segs, stages.q_stage, self.p2p, self.stopwatch)
        with self.stopwatch("compress"):
            error.sub_(flat, alpha=1.0 / self.ctx.world_size)
            for s in plan.raw:
                error[s] = 0.0
        return {"phase": "powersgd"}

    def allreduce_mean_(self, flat, iteration):
        if self._current is None:                            # post-backward: the whole gradient
            self._current = (self._whole, self.error)
            try:
                return super().allreduce_mean_(flat, iteration)
            finally:
                self._current = None
        return super().allreduce_mean_(flat, iteration)

    def allreduce_bucket_(self, flat, params, iteration):
        """One DDP bucket: its parameters' blocks (their Q and P^ are the whole plan's, shared) and error
        memory."""
        plan = self._buckets.get(tuple(params))
        if plan is None:                    # same shapes, same rule: the same blocks as the whole plan
            plan = self._buckets[tuple(params)] = self._plan(self.low_rank.subset(list(params)))
        plan.low_rank.q_local = []
        self._current = (plan, self.gather(self.error, params))
        try:
            return super().allreduce_mean_(flat, iteration)
        finally:
            self.low_rank.q_local.extend(plan.low_rank.q_local)
            self.scatter_(self.error, params, self._current[1])
            self._current = None

    def codec_session(self, flat):
        """A fresh iteration of the P / Q state (a new random Q without warm start) around both passes:
        pass P's decompress leaves P^ that pass Q's compress reads."""
        self.low_rank.begin()
        return contextlib.nullcontext()

    def measure_after(self, flat):
        return {"compression_error": self.compression_error() if self.compressing else 0.0}

    def compression_error(self) -> float:
        """This rank's ||M - P^ P^T M||^2 / ||M||^2 for its last compressed iteration (M = g + e; raw
        blocks count as exact), from the norm :meth:`measure` took before the rings and this rank's
        pass-Q payloads: no pass over the gradient, never part of ``aggregate_s``.  0 before any."""
        # per low-rank block ||M - P^ P^T M||^2 = ||M||^2 - ||P^T M||^2 (P^ orthonormal), and P^T M is
        # this rank's pass-Q payload; raw blocks lose nothing but count in the denominator
        plan = self._whole if self._current is None else self._current[0]
        q_sq = sum(float(q.pow(2).sum()) for q in plan.low_rank.q_local)
        lost = max(0.0, self._m_sq - self._raw_sq - q_sq)
        return lost / self._m_sq if self._m_sq > 0 else 0.0

    def prepare_benchmark(self, grads, args=None) -> None:
        """``gvq.bench``: time the compressed iterations only (and measure as they do)."""
        self.start_iter, self.compressing = 0, True

    def state_dict(self) -> dict:
        return {"powersgd": self.low_rank.state_dict(), "error": self.error.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.low_rank.load_state_dict(state["powersgd"])
        self.error.copy_(state["error"])
