"""Run a function on N gloo ranks (spawned processes, file rendezvous in a temp dir), with a deadline:
a rank that raises fails the caller with its traceback; a hang fails after ``timeout`` seconds."""
from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank, fn, world, init, out_dir, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        result = fn(rank, world, *args)
        torch.save(result, Path(out_dir) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(fn, world: int, tmp_path, *args, timeout: float = 120.0) -> list:
    """``fn(rank, world, *args)`` on every rank; returns the list of per-rank results."""
    out = Path(tmp_path) / f"ranks-{uuid.uuid4().hex[:8]}"
    out.mkdir(parents=True)
    init = f"file://{out}/rendezvous"
    ctx = mp.start_processes(_entry, args=(fn, world, init, str(out), args), nprocs=world,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"ranks did not finish within {timeout}s")
    return [torch.load(out / f"{r}.pt") for r in range(world)]


def env_without_hydra():
    env = dict(os.environ)
    env["WANDB_MODE"] = "disabled"
    return env


def _cases(rank, world, fn, cases):
    out = {}
    for case in cases:
        try:
            out[case] = fn(rank, world, *case)
        except Exception as e:
            raise RuntimeError(f"rank {rank}: {fn.__name__}{case} failed") from e
    return out


def run_cases(fn, world: int, tmp_path, cases: tuple, timeout_per_case: float = 60.0) -> dict:
    """``fn(rank, world, *case)`` for every case, one after another in one spawn of ``world`` ranks (a
    spawn costs more than a small case); returns ``{case: [rank 0's result, rank 1's, ...]}``."""
    per_rank = run_ranks(_cases, world, tmp_path, fn, cases, timeout=30.0 + timeout_per_case * len(cases))
    return {case: [r[case] for r in per_rank] for case in cases}
