"""This rank's clock: the one place gvq reads time (``net.clock=wall|virtual``).

``wall`` (the default): ``time.perf_counter()``.  With more ranks than cores it measures the host's
contention as much as the algorithm.

``virtual`` is an online simulation in the manner of SimGrid's SMPI: the real code runs, but each rank's
clock advances only

* by the CPU time of its own thread while it computes (``time.thread_time()``; one intra-op thread per
  rank), multiplied by the scale of the current phase: ``net.compute_scale`` for forward / backward /
  optimizer (1/6: a GPU 6x faster, as in the GradiVeQ paper), ``net.codec_scale`` for compress /
  decompress / PCA, 1 for everything else;
* and by the link model when it waits for a message (:mod:`gvq.comm.p2p` moves it to the message's
  arrival time, computed from the sender's clock).

Time a rank spends blocked in a real wait is never counted, and nothing sleeps, so a 2-core host can
simulate 16 ranks on a 10 Gbit/s network.  Each rank is a process: the clock is a process global, set
once per run by :func:`configure`.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

CLOCKS = ("wall", "virtual")
PHASES = ("compute", "codec")       # scaled phases; everything else advances at scale 1


class RankClock:
    """Wall clock, or the virtual clock described in the module docstring."""

    def __init__(self, mode: str = "wall", compute_scale: float = 1.0, codec_scale: float = 1.0):
        if mode not in CLOCKS:
            raise ValueError(f"net.clock={mode!r}: must be one of {', '.join(CLOCKS)}")
        for key, v in (("net.compute_scale", compute_scale), ("net.codec_scale", codec_scale)):
            if not v > 0:
                raise ValueError(f"{key}={v!r}: must be > 0")
        self.mode = mode
        self.scales = {"compute": float(compute_scale), "codec": float(codec_scale)}
        self._t = 0.0                           # virtual seconds banked so far
        self._cpu = time.thread_time()          # CPU reading the bank is up to date with
        self._scale = 1.0                       # scale of the phase running now

    @property
    def virtual(self) -> bool:
        return self.mode == "virtual"

    def now(self) -> float:
        """Seconds on this rank's clock (an arbitrary origin: only differences mean anything)."""
        if not self.virtual:
            return time.perf_counter()
        cpu = time.thread_time()
        self._t += (cpu - self._cpu) * self._scale
        self._cpu = cpu
        return self._t

    @contextmanager
    def phase(self, name: str):
        """CPU time inside runs at ``name``'s scale (nested phases: the innermost wins)."""
        if not self.virtual:
            yield
            return
        self.now()
        outer, self._scale = self._scale, self.scales[name]
        try:
            yield
        finally:
            self.now()
            self._scale = outer

    @contextmanager
    def blocked(self):
        """A real wait (a message, a peer): the CPU it burns is not this rank's computation."""
        if not self.virtual:
            yield
            return
        self.now()
        try:
            yield
        finally:
            self._cpu = time.thread_time()

    def advance_to(self, t: float) -> None:
        """Virtual mode: nothing happens on this rank before ``t`` (a message's arrival)."""
        if self.virtual:
            self._t = max(self.now(), t)


_CLOCK = RankClock()


def configure(mode: str = "wall", compute_scale: float = 1.0, codec_scale: float = 1.0) -> RankClock:
    """Set this process's (= this rank's) clock for a run; returns it."""
    global _CLOCK
    _CLOCK = RankClock(mode, compute_scale, codec_scale)
    return _CLOCK


def get() -> RankClock:
    return _CLOCK


def now() -> float:
    return _CLOCK.now()


def phase(name: str):
    return _CLOCK.phase(name)


def sync(group=None) -> float:
    """Virtual mode: every rank's clock to the latest of them (a collective outside :class:`P2P`, e.g.
    the per-iteration statistics, is a synchronisation point); returns the clock.  Wall: a no-op."""
    if _CLOCK.virtual:
        import torch
        import torch.distributed as dist
        t = torch.tensor([_CLOCK.now()], dtype=torch.float64)
        with _CLOCK.blocked():
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        _CLOCK.advance_to(float(t))
    return _CLOCK.now()
