"""Planned kills, for the kill soak (``python -m gvq.bench soak``) and fault tests: a rank SIGKILLs itself,
as an outside ``kill -9`` would, at a chosen point of a chosen iteration of a chosen attempt of a run.

``GVQ_KILLS="ATTEMPT:ITERATION:RANK[:POINT] ..."`` (space- or comma-separated; unset or empty: no kill) is
read here and nowhere else.  ATTEMPT 0 is the run's first start, k its start after the k-th restart
(``restarts=K``, or torchrun's ``--max-restarts``): a resumed attempt passes the iteration that killed
the one before unless its own entry names it again.  POINT, where in ITERATION the rank dies:

* ``row`` (the default): right after the iteration's row is in ``metrics.csv``, before its checkpoint (a
  checkpoint due there is not written);
* ``aggregate``: after backward, before the aggregate (the other ranks die inside theirs).

At a planned point every rank first meets the others (a barrier), so rank 0 has written exactly
ITERATION + 1 rows (``row``) or ITERATION (``aggregate``) when the rank dies, on a machine of any speed.
The dying rank says so on stderr in one line (:func:`announced` reads those lines back).
"""
from __future__ import annotations

import os
import re
import signal
import sys
from dataclasses import dataclass

import torch.distributed as dist

ENV = "GVQ_KILLS"
POINTS = ("row", "aggregate")
_ANNOUNCED = re.compile(r"^gvq: planned kill (\S+):", re.MULTILINE)


@dataclass(frozen=True)
class Kill:
    """One planned SIGKILL: ``rank`` dies at ``point`` of ``iteration`` in attempt ``attempt``."""
    attempt: int
    iteration: int
    rank: int
    point: str = "row"

    @property
    def rows(self) -> int:
        """The rows ``metrics.csv`` holds when the rank dies."""
        return self.iteration + (self.point == "row")

    def __str__(self) -> str:
        return f"{self.attempt}:{self.iteration}:{self.rank}:{self.point}"


def parse(text: str) -> list[Kill]:
    """The kills a ``GVQ_KILLS`` value names; ValueError (one line) on a malformed entry."""
    kills = []
    for entry in text.replace(",", " ").split():
        parts = entry.split(":")
        try:
            kill = Kill(*map(int, parts[:3]), *parts[3:]) if len(parts) >= 3 else None
        except (TypeError, ValueError):
            kill = None
        if kill is None or min(kill.attempt, kill.iteration, kill.rank) < 0 or kill.point not in POINTS:
            raise ValueError(f"{ENV}={text!r}: {entry!r} is not ATTEMPT:ITERATION:RANK[:POINT] (non-negative "
                             f"integers; POINT {' or '.join(POINTS)})")
        kills.append(kill)
    return kills


def planned() -> list[Kill]:
    """This run's plan, from the environment (the launcher's, which every rank adopts)."""
    return parse(os.environ.get(ENV, ""))


def plan_text(kills: list[Kill]) -> str:
    """The ``GVQ_KILLS`` value for ``kills``."""
    return " ".join(map(str, kills))


def announced(stderr: str) -> list[Kill]:
    """The kills a run's stderr says happened, in order."""
    return [parse(entry)[0] for entry in _ANNOUNCED.findall(stderr)]


def _sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Kills:
    """One rank's view of its attempt's plan: every rank meets the others at each planned point, and the
    planned rank dies there.  ``meet`` and ``die`` are the barrier and the SIGKILL (replaceable in tests)."""

    def __init__(self, plan: list[Kill], rank: int, attempt: int, meet=dist.barrier, die=_sigkill):
        self.rank, self.meet, self.die = rank, meet, die
        self.here: dict[tuple[int, str], list[Kill]] = {}
        for kill in plan:
            if kill.attempt == attempt:
                self.here.setdefault((kill.iteration, kill.point), []).append(kill)

    def at(self, iteration: int, point: str) -> None:
        """Called by every rank at ``point`` of each iteration."""
        kills = self.here.get((iteration, point))
        if not kills:
            return
        self.meet()
        for kill in kills:
            if kill.rank == self.rank:
                print(f"gvq: planned kill {kill}: rank {self.rank} SIGKILLs itself ({kill.rows} rows written; "
                      f"{ENV})", file=sys.stderr, flush=True)
                self.die()



def install(rank: int, attempt: int, callbacks: list | None = None) -> Kills | None:
    """Attach this rank's kills of attempt ``attempt`` (``GVQ_KILLS``) to the training loop's iteration
    callbacks (:data:`gvq.run.train.ITERATION_CALLBACKS`), replacing any a previous attempt in this
    process attached; returns them (None: none planned for this attempt)."""
    if callbacks is None:
        from gvq.run.train import ITERATION_CALLBACKS as callbacks
    for old in _INSTALLED:
        if old in callbacks:
            callbacks.remove(old)
    _INSTALLED.clear()
    kills = Kills(planned(), rank, attempt)
    if not kills.here:
        return None
    callbacks.append(kills.at)
    _INSTALLED.append(kills.at)
    return kills


#: the callbacks :func:`install` attached, so that a later attempt in the same process replaces them
_INSTALLED: list = []
