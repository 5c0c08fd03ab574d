"""Run a function on N gloo ranks (file rendezvous in a temp dir), with a deadline: a rank that raises
fails the caller with its traceback, a rank that dies fails it with its exit code or signal, and a hang
fails after ``timeout`` seconds (every rank killed).

The ranks are forked from the launcher's fork server (:mod:`gvq.run.warm`), started once for the whole
test session with torch, gvq and these helpers already imported: a group costs a fork and a rendezvous,
not an interpreter and its imports (a spawn paid ~4 s of imports per rank, the largest cost of the suite).
Each group is new, so nothing one test leaves in a rank (a process group, a thread, a global) reaches the
next.  ``GVQ_START_METHOD=spawn`` gives fresh interpreters instead, as it does for the launcher."""
from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta
from pathlib import Path

import torch
from gvq.comm.group import process_group
import torch.multiprocessing as mp

from gvq.run.warm import PRELOAD, adopt_environment, start_fork_server, start_method

# imported once in the fork server, beside the launcher's own list: what every test's ranks import
TEST_PRELOAD = [*PRELOAD, "pytest", "tests.helpers.dist"]


def start_test_fork_server() -> str:
    """The start method for test ranks; where it is the fork server, start it now with
    :data:`TEST_PRELOAD` (a no-op once running: the launcher's tests share it)."""
    start_fork_server(TEST_PRELOAD)
    return start_method()


def _entry(rank, fn, world, init, out_dir, env, args):
    adopt_environment(env)             # the caller's environment now, not the fork server's at its start
    torch.set_num_threads(1)
    with process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60)):
        torch.save(fn(rank, world, *args), Path(out_dir) / f"{rank}.pt")


def run_ranks(fn, world: int, tmp_path, *args, timeout: float = 120.0) -> list:
    """``fn(rank, world, *args)`` on every rank; returns the list of per-rank results."""
    out = Path(tmp_path) / f"ranks-{uuid.uuid4().hex[:8]}"
    out.mkdir(parents=True)
    init = f"file://{out}/rendezvous"
    ctx = mp.start_processes(_entry, args=(fn, world, init, str(out), dict(os.environ), args), nprocs=world,
                             join=False, start_method=start_test_fork_server())
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks of {getattr(fn, '__name__', fn)} did not finish within {timeout}s")
    finally:
        for p in ctx.processes:          # a hang, or the other ranks of one that failed: none outlives its test
            if p.is_alive():
                p.kill()
                p.join(5.0)
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
    """``fn(rank, world, *case)`` for every case, one after another in one group of ``world`` ranks (a
    group costs more than a small case); returns ``{case: [rank 0's result, rank 1's, ...]}``."""
    per_rank = run_ranks(_cases, world, tmp_path, fn, cases, timeout=30.0 + timeout_per_case * len(cases))
    return {case: [r[case] for r in per_rank] for case in cases}


def once_per_key(run):
    """``get(key, *args)``: ``run(*args)`` the first time ``key`` is asked for, its result after; for a
    module fixture whose group of ranks serves many tests.  A group that failed fails each test that asks
    for it with what it raised (kept, not run again)."""
    done: dict = {}

    def get(key, *args):
        if key not in done:
            try:
                done[key] = run(*args)
            except Exception as e:                      # kept for the group's other tests
                done[key] = e
        if isinstance(done[key], Exception):
            raise done[key]
        return done[key]
    return get
