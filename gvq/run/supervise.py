"""The launcher's supervision of its spawned ranks: join them; after a failure restart them all
(``restarts=K``, gvq/run/restart.py) or record why the run ended (``summary.json``) in one line and raise
:class:`gvq.run.errors.RunFailed`."""
from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

from gvq.run.errors import RunFailed
from gvq.run.guards import recorded_stop
from gvq.run.logs import repair_csv, write_json_atomic
from gvq.run.restart import Restart, Restarts, Stuck
from gvq.run.signals import RanksFailed, spawn_and_join


def supervise(worker, run_dir: Path, plain: dict, meta: dict, method: str) -> None:
    """Spawn the ranks and join them; after a failure, with ``restarts=K``, all of them again from the
    newest checkpoint set (gvq/run/restart.py), else report it and raise :class:`RunFailed`.  Each
    attempt's ranks get the checkpoint dir it resumes from (the config's ``resume`` first)."""
    budget, resume = Restarts(plain["restarts"], run_dir), plain["resume"]
    while True:
        meta.update(budget.record())
        init = f"file://{run_dir.resolve()}/.rendezvous-{uuid.uuid4().hex}"
        try:
            spawn_and_join(worker, (plain, meta, init, dict(os.environ), resume), plain["world_size"],
                           start_method=method)
            return
        except RanksFailed as e:
            _fail_if_stopped(run_dir, plain, meta)
            attempt = _next_attempt(budget, run_dir, plain, meta, e)
            if attempt is None:        # its failure came after training completed: results kept
                return
            resume = attempt.resume
        finally:
            Path(init[len("file://"):]).unlink(missing_ok=True)


def _next_attempt(budget: Restarts, run_dir: Path, plain: dict, meta: dict, e: RanksFailed) -> Restart | None:
    """The next attempt after ``e``; a failure not restarted is reported and raises :class:`RunFailed`
    (None: it came after training had completed)."""
    try:
        attempt = budget.after_failure(_last_line(str(e)))
    except Stuck as stuck:
        write_failure(run_dir, plain, meta, str(stuck))
        print(f"gvq: run failed: {stuck}", file=sys.stderr)
        raise RunFailed(1) from None
    if attempt is None:
        _report_failure(run_dir, plain, meta, e)
        return None
    print(f"gvq: a rank failed ({_last_line(str(e))}); restart {len(budget.resumed_from)} of "
          f"{budget.limit} from iteration {attempt.start}", file=sys.stderr)
    return attempt


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "unknown"


def _fail_if_stopped(run_dir: Path, plain: dict, meta: dict) -> None:
    stop = recorded_stop(run_dir)
    if stop is not None:                               # nan_policy=error: the user's own stop
        write_failure(run_dir, plain, meta, stop)
        print(f"gvq: stopped: {stop}", file=sys.stderr)
        raise RunFailed(1)


def _report_failure(run_dir: Path, plain: dict, meta: dict, e: RanksFailed) -> None:
    frozen = e.stopped
    note = (f"rank {', '.join(map(str, frozen))} stopped answering (its process is stopped); the ranks "
            "waiting on it gave up" if frozen else "")
    if write_failure(run_dir, plain, meta, str(e), note=note) == "completed":
        print(f"gvq: warning: a rank failed after training completed (results kept): {e}", file=sys.stderr)
    else:
        print(f"gvq: run failed: {e}" + (f"\ngvq: {note}" if note else ""), file=sys.stderr)
        raise RunFailed(1)


def write_failure(run_dir: Path, cfg: dict, meta: dict, reason: str, status: str = "failed",
                  note: str = "") -> str:
    """Record the failure (``status`` failed or interrupted, the reason, the last iteration whose row is
    complete; a torn last CSV row, from a rank killed mid-write, is cut); a run rank 0 already completed
    (or found diverged) keeps that status, a teardown error noted.  Returns the status recorded."""
    path = run_dir / "summary.json"
    first = reason.strip().splitlines()
    line = first[-1] if first else "unknown"
    line = f"{note}: {line}" if note else line
    try:
        done = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        done = {}
    if done.get("status") == "completed":
        write_json_atomic(path, {**done, "teardown_error": line})
        return "completed"
    status = "diverged" if done.get("status") == "diverged" else status
    write_json_atomic(path, {**done, "status": status, "reason": line,
                             "last_iteration": repair_csv(run_dir / "metrics.csv"), "config": cfg, **meta})
    return status
