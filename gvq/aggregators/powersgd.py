"""PowerSGD through our ring: ``python cli.py aggregator=powersgd aggregator.rank=4``.

Per iteration (after ``start_iter`` uncompressed ones, as the torch hook's ``start_powerSGD_iter``):

1. M = g + e (error feedback: ``e`` is this rank's residual memory, zero before compression starts);
2. pass P and pass Q of :mod:`gvq.compressors.powersgd`, each through
   :func:`gvq.comm.ring.additive_allreduce_` (GradiVeQ's Algorithm 1: the matmuls of one segment overlap the
   wire of the previous one).  The two sums are sequential -- P^ must exist before anyone can compute
   Q -- so PowerSGD pays 4(N-1) ring steps, twice the latency of one ring; both passes go through
   :class:`gvq.comm.p2p.P2P`, so ``bytes_sent`` and ``wire_s`` include them;
3. e = M - P^ (sum Q)^T / N, the rank's matrix minus the *averaged* approximation (torch's hook and
   epfml/powersgd do the same).  Summed over ranks it equals sum_w (M_w - P^ Q_w^T), the paper's
   per-rank "M minus its own approximation", so both conventions give the same next iteration in exact
   arithmetic.  Raw blocks are exact: their memory stays zero.

The result of pass Q is the *sum* of the approximations; the base class divides by N exactly once.
``compress_s`` holds the matmuls, the error-feedback bookkeeping and nothing else; ``decompress_s`` the
orthogonalizations (P^ in pass P, the next Q in pass Q) and P^ Q^T.  ``compression_error`` is this
rank's ||M - P^ P^T M||^2 / ||M||^2 (its own matrix projected on the shared P^; raw blocks count as
exact), computed outside the timed part from norms the passes leave behind.
"""
from __future__ import annotations

import torch

from gvq.aggregators.base import FlatAggregator, check_int, equal_segments
from gvq.comm import ring
from gvq.compressors.powersgd import PowerSGD, block_balanced_segments


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
        self._compressed, self._m_sq, self._raw_sq = False, 0.0, 0.0

    def setup(self, params, ctx):
        super().setup(params, ctx)
        self.lr = PowerSGD([p.shape for p in self.params], self.rank, self.min_compression_rate,
                           self.warm_start, seed=ctx.seed)
        numel, n = self.bucket.numel(), ctx.world_size
        self.error = torch.zeros(numel, device=self.bucket.device)       # error memory: with the gradient
        self._scratch = torch.empty(numel, device=self.bucket.device)
        self.p_segs = block_balanced_segments(self.lr.blocks, lambda b: b.p_len, n)
        self.q_segs = block_balanced_segments(self.lr.blocks, lambda b: b.q_len, n)
        self._raw = [slice(b.start, b.stop) for b in self.lr.blocks if not b.rank]

    @property
    def compression_ratio(self) -> float:
        """fp32 gradient bytes over the payload bytes of both passes."""
        return 4.0 * self.lr.numel / max(1, self.lr.bytes_per_iteration)

    def aggregate(self, iteration: int) -> dict:
        self._compressed = iteration >= self.start_iter
        stats = super().aggregate(iteration)
        stats["phase"] = "powersgd" if self._compressed else "allreduce"
        stats["compression_error"] = self._local_error() if self._compressed else 0.0
        return stats

    def measure(self, flat):
        # ||M||^2 for compression_error, untimed; every rank pays it so none waits for rank 0
        if self._compressed:
            self._m_sq = float(torch.linalg.vector_norm(flat + self.error)) ** 2
            self._raw_sq = sum(float(flat[s].pow(2).sum()) for s in self._raw)   # e is 0 there
        return {}

    def allreduce_(self, flat, iteration):
        if not self._compressed:
            ring.allreduce_(flat, equal_segments(flat.numel(), self.ctx.world_size), self.p2p)
            return
        self.lr.begin()
        with self.clock("compress"):
            self.error.add_(flat)               # M = g + e, kept in the memory buffer
            flat.copy_(self.error)              # pass Q reads M from flat and overwrites it
            self._scratch.copy_(self.error)     # pass P reads M from scratch (its write-back is void)
        ring.additive_allreduce_(self._scratch, self.p_segs, self.lr.p_stage, self.p2p, self.clock)
        ring.additive_allreduce_(flat, self.q_segs, self.lr.q_stage, self.p2p, self.clock)
        with self.clock("compress"):
            self.error.sub_(flat, alpha=1.0 / self.ctx.world_size)
            for s in self._raw:
                self.error[s] = 0.0

    def _local_error(self) -> float:
        # per low-rank block ||M - P^ P^T M||^2 = ||M||^2 - ||P^T M||^2 (P^ orthonormal), and P^T M is
        # this rank's pass-Q payload; raw blocks lose nothing but count in the denominator
        q_sq = sum(float(q.pow(2).sum()) for q in self.lr.q_local)
        lost = max(0.0, self._m_sq - self._raw_sq - q_sq)
        return lost / self._m_sq if self._m_sq > 0 else 0.0

    def prepare_benchmark(self, grads, args=None) -> None:
        """``gvq.bench``: time the compressed iterations only."""
        self.start_iter = 0

    def state_dict(self) -> dict:
        return {"powersgd": self.lr.state_dict(), "error": self.error.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.lr.load_state_dict(state["powersgd"])
        self.error.copy_(state["error"])
