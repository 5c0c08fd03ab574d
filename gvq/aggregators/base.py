"""The aggregator contract: what the training loop calls to turn per-rank gradients into their mean.

An aggregator owns the transport; :meth:`Aggregator.aggregate` overwrites every ``param.grad`` with the
mean over ranks and returns the iteration's measurements (``aggregate_s``, ``compress_s``,
``decompress_s``, ``wire_s``, ``stage_s`` (host copies of device payloads on a non-NCCL group; 0 on CPU),
``bytes_sent`` and the columns it names in ``extra_fields``).  Aggregators
are built by ``hydra.utils.instantiate(cfg.aggregator)`` from ``conf/aggregator/<name>.yaml`` and bound
to the run with :meth:`Aggregator.setup`; the training loop knows nothing about any particular one.

To add one: a file in this package with a class satisfying :class:`Aggregator` (usually a
:class:`FlatAggregator` subclass implementing ``allreduce_``), and a YAML in ``conf/aggregator/``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from gvq.comm import clock
from gvq.comm.p2p import P2P
from gvq.compressors._segments import balanced_segments
from gvq.compressors.base import check_int  # noqa: F401 (the one integer-argument check; re-exported)


@runtime_checkable
class Aggregator(Protocol):
    """The one contract every aggregator satisfies (``conf/aggregator/*`` all do, torch DDP's included).

    Optional extras the runner and benchmarks look for: ``wrap(model) -> model`` (aggregators that live
    inside backward, e.g. DDP), ``prepare_benchmark(grads, args)`` (fit state before timing) and
    ``summary() -> dict`` (run-level figures for ``summary.json``).
    """

    #: short label for logs and reports
    name: str
    #: extra per-iteration CSV columns :meth:`aggregate` reports (values: rank 0's)
    extra_fields: tuple[str, ...]

    def setup(self, params: list[torch.nn.Parameter], ctx: RunContext) -> None:
        """Bind to this rank's parameters and the run (called once, after construction)."""

    def aggregate(self, iteration: int) -> dict:
        """Replace every ``param.grad`` by the mean over ranks; return the iteration's measurements."""

    def close(self) -> None:
        """Release the transport (threads, links)."""

    def state_dict(self) -> dict:
        """What a checkpoint must keep for a bitwise resume."""

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output (after :meth:`setup`)."""


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


class FlatAggregator:
    """The shared implementation: flatten grads into one bucket, sum them over ranks with
    :meth:`allreduce_` (through :class:`gvq.comm.p2p.P2P`), divide by N, write back.  Subclasses
    implement :meth:`allreduce_` and, if they measure something untimed, :meth:`measure`."""

    #: extra per-iteration CSV columns this aggregator reports (values: rank 0's)
    extra_fields: tuple[str, ...] = ()
    name = "aggregator"
    #: all its traffic goes through P2P, so net.clock=virtual can time it (DDP's cannot)
    virtual_time = True

    def setup(self, params: list[torch.nn.Parameter], ctx: RunContext) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.ctx = ctx
        self.p2p = P2P(ctx.rank, ctx.world_size, ctx.timeout_s, ctx.bandwidth_bps, ctx.latency_s)
        self.clock = clock.Stopwatch()
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
        self.clock = clock.Stopwatch()
        t0 = clock.now()
        flat = self.flatten()
        t_flat = clock.now() - t0
        extra = self.measure(flat)
        t0 = clock.now()
        extra.update(self.allreduce_(flat, iteration) or {})
        flat.div_(self.ctx.world_size)
        self.unflatten(flat)
        return {"aggregate_s": t_flat + clock.now() - t0,
                "compress_s": self.clock.get("compress"), "decompress_s": self.clock.get("decompress"),
                "wire_s": self.p2p.wire_s, "stage_s": self.p2p.stage_s, "bytes_sent": self.p2p.bytes_sent,
                **extra}

    def close(self) -> None:
        if hasattr(self, "p2p"):
            self.p2p.close()

    def state_dict(self) -> dict:
        """What a checkpoint must keep for a bitwise resume (nothing, for a stateless aggregator)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@functools.lru_cache(maxsize=64)
def equal_segments(numel: int, n: int) -> list[slice]:
    """``n`` contiguous segments of sizes differing by at most one (empty when numel < n); cached: the
    ring asks for the same split every iteration."""
    return balanced_segments(numel, n)
