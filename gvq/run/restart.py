"""``restarts=K``: when a rank dies or a peer is lost, the launcher stops every rank (as without
restarts), then starts all of them again from the newest complete checkpoint set in the same run dir,
up to K times; after the K-th failure the run fails as it would have without restarts.

``metrics.csv`` stays one row per iteration: a restart keeps the rows before its checkpoint and
replaces the ones after it (:func:`set_aside_rows`, :func:`~gvq.run.checkpoint.previous_rows_path`); with no
checkpoint yet it starts over from iteration 0.  A run that fails again without completing a new row stops at once, in
one line (K identical crashes would only burn time).  A deliberate stop (a signal, ``nan_policy=error``,
a config error) is never restarted.  Under torchrun ``--max-restarts=K`` the restarted workers find the
newest set the same way (:func:`resume_point`): give them a fixed ``hydra.run.dir``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gvq.run.checkpoint import SET_ASIDE, complete_sets
from gvq.run.logs import repair_csv


class Stuck(RuntimeError):
    """A restart made no progress: the run failed again before completing a new row."""


@dataclass(frozen=True)
class Restart:
    """The next attempt after a failure: from iteration ``start``, resuming from the checkpoint set in
    ``resume`` (the run dir), or from scratch (None)."""
    start: int
    resume: str | None


class Restarts:
    """The launcher's restart budget and record (``summary.json``: ``restarts``, ``resumed_from``)."""

    def __init__(self, limit: int, run_dir: Path):
        self.limit, self.run_dir = int(limit), Path(run_dir)
        self.resumed_from: list[int] = []
        self._last_row: int | None = -2            # the last complete row at the previous failure

    def record(self) -> dict:
        return {"restarts": len(self.resumed_from), "resumed_from": list(self.resumed_from)}

    def after_failure(self, reason: str) -> Restart | None:
        """A rank failed: the next attempt, or None when no restart is left (the run fails as without
        restarts); raise :class:`Stuck` when the attempt made no progress."""
        if len(self.resumed_from) >= self.limit:
            return None
        last = repair_csv(self.run_dir / "metrics.csv")
        if last == self._last_row:
            raise Stuck(f"restart {len(self.resumed_from)} of {self.limit} failed again before iteration "
                        f"{(-1 if last is None else last) + 1} completed: not restarting ({reason})")
        self._last_row = last
        start, resume = resume_point(self.run_dir)
        if resume is None:
            discard_rows(self.run_dir)
        self.resumed_from.append(start)
        return Restart(start, resume)


def resume_point(run_dir: Path) -> tuple[int, str | None]:
    """(first iteration, ``resume`` value) for a run restarted in ``run_dir``: its newest complete
    checkpoint set, or iteration 0 and None."""
    sets = complete_sets(Path(run_dir) / "checkpoint")
    if not sets:
        return 0, None
    return int(sets[-1].name.split("-")[-1]), str(run_dir)


def torchrun_restart() -> bool:
    """Started again by torchrun's elastic agent (``--max-restarts``)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


def attempt_store(rank: int, world: int, timeout):
    """The rendezvous store for a torchrun restart, under a prefix of its own: the agent's store outlives
    an attempt, so without it a restarted rank can read the dead attempt's gloo addresses before its peer
    has written its new ones (and fail connecting to a closed port)."""
    import torch.distributed as dist
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"     # the agent hosts the store
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent and rank == 0, timeout=timeout, multi_tenant=not agent)
    return dist.PrefixStore(f"gvq/attempt-{os.environ['TORCHELASTIC_RESTART_COUNT']}", store)


def discard_rows(run_dir: Path) -> None:
    """A restart from iteration 0: every row is written again."""
    for name in ("metrics.csv", SET_ASIDE):
        (Path(run_dir) / name).unlink(missing_ok=True)


def same_dir(resume: str | None, run_dir: str) -> bool:
    return resume is not None and Path(resume).resolve() == Path(run_dir).resolve()


def set_aside_rows(run_dir: str) -> None:
    """Before a restart writes its CSV again: move the crashed attempt's rows aside (unless an earlier
    restart's set-aside is still there: that one is complete, this CSV only partly replayed)."""
    path, aside = Path(run_dir) / "metrics.csv", Path(run_dir) / SET_ASIDE
    if path.exists() and not aside.exists():
        path.replace(aside)
    path.unlink(missing_ok=True)


def rows_replayed(run_dir: str) -> None:
    """The restarted CSV holds every kept row again: the set-aside goes."""
    (Path(run_dir) / SET_ASIDE).unlink(missing_ok=True)
