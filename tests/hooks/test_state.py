"""gvq.hooks: the DDP communication hook on 2-3 in-process gloo ranks — each bucket's result equals the
aggregator's post-backward result on that bucket's gradient, the mean lands in p.grad, replicas stay
identical, DDP's bucket rebuild after the first iteration is followed, a lost peer fails backward naming
the rank within the timeout, and close() leaves no thread behind; a state times on its own lanes (two
states in one process share none) and waits for a paused peer as long as the process group says."""
from __future__ import annotations

import pickle
from pathlib import Path
import threading
import time

import pytest
import torch
import torch.distributed as dist

from gvq.aggregators.base import RunContext
from gvq.aggregators.ddp import wrap_ddp
from gvq.comm import clock
from gvq.comm.p2p import peer_timeout_s
from gvq.aggregators.rar import RingAllReduce
from gvq.hooks import GvqHookState, gvq_hook
from gvq.hooks.config import build_aggregator
from gvq.schema.columns import BY_NAME
from tests.helpers.dist import once_per_key, run_cases, run_ranks

pytestmark = pytest.mark.slow


class Net(torch.nn.Module):
    """Parameters registered in another order than backward produces their gradients, so DDP's
    rebuilt buckets (in ready order) are not its reverse registration order."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(24, 10)         # registered first, used last
        self.conv = torch.nn.Conv2d(1, 6, 3)
        self.mid = torch.nn.Linear(6 * 6 * 6, 24)

    def forward(self, x):
        return self.head(torch.relu(self.mid(torch.relu(self.conv(x)).flatten(1))))


def _batch(rank: int, it: int):
    g = torch.Generator().manual_seed(100 * it + rank)
    return torch.randn(4, 1, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)


def _bound(option: str, params, rank, world, timeout_s=30.0):
    agg = build_aggregator(option)
    agg.bind(list(params), RunContext(rank, world, seed=3, timeout_s=timeout_s))
    return agg


def _recording(records):
    """gvq_hook, keeping each bucket's local gradient, its parameters and its future."""
    def hook(state, bucket):                        # (DDP refuses string annotations)
        records.append((bucket.buffer().clone(), state.positions(bucket.parameters())))
        return gvq_hook(state, bucket)
    return hook


def _hook_vs_post_backward(rank, world, option, iterations):
    torch.manual_seed(0)
    net = Net()
    twin_net = Net()                                # the post-backward reference: same seed, own state
    ddp = wrap_ddp(net, 0.002)                      # as the run and the benches wrap it
    state = GvqHookState(_bound(option, net.parameters(), rank, world))
    twin = _bound(option, twin_net.parameters(), rank, world)
    records, out = [], []
    ddp.register_comm_hook(state, _recording(records))
    for it in range(iterations):
        records.clear()
        x, y = _batch(rank, it)
        local = torch.autograd.grad(torch.nn.functional.cross_entropy(net(x), y), list(net.parameters()))
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        stats = state.iteration_stats()
        expected = []
        twin.begin_iteration(it)                    # the calls the communication thread makes
        for flat, pos in records:                   # the same buckets, in the same order, post-backward
            pieces = flat.split([twin.params[i].numel() for i in pos])
            ref = torch.cat([pieces[k] for k in sorted(range(len(pos)), key=pos.__getitem__)])
            twin.average_bucket_(ref, sorted(pos), it)    # (the hook sums a bucket in parameter order)
            expected.append(ref)
        end = twin.end_iteration(it)
        means = [g.clone() for g in local]
        for m in means:
            dist.all_reduce(m)
        out.append({"buckets": [(sorted(pos), ref) for (_, pos), ref in zip(records, expected)],
                    "grads": [p.grad.clone() for p in net.parameters()], "means": [m / world for m in means],
                    "stats": stats, "records": [pos for _, pos in records], "end": sorted(end)})
        for p in net.parameters():
            p.grad = None
    state.close()
    twin.close()
    return out


def _grads_by_bucket(grads, positions):
    return torch.cat([grads[i].reshape(-1) for i in positions])


ANY_BUCKET = ["fp16", "linear", "orq", "bingrad_b", "bingrad_pb", "signsgd", "terngrad"]
PER_PARAMETER = ["powersgd", "gradiveq"]            # state per parameter: the per-bucket contract


BUCKET_CASES = [("rar", 2), ("rar", 3), ("qsgd", 2), ("qsgd", 3)] + [(o, 2) for o in ANY_BUCKET + PER_PARAMETER]


@pytest.fixture(scope="module")
def hooked(tmp_path_factory):
    """``hooked(option, world)``: every rank's ``_hook_vs_post_backward`` records over 3 iterations; the
    options of one world size run one after another in one group of ranks (a group per option paid a
    rendezvous each), each with its own model, DDP wrapper and state."""
    def run(world):
        cases = tuple((o, 3) for o, w in BUCKET_CASES if w == world)
        return run_cases(_hook_vs_post_backward, world, tmp_path_factory.mktemp(f"hooked-{world}"), cases)
    group = once_per_key(run)
    return lambda option, world: group(world, world)[(option, 3)]


@pytest.mark.parametrize("option,world", BUCKET_CASES)
def test_each_bucket_equals_the_post_backward_result(hooked, option, world):
    for r in hooked(option, world):
        for i, it in enumerate(r):                   # DDP: one bucket, then its rebuilt small ones
            assert it["stats"]["buckets"] == len(it["buckets"]) >= (1 if i == 0 else 2)
            for pos, ref in it["buckets"]:           # same arithmetic on the same vector: tight
                torch.testing.assert_close(_grads_by_bucket(it["grads"], pos), ref, rtol=1e-6, atol=1e-7)
            if option == "rar":                      # and that is the mean of the local gradients
                for g, m in zip(it["grads"], it["means"]):
                    torch.testing.assert_close(g, m, rtol=1e-5, atol=1e-6)
            s = it["stats"]
            assert s["comm_s"] >= s["exposed_s"] >= 0 and s["bytes_sent"] > 0 and s["averaging_s"] > 0
            assert set(s) <= set(BY_NAME), set(s) - set(BY_NAME)      # declared columns only
            assert set(it["end"]) <= set(s)          # the iteration frame's columns and counters, as post-backward


def test_buckets_follow_ddps_rebuild_and_every_parameter_is_averaged_once(hooked):
    r = hooked("rar", 2)[0]
    layouts = [it["records"] for it in r]
    for layout in layouts:
        assert sorted(i for pos in layout for i in pos) == list(range(6))
    assert len(layouts[0]) == 1 and layouts[1] == layouts[2] and len(layouts[1]) >= 2   # rebuilt, then stable
    assert [i for pos in layouts[1] for i in pos] != list(range(6))[::-1]    # in ready order, not reversed


def _train(rank, world, option):
    torch.manual_seed(0)
    net = Net()
    ddp = wrap_ddp(net, 0.002)                      # as the run and the benches wrap it
    # an emulated link: a sender thread of the transport's, which close() must stop as well
    with GvqHookState.from_config(option, net.parameters(), seed=1, timeout_s=30.0, bandwidth_bps=1e9) as state:
        ddp.register_comm_hook(state, gvq_hook)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for it in range(4):
            x, y = _batch(rank, it)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        saved = state.state_dict()
        copy = pickle.loads(pickle.dumps(state))
    state.close()                                   # again: idempotent
    alive = [t.name for t in threading.enumerate() if t.name.startswith(("gvq-comm", "gvq-link"))]
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]), saved, copy.state_dict(), alive


@pytest.mark.parametrize("option", ["qsgd", "terngrad"])
def test_replicas_stay_identical_and_state_pickles(tmp_path, option):
    rs = run_ranks(_train, 2, tmp_path, option)
    assert torch.equal(rs[0][0].view(torch.int32), rs[1][0].view(torch.int32))
    for _, saved, unpickled, alive in rs:
        assert saved["iteration"] == unpickled["iteration"] == 4
        assert alive == []


def _lose_peer(rank, world):
    torch.manual_seed(0)
    net = Net()
    ddp = wrap_ddp(net, 0.002)                      # as the run and the benches wrap it
    state = GvqHookState(_bound("rar", net.parameters(), rank, world, timeout_s=3.0))
    ddp.register_comm_hook(state, gvq_hook)
    if rank == 1:                                   # leaves before backward: its ring never answers
        return None
    t0 = time.monotonic()
    try:
        torch.nn.functional.cross_entropy(ddp(_batch(0, 0)[0]), _batch(0, 0)[1]).backward()
        message = None
    except Exception as e:                          # what backward raised
        message = str(e)
    elapsed = time.monotonic() - t0
    state.close()
    alive = [t.name for t in threading.enumerate() if t.name.startswith("gvq-comm")]
    return message, elapsed, alive


def test_a_lost_peer_fails_backward_naming_the_rank_with_no_thread_left(tmp_path):
    message, elapsed, alive = run_ranks(_lose_peer, 2, tmp_path)[0]
    assert message is not None and "PeerLostError: rank 0: lost rank 1" in message
    assert elapsed < 3.0 + 20.0
    assert alive == []


class _Broken(RingAllReduce):
    """A codec that fails on its second bucket."""

    def average(self, bucket):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 2:
            raise ValueError("codec broke")
        return super().average(bucket)


def _failing_bucket(rank, world):
    torch.manual_seed(0)
    net = Net()
    ddp = wrap_ddp(net, 0.002)                      # as the run and the benches wrap it
    agg = _Broken(topology="ring")
    agg.bind(list(net.parameters()), RunContext(rank, world, timeout_s=10.0))
    state = GvqHookState(agg)
    ddp.register_comm_hook(state, gvq_hook)
    messages = []
    for it in range(3):                             # the first iteration is one bucket: fine
        try:
            torch.nn.functional.cross_entropy(ddp(_batch(rank, it)[0]), _batch(rank, it)[1]).backward()
        except Exception as e:                      # what backward raised
            messages.append(str(e))
    state.close()
    return messages


def test_a_failed_bucket_fails_backward_naming_the_rank_and_every_later_one(tmp_path):
    for rank, messages in enumerate(run_ranks(_failing_bucket, 2, tmp_path)):
        assert len(messages) == 2
        assert all(f"rank {rank}: gvq hook, bucket" in m and "codec broke" in m for m in messages)


def test_a_state_refuses_an_aggregator_set_up_to_average_after_backward():
    """``setup`` lays the gradients out in its own flat buffer, which DDP would copy into: ``bind`` only."""
    agg = RingAllReduce(topology="ring")
    agg.setup([torch.nn.Parameter(torch.zeros(3))], RunContext(0, 1))
    try:
        with pytest.raises(ValueError, match=r"must be bound .*agg\.bind\(params, ctx\)"):
            GvqHookState(agg)
    finally:
        agg.close()


def test_a_state_is_built_without_a_process_group_and_takes_back_only_its_own_rank():
    assert not dist.is_initialized()
    torch.manual_seed(0)
    net = Net()
    states = [GvqHookState.from_config("qsgd", net.parameters(), rank=r, world_size=2) for r in (0, 1)]
    saved = [s.state_dict() for s in states]
    assert [(d["rank"], d["world_size"]) for d in saved] == [(0, 2), (1, 2)]
    states[0].load_state_dict(saved[0])                  # its own: taken
    with pytest.raises(ValueError, match=r"the state of rank 1 of 2, not this rank's \(0 of 2\)") as e:
        states[0].load_state_dict(saved[1])
    assert "\n" not in str(e.value)
    for s in states:
        s.close()



def _train_in(rank, world, dtype):
    torch.manual_seed(0)
    net = Net().to(dtype)
    ddp = wrap_ddp(net, 0.002)                      # as the run and the benches wrap it
    # start_iter 1: the compressed path (P and Q, the error memory) from the second step on
    with GvqHookState.from_config("powersgd", net.parameters(), {"start_iter": 1}, seed=1,
                                  timeout_s=30.0) as state:
        ddp.register_comm_hook(state, gvq_hook)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for it in range(3):
            x, y = _batch(rank, it)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x.to(dtype)), y).backward()
            opt.step()
        stats = state.iteration_stats()
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    return flat, {p.grad.dtype for p in net.parameters()}, stats


def test_powersgd_keeps_a_float64_models_precision_through_the_hook(tmp_path):
    (w64, dtypes, s64), _ = run_ranks(_train_in, 2, tmp_path / "64", torch.float64)
    (w32, _, s32), _ = run_ranks(_train_in, 2, tmp_path / "32", torch.float32)
    assert w64.dtype == torch.float64 and dtypes == {torch.float64} and torch.isfinite(w64).all()
    assert s64["compression_error"] > 0 and s32["compression_error"] > 0       # both compressed
    assert s64["bytes_sent"] == 2 * s32["bytes_sent"]                          # P and Q travel in float64
    assert torch.allclose(w64.float(), w32, atol=1e-4)                          # the same training, finer


# -- lifecycle: a state times on its own lanes; peers are waited for as long as the process group says --

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
        ddp = wrap_ddp(net)
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


def _paused(rank, world, timeout_s, gave_up):
    """Rank 0 pauses before its third step (after DDP's bucket rebuild, forward waits for no peer: the
    other rank waits in the hook's ring): 3 s under the process group's timeout, or, told ``timeout_s``,
    until the waiting rank has given up (the file ``gave_up``), so no machine speed decides who wins;
    returns what the rank's steps raised and its timeouts."""
    net = _net()
    ddp = wrap_ddp(net)
    kw = {} if timeout_s is None else {"timeout_s": timeout_s}
    state = GvqHookState.from_config("qsgd", net.parameters(), **kw)
    ddp.register_comm_hook(state, gvq_hook)
    errors = []
    for it in range(4):
        if rank == 0 and it == 2:               # an evaluation, a checkpoint
            _pause(gave_up if timeout_s is not None else None)
        try:
            _step(ddp, rank, it)
            state.iteration_stats()
        except Exception as e:                  # what backward raised
            errors.append(str(e))
            Path(gave_up).touch()
            break
    timeouts = (state.timeout_s, state.aggregator.p2p.timeout.total_seconds())
    state.close()
    return errors, timeouts


def _pause(until: str | None) -> None:
    """3 s, or until the file ``until`` exists (at most 120 s: a hung peer fails the test, not the suite)."""
    if until is None:
        time.sleep(3.0)
        return
    deadline = time.monotonic() + 120
    while not Path(until).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_paused_rank_is_waited_for_as_long_as_the_process_group_says(tmp_path):
    # tests.helpers.dist starts its process group with a 60 s timeout: the hook follows it
    for errors, timeouts in run_ranks(_paused, 2, tmp_path / "default", None, str(tmp_path / "unused")):
        assert errors == [] and timeouts == (60.0, 60.0)
    # told 1 s, the rank waiting for the paused one gives up, naming whom it lost
    errors, timeouts = run_ranks(_paused, 2, tmp_path / "short", 1.0, str(tmp_path / "gave_up"))[1]
    assert timeouts == (1.0, 1.0)
    assert len(errors) == 1 and "rank 1: lost rank 0" in errors[0]


def test_stats_before_any_iteration_answer_at_once_and_a_stalled_one_is_a_rank_error():
    """Before any backward: a one-line answer at once, not a wait for the peer timeout.  An iteration
    whose last bucket never comes: a RankError naming the rank once the timeout passes."""
    from gvq.comm.errors import RankError
    from gvq.hooks.thread import BucketJob
    net = _net()
    # a wait would end in a RankError after the timeout; the answer is a ValueError, without waiting
    with GvqHookState.from_config("rar", net.parameters(), rank=0, world_size=1, timeout_s=5.0) as state:
        with pytest.raises(ValueError, match=r"^gvq hook: no iteration has run yet"):
            state.iteration_stats()
    params = list(net.parameters())
    with GvqHookState.from_config("rar", params, rank=0, world_size=1, timeout_s=0.01) as state:
        fut = torch.futures.Future()
        flat = torch.zeros(sum(p.numel() for p in params))
        state.submit(BucketJob(fut, flat, list(range(len(params))), 0, False, 0.0))   # not the last bucket
        fut.wait()
        with pytest.raises(RankError, match=r"^rank 0: gvq hook: no iteration finished within 0.01s$") as e:
            state.iteration_stats()
    assert e.value.rank == 0
