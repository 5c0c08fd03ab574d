"""Checkpoints every ``checkpoint.every`` iterations and ``resume=<run dir>``.

See docs/design.md#gvqruncheckpointpy for how it works and why.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from gvq.run.logs import write_json_atomic

try:                                                   # the installed distribution's version
    from importlib.metadata import version as _dist_version
    __version__ = _dist_version("gvq")
except Exception:                                      # running from a bare checkout
    __version__ = "unknown"


#: identity keys compared on resume, in the order a mismatch is reported (the version is only recorded)
COMPARED = ("world_size", "aggregator", "model", "dataset", "optim", "method", "num_classes", "in_channels")


#: an identity key newer than some checkpoints, and what a checkpoint without it was written with (every
#: run before methods existed averaged the gradients every step)
ADDED_KEYS = {"method": '{"_target_": "gvq.methods.every_step.EveryStep"}'}


class ResumeError(ValueError):
    """A checkpoint that does not belong to this run or cannot be read; its message is one line."""


def identity(cfg: dict, aggregator: str, num_classes: int, in_channels: int, world: int) -> dict:
    """What a checkpoint belongs to: every key that changes a tensor's shape or what the state means."""
    def as_text(node) -> str:
        return json.dumps(node, sort_keys=True, default=str)
    # pooled, the default, named as runs before dataset.split wrote it (without it): their checkpoints resume
    dataset = {k: v for k, v in cfg["dataset"].items() if (k, v) != ("split", "pooled")}
    return {"gvq_version": __version__, "world_size": int(world), "aggregator": str(aggregator),
            "model": as_text(cfg["model"]), "dataset": as_text(dataset), "optim": as_text(cfg["optim"]),
            "method": as_text(cfg["method"]),
            "num_classes": int(num_classes), "in_channels": int(in_channels)}

def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def set_dir(run_dir: str | Path, it: int) -> Path:
    return Path(run_dir) / "checkpoint" / f"iter-{it:09d}"


def save(run_dir: str, rank: int, it: int, model, opt, sched, agg, extra: dict, ident: dict,
         keep: int = 2) -> None:
    """Checkpoint after iteration ``it - 1`` (the resumed run starts at ``it``) as a new set, published
    when every rank's file is in it; then all but the newest ``keep`` sets are removed."""
    folder = set_dir(run_dir, it)
    folder.mkdir(parents=True, exist_ok=True)
    state = {"iteration": it, "identity": ident, "model": model.state_dict(), "optimizer": opt.state_dict(),
             "scheduler": sched.state_dict(), "torch_rng": torch.get_rng_state(),
             "aggregator": agg.state_dict(), **extra}
    _atomic_save(state, folder / f"rank{rank}.pt")
    dist.barrier()                      # every rank's file is in place before the set is published
    if rank == 0:
        meta = {"iteration": it, "world_size": dist.get_world_size(), "identity": ident, "set": folder.name}
        write_json_atomic(folder / "complete.json", meta)
        write_json_atomic(folder.parent / "latest.json", meta)          # a pointer for people; resume scans
        for old in complete_sets(folder.parent)[:-max(keep, 1)]:
            shutil.rmtree(old, ignore_errors=True)


def complete_sets(root: Path) -> list[Path]:
    """The published sets under ``root`` (``checkpoint/``), oldest first."""
    return sorted(p.parent for p in root.glob("iter-*/complete.json"))


def newest(resume_dir: str) -> tuple[Path, dict]:
    """The newest complete set of a run dir and its record; :class:`ResumeError` if there is none."""
    root = Path(resume_dir) / "checkpoint"
    sets = complete_sets(root)
    if not sets:
        what = "only unfinished sets" if any(root.glob("iter-*")) else "none"
        raise ResumeError(f"resume={resume_dir}: no complete checkpoint set under {root} ({what}; a set is "
                          "complete when its complete.json exists)")
    try:
        return sets[-1], json.loads((sets[-1] / "complete.json").read_text())
    except (OSError, ValueError):
        raise ResumeError(f"resume={resume_dir}: {sets[-1]}/complete.json is unreadable") from None


def load(resume_dir: str, rank: int, world: int) -> dict:
    folder, meta = newest(resume_dir)
    if meta["world_size"] != world:
        raise ValueError(f"resume={resume_dir}: checkpoint has world_size={meta['world_size']}, run has {world}")
    # data only: tensors, numbers, strings, lists, dicts (a checkpoint from elsewhere runs no code here)
    state = torch.load(folder / f"rank{rank}.pt", weights_only=True)
    if state["iteration"] != meta["iteration"]:
        raise RuntimeError(f"resume={resume_dir}: rank {rank}'s file does not match {folder}/complete.json")
    return state


def check_resume(resume_dir: str, ident: dict) -> None:
    """Raise :class:`ResumeError` (one line) unless ``resume_dir`` holds a complete, readable checkpoint
    set written by a run with the same :data:`COMPARED` identity as ``ident``."""
    folder, meta = newest(resume_dir)
    old = meta.get("identity") if isinstance(meta, dict) else None
    if not isinstance(old, dict):
        raise ResumeError(f"resume={resume_dir}: {folder}/complete.json is not a gvq checkpoint record (no "
                          "identity: written by another tool)")
    for key in COMPARED:
        was = old.get(key, ADDED_KEYS.get(key))
        if was != ident[key]:
            raise ResumeError(f"resume={resume_dir}: the checkpoint was written with "
                              f"{key}={_clip_value(was)}, this run has {key}={_clip_value(ident[key])}")
    for r in range(ident["world_size"]):
        _check_rank_file(folder / f"rank{r}.pt", meta["iteration"], old)


def _clip_value(v) -> str:
    return v if not isinstance(v, str) or len(v) < 120 else v[:117] + "..."


def _check_rank_file(path: Path, iteration: int, ident: dict) -> None:
    try:       # mmap: reads the archive's index and the tensors' headers, not megabytes of state
        state = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except Exception as e:                           # truncated zip, foreign pickle, missing file, ...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ResumeError(f"resume: {path} is unreadable or not a gvq checkpoint ({first[:200]})") from None
    if not isinstance(state, dict) or state.get("identity") != ident or state.get("iteration") != iteration:
        raise ResumeError(f"resume: {path} does not belong to this checkpoint (its identity or iteration differs "
                          "from its set's complete.json: a mixed checkpoint set)")


def restore(state: dict, model, opt, sched, agg, method) -> None:
    """Every part of a rank's state back from its checkpoint file (the method's: DiLoCo's global copy and
    outer momentum; saved by the loop beside the progress, ``state["method"]``)."""
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    if state["aggregator"]:
        agg.load_state_dict(state["aggregator"])
    if state.get("method"):                          # older checkpoints (every_step then) have none
        method.load_state_dict(state["method"])


def previous_rows(resume_dir: str, before: int) -> list[dict]:
    """The resumed run's CSV rows of iterations before the checkpoint (as strings, written back as is);
    a restart in place reads the crashed attempt's rows where it set them aside."""
    path = previous_rows_path(resume_dir)
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [row for row in csv.DictReader(f) if row["iteration"] and int(row["iteration"]) < before]


#: a run restarted in place (restarts=K, gvq/run/restart.py): the crashed attempt's rows while the
#: restart writes them back
SET_ASIDE = ".metrics-restart.csv"


def previous_rows_path(resume_dir: str) -> Path:
    """Where a resume reads the rows before its checkpoint: a restart's set-aside, else the CSV."""
    aside = Path(resume_dir) / SET_ASIDE
    return aside if aside.exists() else Path(resume_dir) / "metrics.csv"
