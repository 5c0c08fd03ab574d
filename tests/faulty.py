"""Aggregators that fail on purpose, for fault tests (importable by spawned ranks via PYTHONPATH)."""
from __future__ import annotations

import os

from gvq.aggregate import RingAllReduce


class FailAt(RingAllReduce):
    """Rank ``rank`` raises (or dies with ``os._exit``) at iteration ``at``."""

    def __init__(self, at: int = 5, rank: int = 1, how: str = "raise"):
        self.at, self.rank, self.how = at, rank, how

    def allreduce_(self, flat, iteration):
        if iteration == self.at and self.ctx.rank == self.rank:
            if self.how == "exit":
                os._exit(3)
            raise RuntimeError(f"injected failure on rank {self.rank} at iteration {iteration}")
        return super().allreduce_(flat, iteration)
