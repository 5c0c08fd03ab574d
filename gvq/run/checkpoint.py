"""Checkpoints every ``checkpoint.every`` iterations and ``resume=<run dir>``.

Each rank writes its own file (``checkpoint/rank<r>.pt``: model, optimizer, lr schedule, torch RNG,
aggregator state such as GradiVeQ's basis or a quantizer's dither generator, running totals), atomically
(temporary file + rename); after a barrier rank 0 writes ``checkpoint/latest.json``, so a checkpoint is
complete exactly when that file names it.  Resuming loads every rank's file, keeps the old run's CSV rows
before the checkpoint in the new run dir and continues: the data stream, being a pure function of
(seed, epoch, rank, batch), restarts at the saved iteration, so the resumed run's metrics equal an
uninterrupted run's, times aside.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save(run_dir: str, rank: int, it: int, model, opt, sched, agg, extra: dict) -> None:
    """Checkpoint after iteration ``it - 1``: the resumed run starts at ``it``."""
    folder = Path(run_dir) / "checkpoint"
    folder.mkdir(exist_ok=True)
    state = {"iteration": it, "model": model.state_dict(), "optimizer": opt.state_dict(),
             "scheduler": sched.state_dict(), "torch_rng": torch.get_rng_state(),
             "aggregator": agg.state_dict() if hasattr(agg, "state_dict") else {}, **extra}
    _atomic_save(state, folder / f"rank{rank}.pt")
    dist.barrier()                      # every rank's file is in place before the marker
    if rank == 0:
        marker = folder / "latest.json"
        tmp = marker.with_name("latest.json.tmp")
        tmp.write_text(json.dumps({"iteration": it, "world_size": dist.get_world_size()}))
        os.replace(tmp, marker)


def load(resume_dir: str, rank: int, world: int) -> dict:
    folder = Path(resume_dir) / "checkpoint"
    marker = folder / "latest.json"
    if not marker.exists():
        raise FileNotFoundError(f"resume={resume_dir}: no complete checkpoint (checkpoint/latest.json) there")
    meta = json.loads(marker.read_text())
    if meta["world_size"] != world:
        raise ValueError(f"resume={resume_dir}: checkpoint has world_size={meta['world_size']}, run has {world}")
    # data only: tensors, numbers, strings, lists, dicts (a checkpoint from elsewhere runs no code here)
    state = torch.load(folder / f"rank{rank}.pt", weights_only=True)
    if state["iteration"] != meta["iteration"]:
        raise RuntimeError(f"resume={resume_dir}: rank {rank}'s file does not match latest.json")
    return state


def restore(state: dict, model, opt, sched, agg) -> None:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    if state["aggregator"] and hasattr(agg, "load_state_dict"):
        agg.load_state_dict(state["aggregator"])


def previous_rows(resume_dir: str, before: int) -> list[dict]:
    """The resumed run's CSV rows of iterations before the checkpoint (as strings, written back as is)."""
    path = Path(resume_dir) / "metrics.csv"
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [row for row in csv.DictReader(f) if row["iteration"] and int(row["iteration"]) < before]
