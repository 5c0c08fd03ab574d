"""Aggregators that fail on purpose, for fault tests (importable by spawned ranks via PYTHONPATH)."""
from __future__ import annotations

import os
import signal

import torch

from gvq.aggregators.base import Aggregator
from gvq.aggregators.rar import RingAllReduce


class TermWhenRecorded(RuntimeError):
    """A failure whose message, the first time it is read (as a rank records the failure), sends SIGTERM to
    its own process: the launcher's SIGTERM arriving at the worst moment, deterministically."""

    sent = False                     # per instance once set: one SIGTERM, however often the message is read

    def __str__(self):
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)
        return super().__str__()


class FailAt(RingAllReduce):
    """Rank ``rank`` raises (or dies with ``os._exit``, or raises :class:`TermWhenRecorded`: ``how=term``)
    at iteration ``at`` (or each of a list).
    ``once``: each such iteration fails only the first time the run dir reaches it (a marker file), so
    a restarted run gets past it."""

    def __init__(self, at=5, rank: int = 1, how: str = "raise", once: bool = False, **rar):
        super().__init__(**rar)                  # rar's own keys (its topology)
        self.at = [at] if isinstance(at, int) else list(at)
        self.rank, self.how, self.once = rank, how, once

    def _fails(self, iteration: int) -> bool:
        if iteration not in self.at or self.ctx.rank != self.rank:
            return False
        if not self.once:
            return True
        marker = os.path.join(self.ctx.run_dir, f".failat-{iteration}")
        if os.path.exists(marker):
            return False
        open(marker, "w").close()
        return True

    def average(self, bucket):
        if self._fails(bucket.iteration):
            if self.how == "exit":
                os._exit(3)
            if self.how == "term":
                raise TermWhenRecorded(f"injected failure on rank {self.rank} at iteration {bucket.iteration}")
            raise RuntimeError(f"injected failure on rank {self.rank} at iteration {bucket.iteration}")
        return super().average(bucket)


class NaNAt(torch.nn.Module):
    """DigitsCNN whose forward multiplies the output by ``factor`` on ``rank`` at its ``at``-th training
    call (every call from then on with ``forever``): NaN poisons the loss; a large finite factor gives
    gradients finite in fp32 that overflow fp16 (max 65504) on the wire."""

    def __init__(self, num_classes=10, in_channels=1, at: int = 3, rank: int = 1, width: int = 4,
                 factor: float = float("nan"), forever: bool = False):
        super().__init__()
        from gvq.models import DigitsCNN
        self.net, self.at, self.rank, self.calls = DigitsCNN(num_classes, in_channels, width=width), at, rank, 0
        self.factor, self.forever = factor, forever

    def forward(self, x):
        out = self.net(x)
        if self.training:
            self.calls += 1
            import torch.distributed as dist
            hit = self.calls > self.at if self.forever else self.calls == self.at + 1
            if hit and dist.get_rank() == self.rank:
                out = out * self.factor
        return out


class DieAt:
    """Wraps any aggregator; rank ``rank`` dies with ``os._exit`` at iteration ``at``."""

    #: what the run's validation asks of an aggregator's class before any rank starts: the contract's default
    check_run = Aggregator.check_run

    def __init__(self, inner, at: int = 13, rank: int = 1):
        self.inner, self.at, self.rank = inner, at, rank

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def aggregate(self, iteration):
        if iteration == self.at and self.inner.ctx.rank == self.rank:
            os._exit(3)
        return self.inner.aggregate(iteration)


class ChanceAfter(torch.nn.Module):
    """DigitsCNN that forgets everything after ``at`` training calls: from then on its logits are zero, in
    training and evaluation alike, so the loss is exactly ln C and the accuracy that of always guessing 0."""

    def __init__(self, num_classes=10, in_channels=1, at: int = 10, width: int = 4):
        super().__init__()
        from gvq.models import DigitsCNN
        self.net, self.at, self.calls = DigitsCNN(num_classes, in_channels, width=width), at, 0

    def forward(self, x):
        self.calls += int(self.training)
        out = self.net(x)
        return out * 0 if self.calls > self.at else out
