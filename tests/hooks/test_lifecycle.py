"""gvq.hooks.state's lifecycle on 2 gloo ranks: a state times on its own lanes (two states in one process
share none, the process's stay untouched), and peers are waited for as long as the process group says
unless the state is told otherwise (a rank pausing between steps is waited out)."""
from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gvq.comm import clock
from gvq.comm.p2p import peer_timeout_s
from gvq.hooks import GvqHookState, gvq_hook
from tests.helpers.dist import run_ranks

pytestmark = pytest.mark.slow


class SpyClock(clock.RankClock):
    """A wall lane that records which threads bound or read it."""

    def __init__(self):
        super().__init__()
        self.bound, self.readers = [], set()

    def bind_thread(self):
        self.bound.append(threading.current_thread().name)
        super().bind_thread()

    def now(self):
        self.readers.add(threading.current_thread().name)
        return super().now()


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _step(ddp, rank, it):
    g = torch.Generator().manual_seed(10 * it + rank)
    x, y = torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()


def _two_states(rank, world):
    process = clock.lanes()
    states, ddps = [], []
    for _ in range(2):
        net = _net()
        lanes = clock.Lanes(SpyClock(), SpyClock())
        state = GvqHookState.from_config("rar", net.parameters(), lanes=lanes)
        ddp = DistributedDataParallel(net)
        ddp.register_comm_hook(state, gvq_hook)
        states.append(state)
        ddps.append(ddp)
    for it in range(2):
        for ddp, state in zip(ddps, states):
            _step(ddp, rank, it)
            state.iteration_stats()
    out = [(s.lanes.compute.readers, s.lanes.comm.bound, s.lanes.comm.readers) for s in states]
    for s in states:
        s.close()
    return out, clock.lanes() is process


def test_two_states_in_one_process_time_on_their_own_lanes(tmp_path):
    for out, process_lanes_kept in run_ranks(_two_states, 2, tmp_path):
        assert process_lanes_kept
        for compute_readers, comm_bound, comm_readers in out:
            assert compute_readers == {"MainThread"}                # the hook: backward's thread reads it
            assert len(comm_bound) == 1 and comm_bound[0].startswith("gvq-comm-rank")
            assert comm_readers == set(comm_bound)                  # only its own thread reads its lane


def test_a_state_owns_fresh_lanes_unless_given():
    net = _net()
    a = GvqHookState.from_config("rar", net.parameters(), rank=0, world_size=1)
    b = GvqHookState.from_config("rar", net.parameters(), rank=0, world_size=1)
    assert a.lanes is not b.lanes and clock.lanes() not in (a.lanes, b.lanes)
    given = clock.Lanes()
    assert GvqHookState.from_config("rar", net.parameters(), rank=0, world_size=1, lanes=given).lanes is given
    for s in (a, b):
        s.close()


def test_without_a_process_group_the_peer_timeout_is_torchs_default_unless_given():
    assert not dist.is_initialized()
    assert peer_timeout_s(None) == dist.default_pg_timeout.total_seconds()
    assert peer_timeout_s(7) == 7.0


def _paused(rank, world, timeout_s):
    """Rank 0 pauses 3 s before its third step (after DDP's bucket rebuild, forward waits for no peer: the
    other rank waits in the hook's ring); returns what the rank's steps raised and its timeouts."""
    net = _net()
    ddp = DistributedDataParallel(net)
    kw = {} if timeout_s is None else {"timeout_s": timeout_s}
    state = GvqHookState.from_config("qsgd", net.parameters(), **kw)
    ddp.register_comm_hook(state, gvq_hook)
    errors = []
    for it in range(4):
        if rank == 0 and it == 2:
            time.sleep(3.0)                     # an evaluation, a checkpoint
        try:
            _step(ddp, rank, it)
            state.iteration_stats()
        except Exception as e:                  # noqa: BLE001 (what backward raised)
            errors.append(str(e))
            break
    timeouts = (state.timeout_s, state.aggregator.p2p.timeout.total_seconds())
    state.close()
    return errors, timeouts


def test_a_paused_rank_is_waited_for_as_long_as_the_process_group_says(tmp_path):
    # tests.helpers.dist starts its process group with a 60 s timeout: the hook follows it
    for errors, timeouts in run_ranks(_paused, 2, tmp_path / "default", None):
        assert errors == [] and timeouts == (60.0, 60.0)
    # told 1 s, the rank waiting for the paused one gives up, naming whom it lost
    errors, timeouts = run_ranks(_paused, 2, tmp_path / "short", 1.0)[1]
    assert timeouts == (1.0, 1.0)
    assert len(errors) == 1 and "rank 1: lost rank 0" in errors[0]
