"""Rank 0's outputs: ``metrics.csv`` (one row per iteration, flushed per row), wandb, ``summary.json``.

Only rank 0 constructs a :class:`RunLog`; other ranks never touch files or wandb.  wandb gets the resolved
config, a group (the experiment or the sweep), the run name from the overrides, and metrics namespaced
``train/``, ``test/``, ``time/``, ``comm/``; :meth:`RunLog.close` always finishes it (call it in
``finally``), marking the run failed when it was.
"""
from __future__ import annotations

import csv
import json
import logging
import math
import os
import signal
import time
from pathlib import Path

from gvq.run.signals import Interrupted
from gvq.schema import columns
from gvq.schema.config import NOT_A_SETTING

BASE_FIELDS = columns.BASE      # every run's columns, in the CSV's order (gvq/schema/columns.py)

log = logging.getLogger("gvq")


def setup_logging(rank: int) -> None:
    """Spawned ranks do not inherit Hydra's logging: configure each one (rank 0 INFO, others WARNING)."""
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, force=True,
                        format=f"[%(asctime)s][rank {rank}][%(levelname)s] %(message)s")


def mark(meta: dict, event: str) -> None:
    """Stamp a start-up event (epoch seconds) into ``meta['startup']``, which summary.json carries:
    process (the launcher's start), main, spawn, rank_start, rendezvous, built, logger, first_step, trained
    (``python -m gvq.bench startup`` turns them into the split)."""
    meta.setdefault("startup", {})[event] = time.time()


def process_start() -> float | None:
    """When this process started (epoch seconds, to a kernel clock tick), from Linux /proc; else None."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])        # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None




def setting_of(overrides: list, inert: list = ()) -> str:
    """The run's setting: its overrides minus seed, logging and knobs its aggregator does not read, so in
    wandb "group by setting" puts a method's seeds together (mean ± std bands), as the report does."""
    kept = sorted(o for o in overrides if not o.lstrip("+~").startswith(NOT_A_SETTING)
                  and o.lstrip("+~").split("=", 1)[0] not in inert)
    return " ".join(kept) or "default"


class RunLog:
    def __init__(self, run_dir: str | Path, fields: tuple[str, ...], cfg: dict, meta: dict):
        self.run_dir = Path(run_dir)
        self.fields = tuple(BASE_FIELDS) + tuple(f for f in fields if f not in BASE_FIELDS)
        self._wandb_keys = {f: columns.column(f).wandb_key for f in self.fields}   # undeclared: KeyError
        self.cfg, self.meta = cfg, meta
        self.last_iteration = None          # the last iteration whose row is written
        self._csv = None
        if cfg["logger"]["csv"]:
            # "x": never over existing rows (another run's, or this dir's before a mistaken reuse)
            self._file = open(self.run_dir / "metrics.csv", "x", newline="")
            self._csv = csv.DictWriter(self._file, fieldnames=self.fields, extrasaction="ignore")
            self._csv.writeheader()
            self._file.flush()
        self.wandb = self._init_wandb()

    def _init_wandb(self):
        wcfg = self.cfg["logger"]["wandb"]
        if not wcfg["enabled"] or wcfg["mode"] == "disabled":
            return None
        import wandb  # lazily: a slow import, only needed on rank 0
        os.environ.setdefault("WANDB_SILENT", "true")
        return wandb.init(project=wcfg["project"], entity=wcfg["entity"], mode=wcfg["mode"],
                          dir=str(self.run_dir), group=self.meta.get("group"),
                          config={**self.cfg, "setting": setting_of(self.meta.get("overrides") or [],
                                                                    self.meta.get("inert_knobs") or [])},
                          job_type=self.meta.get("job_type"), name=self.meta.get("name"),
                          tags=list(wcfg["tags"]), reinit="finish_previous")

    def row(self, values: dict, replay: bool = False) -> None:
        """Append one iteration's row; ``replay`` rows (kept from a resumed run) skip wandb."""
        if self._csv is not None:
            self._csv.writerow({k: _fmt(v) for k, v in values.items()})
            self._file.flush()
        self.last_iteration = int(values["iteration"])
        if self.wandb is not None and not replay:
            data = {self._wandb_keys[k]: v for k, v in values.items() if k in self._wandb_keys
                    and k not in ("iteration", "phase") and isinstance(v, (int, float)) and not _nan(v)}
            self.wandb.log(data, step=int(values["iteration"]))

    def summary(self, summary: dict) -> None:
        write_json_atomic(self.run_dir / "summary.json", summary)
        if self.wandb is not None:
            for k, v in summary.items():
                if isinstance(v, (int, float, str)):
                    self.wandb.summary[k] = v

    def failure(self, exc: BaseException) -> None:
        """``summary.json`` for a run that stopped early, written by rank 0 itself (under torchrun no
        launcher is there to write it): interrupted (a signal) or failed, why, the last complete row."""
        stopped = isinstance(exc, KeyboardInterrupt)          # a signal (Interrupted) or Ctrl-C itself
        if stopped:
            reason = f"stopped by {signal.Signals(exc.signum).name}" if isinstance(exc, Interrupted) else "stopped"
        else:
            reason = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        self.summary({"status": "interrupted" if stopped else "failed", "reason": reason,
                      "last_iteration": self.last_iteration, "config": self.cfg, **self.meta})

    def close(self, failed: bool = False) -> None:
        if self._csv is not None:
            self._file.close()
            self._csv = None
        if self.wandb is not None:
            self.wandb.finish(exit_code=1 if failed else 0)
            self.wandb = None


def write_json_atomic(path: Path, data, indent: int | None = 2) -> None:
    """Write JSON to a temporary file and rename it over ``path``: readers never see half a file.  The
    folder is made first: a bench's ``--out`` that took minutes to measure is not lost to a folder the
    user had not created yet."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent, default=str))
    os.replace(tmp, path)


def repair_csv(path: Path) -> int | None:
    """Cut a torn last row (a rank killed mid-write leaves a line without its newline); return the last
    complete row's iteration (None: no row)."""
    if not path.exists():
        return None
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)
            data = data[: data.rfind(b"\n") + 1]
    rows = data.decode(errors="replace").splitlines()[1:]
    try:
        return int(rows[-1].split(",", 1)[0]) if rows else None
    except ValueError:
        return None


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _fmt(v):
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return v
