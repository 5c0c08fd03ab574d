"""Aggregators: what the training loop calls to turn per-rank gradients into their mean.

An aggregator owns the flat gradient buffer and the transport; :meth:`Aggregator.aggregate` overwrites
every ``param.grad`` with the mean over ranks and returns the iteration's measurements
(``compress_s``, ``decompress_s``, ``wire_s``, ``bytes_sent`` and aggregator-specific columns).
Aggregators are built by ``hydra.utils.instantiate(cfg.aggregator)`` and bound to the run with
:meth:`setup`; the training loop knows nothing about any particular one.
"""
from __future__ import annotations

import functools
import pickle
import time
from dataclasses import dataclass

import torch

from . import ring
from .comm import P2P
from .compressors.base import Compressor, split_on_cuts

TOPOLOGIES = ("ring", "allgather", "ps")
HOPS = ("auto", "sum", "reencode")   # ring hop: from the compressor's property, or forced


@dataclass
class RunContext:
    """What an aggregator needs to know about the run it is bound to."""
    rank: int
    world_size: int
    seed: int = 0
    timeout_s: float = 60.0
    bandwidth_bps: float | None = None
    latency_s: float = 0.0
    cfg: dict | None = None        # the resolved run config, for aggregators with run-level knobs
    run_dir: str | None = None     # where rank 0 may write aggregator-specific files (None: nowhere)


class Aggregator:
    """Base: flatten grads, sum them over ranks with :meth:`allreduce_`, divide by N, write back."""

    #: extra per-iteration CSV columns this aggregator reports (values: rank 0's)
    extra_fields: tuple[str, ...] = ()
    name = "aggregator"

    def setup(self, params: list[torch.nn.Parameter], ctx: RunContext) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.ctx = ctx
        self.p2p = P2P(ctx.rank, ctx.world_size, ctx.timeout_s, ctx.bandwidth_bps, ctx.latency_s)
        self.clock = ring.Clock()
        self.bucket = self._grad_bucket()

    def _grad_bucket(self) -> torch.Tensor:
        """One flat buffer that every ``p.grad`` is a view of (as DDP's buckets): backward writes
        straight into it, so flatten / unflatten cost nothing in the default layout."""
        flat = torch.zeros(sum(p.numel() for p in self.params), dtype=self.params[0].dtype,
                           device=self.params[0].device) if self.params else torch.zeros(0)
        offset = 0
        for p in self.params:
            view = flat[offset: offset + p.numel()].view_as(p)
            if p.grad is not None:
                view.copy_(p.grad)
            p.grad = view
            offset += p.numel()
        return flat

    def _grads_in_bucket(self) -> bool:
        offset, base = 0, self.bucket.data_ptr()
        for p in self.params:
            if p.grad is None or p.grad.data_ptr() != base + offset * self.bucket.element_size():
                return False
            offset += p.numel()
        return True

    def flatten(self) -> torch.Tensor:
        """The gradient as one flat vector (the bucket itself while grads still live there)."""
        if self._grads_in_bucket():
            return self.bucket
        return torch.cat([p.grad.reshape(-1) for p in self.params])

    def unflatten(self, flat: torch.Tensor) -> None:
        if flat is self.bucket and self._grads_in_bucket():
            return
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad.copy_(flat[offset: offset + n].view_as(p.grad))
            offset += n

    def allreduce_(self, flat: torch.Tensor, iteration: int) -> dict:
        raise NotImplementedError

    def measure(self, flat: torch.Tensor) -> dict:
        """Untimed per-iteration measurements on this rank's own gradient (before aggregation)."""
        return {}

    def aggregate(self, iteration: int) -> dict:
        """Replace every grad by the mean over ranks; ``aggregate_s`` excludes :meth:`measure`."""
        self.p2p.reset()
        self.clock = ring.Clock()
        t0 = time.perf_counter()
        flat = self.flatten()
        t_flat = time.perf_counter() - t0
        extra = self.measure(flat)
        t0 = time.perf_counter()
        extra.update(self.allreduce_(flat, iteration) or {})
        flat.div_(self.ctx.world_size)
        self.unflatten(flat)
        return {"aggregate_s": t_flat + time.perf_counter() - t0,
                "compress_s": self.clock.get("compress"), "decompress_s": self.clock.get("decompress"),
                "wire_s": self.p2p.wire_s, "bytes_sent": self.p2p.bytes_sent, **extra}

    def close(self) -> None:
        if hasattr(self, "p2p"):
            self.p2p.close()

    def state_dict(self) -> dict:
        """What a checkpoint must keep for a bitwise resume (nothing, for a stateless aggregator)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class RingAllReduce(Aggregator):
    """(a) Uncompressed ring all-reduce over N equal segments (the baseline)."""

    name = "rar"

    def allreduce_(self, flat, iteration):
        ring.allreduce_(flat, equal_segments(flat.numel(), self.ctx.world_size), self.p2p)


@functools.lru_cache(maxsize=64)
def equal_segments(numel: int, n: int) -> list[slice]:
    """``n`` contiguous segments of sizes differing by at most one (empty when numel < n)."""
    base, extra = divmod(numel, n)
    bounds = [0]
    for i in range(n):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


class CompressedAggregator(Aggregator):
    """A compressor on a topology: ``ring`` picks mode (b) for additive compressors, else (c);
    ``allgather`` / ``ps`` is mode (d).  Logs rank 0's relative compression error per iteration."""

    extra_fields = ("compression_error",)

    def __init__(self, compressor: Compressor, topology: str = "ring", hop: str = "auto"):
        if topology not in TOPOLOGIES:
            raise ValueError(f"aggregator.topology={topology!r}: must be one of {', '.join(TOPOLOGIES)}")
        if hop not in HOPS:
            raise ValueError(f"aggregator.hop={hop!r}: must be one of {', '.join(HOPS)}")
        if hop == "sum" and not compressor.additive:
            raise ValueError(f"aggregator.hop=sum: compressor {compressor.name!r} is not additive, its "
                             "payloads cannot be summed in the compressed domain; use hop=auto or reencode")
        self.compressor, self.topology = compressor, topology
        # ring hop: sum payloads (mode b) when the compressor allows it, unless forced to re-encode
        self.sum_hop = compressor.additive and hop != "reencode"
        self.name = getattr(compressor, "name", type(compressor).__name__)

    def setup(self, params, ctx):
        super().setup(params, ctx)
        if hasattr(self.compressor, "reseed"):
            self.compressor.reseed(ctx.seed * 1000 + ctx.rank)
        self._segs: tuple[int, list[slice]] | None = None

    def state_dict(self) -> dict:
        # the compressor whole: dither generators and banks, learned bases (pickling is its contract)
        return {"compressor": pickle.dumps(self.compressor)}

    def load_state_dict(self, state: dict) -> None:
        self.compressor = pickle.loads(state["compressor"])

    def segments(self, numel: int) -> list[slice]:
        if self._segs is None or self._segs[0] != numel:
            self._segs = (numel, split_on_cuts(self.compressor.cuts(numel), self.ctx.world_size))
        return self._segs[1]

    def measure(self, flat):
        # every rank pays the same cost, so no rank waits for rank 0's measurement
        return {"compression_error": self.local_error(flat)}

    def allreduce_(self, flat, iteration):
        comp = self.compressor
        if self.topology != "ring":
            ring.gather_allreduce_(flat, comp, self.p2p, self.clock, self.topology)
        elif self.sum_hop:
            ring.additive_allreduce_(flat, self.segments(flat.numel()), comp, self.p2p, self.clock)
        else:
            ring.reencode_allreduce_(flat, self.segments(flat.numel()), comp, self.p2p, self.clock)

    def local_error(self, flat: torch.Tensor) -> float:
        """||Q(G) - G||^2 / ||G||^2 on this rank's own gradient (not timed as aggregation)."""
        whole = slice(0, flat.numel())
        with torch.no_grad():
            q = self.compressor.decompress(self.compressor.compress(flat, whole), whole)
            denom = float(flat.pow(2).sum())
            return float((q - flat).pow(2).sum()) / denom if denom > 0 else 0.0
