"""Deep Gradient Compression (Lin et al., ICLR 2018), as its first author wrote it (synxlin/deep-gradient-
compression ``dgc/memory.py``): ``python cli.py aggregator=dgc optim.momentum=0``.

Each rank keeps the momentum here, not in the optimizer (the run's SGD must have none: refused otherwise):

* **local clipping** (``clip`` = C): the rank's gradient g scaled to a norm of at most C N^(-1/2), before
  anything else (PaddlePaddle's ``DGCMomentumOptimizer``; synxlin's helper, off there by default);
* **momentum correction**: u <- m u + g, then v <- v + u; the codec (:class:`gvq.compressors.dgc.DGC`)
  sends v's selected values (and the 1-D tensors' whole), which leave v (cleared);
* **momentum factor masking** (``masking``): u cleared where v was sent, so a stale momentum does not push
  a value that has just gone out.  Not on the dense tensors, which synxlin never masks;
* the mean of the ranks' sent vectors is the gradient the plain SGD outside steps on.

So at ratio 1 every value goes out every step: with masking off the step is lr times the mean of the
ranks' u, which is momentum SGD's buffer of the mean gradient; with masking on u is g every step, plain
SGD (but on the 1-D tensors, still momentum SGD).  Weight decay stays in the optimizer, outside the
momentum (synxlin gives it a momentum buffer of its own).  Payloads are all-gathered: a ring or a server
would re-sparsify a partial sum.
"""
from __future__ import annotations

import math

import torch

from gvq.aggregators.base import refuse_optimizer_momentum
from gvq.aggregators.compressed import CompressedAggregator
from gvq.aggregators.dtypes import widest_dtype
from gvq.aggregators.error_feedback import fed_back_error
from gvq.aggregators.nodes import average_on_nodes, tensor_cuts
from gvq.comm.ring import Ring
from gvq.compressors.dgc import DGC


class DGCAggregator(CompressedAggregator):
    """:class:`CompressedAggregator` of a :class:`DGC` codec whose ranks keep DGC's momentum and residual."""

    def __init__(self, compressor: DGC, *, topology: str, hop: str, ef_decay: float, ef_units: str,
                 momentum: float, masking: bool, clip: float | None):
        # its accumulation v is its error feedback: ef_decay / ef_units other than theirs are refused there
        super().__init__(compressor, topology=topology, hop=hop, ef_decay=ef_decay, ef_units=ef_units)
        if not isinstance(compressor, DGC):
            raise ValueError(f"aggregator=dgc: compressor {compressor.name!r} is not DGC")
        if topology not in ("allgather", "hierarchical"):
            raise ValueError(f"aggregator.topology={topology}: DGC's supports differ per rank and a partial sum "
                             "re-sparsified would lose what v owes: use topology=allgather (or hierarchical)")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"aggregator.momentum={momentum!r}: must be in [0, 1) (the paper's 0.9)")
        if clip is not None and not (math.isfinite(clip) and clip > 0):
            raise ValueError(f"aggregator.clip={clip!r}: must be > 0 (the norm bound C; null: no clipping)")
        self.momentum, self.masking, self.clip = float(momentum), bool(masking), clip

    @classmethod
    def check_run(cls, cfg: dict) -> None:
        refuse_optimizer_momentum("dgc", cfg)

    def bind(self, params, ctx):
        super().bind(params, ctx)
        device = self.params[0].device if self.params else torch.device("cpu")
        dtype = widest_dtype((p.dtype for p in self.params), at_least=torch.float32)
        self.u = torch.zeros(self.offsets[-1], dtype=dtype, device=device)     # the momentum
        self.v = torch.zeros_like(self.u)                                      # the accumulation, not yet sent

    def per_parameter(self):
        return {"dgc_u": self.u, "dgc_v": self.v}

    def measure(self, bucket):
        return {}          # the error of v falls out of the average (see measure_after)

    def clip_(self, g: torch.Tensor, n: int) -> None:
        """g scaled to a norm of at most C n^(-1/2), n workers (no host read: the factor stays on the device)."""
        bound = self.clip / math.sqrt(n)
        g.mul_((bound / torch.linalg.vector_norm(g).clamp_min(1e-30)).clamp(max=1.0))

    def average(self, bucket):
        """Hierarchical: the node is DGC's worker (:mod:`gvq.aggregators.nodes`): its ranks' gradients summed
        densely inside the node on shards of whole tensors (a tensor's top-k is per tensor), then DGC's
        momentum, accumulation and all-gather across nodes on each shard, with the shard's u and v; a dense
        sum inside the node is nearly free on its fast links, and the sparse all-gather, whose bytes grow with
        the workers, has M of them instead of N."""
        if self.topology == "hierarchical":
            average_on_nodes(self, bucket, self.mean_among)
        else:
            self.mean_among(bucket, self.p2p, self.ctx.world_size)

    def mean_among(self, bucket, p2p, n: int) -> None:
        """DGC's step at ``n`` workers on the ranks of ``p2p``: ``bucket.flat`` becomes the mean of their sent
        vectors."""
        flat, u, v = bucket.flat, bucket.state["dgc_u"], bucket.state["dgc_v"]
        if self.clip is not None:
            self.clip_(flat, n)
        u.mul_(self.momentum).add_(flat)
        v.add_(u)
        flat.copy_(v)
        codec, whole = self.codec_for(bucket.params), slice(0, flat.numel())
        Ring("allgather", [[whole]], codec).run_(flat, p2p, self.stopwatch)   # the sent vectors' sum
        flat.div_(n)
        self.compressor.check_health()
        with self.stopwatch("compress"):         # this rank's own payload again (a deterministic codec)
            payload = codec.compress(v, whole)
        with self.stopwatch("decompress"):
            sent = codec.decompress(payload, whole)
        v.sub_(sent)                             # 0 where sent: the values are v's, copied (float32 v: exactly)
        if self.masking:
            u.masked_fill_((sent != 0) & ~codec.dense_mask(whole, u.device), 0.0)
        bucket.notes["sent"] = sent

    def rings(self, params, n):
        if self.topology == "hierarchical":        # declared for the cost model; run by mean_among on shards
            return [Ring("hierarchical", tensor_cuts(self, params), self.codec_for(params), inner="allgather")]
        return super().rings(params, n)

    def measure_after(self, bucket):
        # hierarchical: this rank's shard of v against what its node sent from it
        shard = bucket.notes.get("shard", slice(0, bucket.flat.numel()))
        if "sent" not in bucket.notes:             # an empty shard
            return {"compression_error": float("nan")}
        return {"compression_error": fed_back_error(bucket.state["dgc_v"][shard], bucket.notes["sent"])}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "dgc_u": self.u.clone(), "dgc_v": self.v.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.u.copy_(state["dgc_u"])
        self.v.copy_(state["dgc_v"])
