"""gvq.comm.group: a rank leaves its group only after every peer is done, with its cycles collected while
the group is alive; a rank leaving on an exception does not wait for peers that may be gone."""
from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from gvq.comm.group import process_group
from tests.helpers.dist import start_test_fork_server


class _Cycle:
    """An object in a reference cycle (as DDP's reducer is): freed by the collector, not by refcount."""

    def __init__(self, seen: dict):
        self.me, self.seen = self, seen

    def __del__(self):
        self.seen["initialized_when_freed"] = dist.is_initialized()


def _work(rank: int, seen: dict, out: str, fail: bool) -> None:
    _Cycle(seen)                              # unreachable at return, yet alive until a collection
    if rank == 0 and fail:                    # the slow peer waits until the failed one has left (it must
        deadline = time.monotonic() + 60      # not wait at a barrier for this one): no race with the clock
        while not Path(out, "1.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    elif rank == 0:
        time.sleep(1.0)                       # the slow peer: the other must not leave before it is done
    seen["block_done"] = time.time()


def _rank(rank: int, init: str, out: str, fail: bool) -> None:
    seen: dict = {}
    try:
        with process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60)):
            _work(rank, seen, out, fail)
            if fail and rank == 1:
                raise RuntimeError("deliberate")
    except RuntimeError:
        seen["raised"] = True
    seen["left"] = time.time()
    Path(out, f"{rank}.json").write_text(json.dumps(seen))


def _run(tmp_path, fail: bool) -> list[dict]:
    init = f"file://{tmp_path}/rendezvous"
    mp.start_processes(_rank, args=(init, str(tmp_path), fail), nprocs=2, start_method=start_test_fork_server())
    return [json.loads(Path(tmp_path, f"{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(120)
def test_a_clean_rank_leaves_after_its_slow_peer_with_its_cycles_collected_inside_the_group(tmp_path):
    fast, slow = _run(tmp_path, fail=False)[::-1]
    assert fast["left"] >= slow["block_done"]          # the barrier: ordering, not a duration
    assert fast["initialized_when_freed"] and slow["initialized_when_freed"]


@pytest.mark.timeout(120)
def test_a_rank_leaving_on_an_exception_skips_the_barrier(tmp_path):
    slow, failed = _run(tmp_path, fail=True)
    assert failed["raised"] and not dist.is_initialized()
    assert failed["left"] < slow["block_done"]          # it did not wait at a barrier for its slow peer
