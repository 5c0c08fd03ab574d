"""Virtual time (gvq/comm/clock.py and the link model in gvq/comm/p2p.py): the clock counts this thread's
CPU time at the phase's scale, never a wait; messages arrive when the link model says, exactly.  Two lanes,
with scripted CPU times (a fake per-thread ``time.thread_time``): a bucket starts at max(backward produced
it, the lane is free); comm_core=shared charges the communication lane's scaled work to the compute lane,
own does not; waits and links are never charged; only a thread bound with comm_lane() reads that lane."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import defaultdict

import pytest
import torch

from gvq.comm import clock as C
from gvq.comm.p2p import P2P, VirtualLink
from gvq.compressors.base import split_on_cuts
from tests.helpers.clock_lock import clock_lock_free
from tests.helpers.dist import run_ranks
from tests.helpers.toy_compressors import Projection

CPU_SLACK = 0.05     # seconds of the test's own Python between clock reads (measured: < 5 ms)


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1


def test_virtual_clock_counts_cpu_time_at_the_phase_scale():
    clk = C.RankClock("virtual", compute_scale=0.25, codec_scale=4.0)
    t0, c0 = clk.now(), time.thread_time()
    with clk.phase("compute"):
        _spin(0.2)
    mid, c1 = clk.now(), time.thread_time()
    assert mid - t0 == pytest.approx(0.25 * (c1 - c0), abs=0.01)
    with clk.phase("codec"):
        _spin(0.05)
    assert clk.now() - mid == pytest.approx(4 * 0.05, abs=0.02)


def test_waits_are_not_computation_and_arrivals_only_move_the_clock_forward():
    clk = C.RankClock("virtual")
    t0 = clk.now()
    with clk.blocked():
        _spin(0.1)                          # CPU burnt while blocked (e.g. a spinning wait): not counted
        time.sleep(0.05)
    assert clk.now() - t0 < 0.01
    clk.advance_to(t0 + 3.0)
    assert clk.now() == pytest.approx(t0 + 3.0, abs=0.01)
    clk.advance_to(t0 + 1.0)                # an arrival in the past changes nothing
    assert clk.now() >= t0 + 3.0


def test_wall_clock_is_perf_counter_and_rejects_bad_settings():
    clk = C.RankClock("wall")
    before = time.perf_counter()
    assert before <= clk.now() <= time.perf_counter()     # (an ordering, not a bound a busy host breaks)
    with pytest.raises(ValueError, match="net.clock"):
        C.RankClock("cpu")
    with pytest.raises(ValueError, match="net.compute_scale"):
        C.RankClock("virtual", compute_scale=0)


def test_virtual_link_is_a_fifo_with_serialisation_then_latency():
    link = VirtualLink(8e3, latency_s=0.5)          # 1 kB/s
    assert link.arrival(1000, 0.0) == 1.5            # serialised 0..1, then 0.5 latency
    assert link.arrival(500, 0.2) == 2.0             # queued behind the first: leaves 1..1.5
    assert link.arrival(1000, 10.0) == 11.5          # idle link: starts at once


# -- scripted exchanges on 2-4 ranks, 1 kB/s links: every time is whole seconds ---------------------
B, SIZE = 8e3, 250                                  # 250 float32 = 1000 bytes = 1 s on the link


def _relay(rank, world, latency, count):
    """Rank 0 sends ``count`` messages back to back; every other rank forwards each one on arrival.
    Returns (arrival clock of each message, the clock after the last send completed), relative to a
    common start."""
    C.configure("virtual")
    p2p = P2P(rank, world, 30.0, B, latency)
    t0 = C.sync()
    got, sends = [], []
    for _ in range(count):
        buf = torch.full((SIZE,), float(rank))
        if rank > 0:
            p2p.wait(p2p.irecv(buf, rank - 1))
            got.append(C.now() - t0)
        if rank < world - 1:
            sends.append(p2p.isend(buf, rank + 1))
    for h in sends:
        p2p.wait(h)
    return got, C.now() - t0


@pytest.mark.slow
@pytest.mark.parametrize("world,latency,count", [(2, 0.0, 1), (3, 0.25, 1), (4, 0.0, 3), (3, 0.5, 3)])
def test_scripted_relay_arrives_exactly_when_the_link_model_says(tmp_path, world, latency, count):
    per_rank = run_ranks(_relay, world, tmp_path, latency, count)
    for rank, (got, end) in enumerate(per_rank):
        # message i leaves rank 0 after i earlier ones (FIFO) and each hop adds 1 s + latency:
        # pipelined, hop k receives message i at (k + i) * 1 s + k * latency
        want = [(rank + i) + rank * latency for i in range(count)] if rank else []
        assert got == pytest.approx(want, abs=CPU_SLACK), (rank, got, want)
        if rank < world - 1:       # a send completes when the link has carried it (as the wall emulator)
            assert end == pytest.approx((rank + count) + (rank + 1) * latency, abs=CPU_SLACK)


def _additive(rank, world, numel, pieces):
    from gvq.comm import ring
    C.configure("virtual")
    comp = Projection(unit=8, d=3)
    flat = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    p2p, timer = P2P(rank, world, 60.0, 1e8), C.Stopwatch()
    segs = split_on_cuts(comp.cuts(numel), world)
    if pieces > 1:                                  # each segment as several messages (cut-through)
        segs = [[slice(s.start + (s.stop - s.start) * k // pieces // 8 * 8,
                       s.start + (s.stop - s.start) * (k + 1) // pieces // 8 * 8 if k + 1 < pieces else s.stop)
                 for k in range(pieces)] for s in segs]
    C.sync()
    ring.additive_allreduce_(flat, segs, comp, p2p, timer)
    return flat, p2p.bytes_sent, p2p.wire_s


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_algorithm_1_in_virtual_time_sums_right_without_deadlock(tmp_path, world):
    """Probes answer in virtual time (a receive is done only once it has arrived by this rank's clock);
    no probe order may deadlock the pipelined ring, whatever N."""
    numel, comp = 8 * 4 * world, Projection(unit=8, d=3)
    per_rank = run_ranks(_additive, world, tmp_path, numel, 3, timeout=240)
    whole = slice(0, numel)
    total = sum(torch.randn(numel, generator=torch.Generator().manual_seed(r)) for r in range(world))
    expect = comp.decompress(comp.compress(total, whole), whole)
    for flat, sent, wire in per_rank:
        assert torch.allclose(flat, expect, atol=1e-4)
        assert sent > 0 and wire >= 0
    assert all(torch.equal(per_rank[0][0], f) for f, _, _ in per_rank)


_BUSY = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"


def _virtual_compute_s() -> float:
    clk = C.RankClock("virtual")
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    t0 = clk.now()
    with clk.phase("compute"):
        for _ in range(200):
            a = (a @ b).tanh_()
    return clk.now() - t0


@pytest.mark.slow
def test_a_busy_sibling_does_not_change_virtual_compute_time():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        quiet = min(_virtual_compute_s() for _ in range(2))
        hogs = [subprocess.Popen([sys.executable, "-c", _BUSY]) for _ in range(2)]   # both cores busy
        try:
            busy = min(_virtual_compute_s() for _ in range(2))
        finally:
            for h in hogs:
                h.kill()
                h.wait()
    finally:
        torch.set_num_threads(threads)
    assert 0.5 < busy / quiet < 2.0, (quiet, busy)      # wall time would roughly double or worse


def test_exclusive_phases_hold_the_core_lock_and_waits_release_it(private_clock_lock):
    clk = C.RankClock("virtual", exclusive=True)
    assert clock_lock_free()
    with clk.phase("compute"):
        assert not clock_lock_free()
        with clk.phase("codec"):                       # nested: still held, released only at the end
            assert not clock_lock_free()
        assert not clock_lock_free()
        with clk.blocked():                            # a wait inside a phase gives the core away
            assert clock_lock_free()
        assert not clock_lock_free()
        clk.yield_core()                               # waiting for peers inside a phase (DDP's forward)
        assert clock_lock_free()
        clk.resume_core()
        assert not clock_lock_free()
        clk.yield_core()                               # backward's tail: given up until the phase's end
        assert clock_lock_free()
    assert clock_lock_free() and not clk.gave_up_lock
    clk.resume_core()                                  # outside any phase there is nothing to take back
    assert clock_lock_free()
    wall = C.RankClock("wall", exclusive=True)       # wall clocks never lock
    with wall.phase("compute"):
        assert clock_lock_free()


def test_a_lock_held_elsewhere_delays_the_phase_but_not_its_clock(monkeypatch, caplog, private_clock_lock):
    import fcntl
    import os
    other = C._open_lock()
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        monkeypatch.setattr(C, "LOCK_PATIENCE_S", 0.3)
        clk = C.RankClock("virtual", exclusive=True)
        t0, w0 = clk.now(), time.perf_counter()
        with clk.phase("compute"):                     # gives up after 0.3 s, times the phase anyway
            _spin(0.02)
        assert time.perf_counter() - w0 >= 0.3
        assert clk.now() - t0 < 0.02 + CPU_SLACK        # the polling is not counted as computation
        assert "no clock lock within" in caplog.text and clk.gave_up_lock
    finally:
        os.close(other)


def test_wall_clock_on_a_gpu_waits_for_queued_kernels_at_every_reading():
    """device=cuda: every reading of the wall clock first synchronises the device (stood in for here), so a
    timed span holds its own GPU work, not just its launches; the virtual clock never does."""
    from gvq.comm.clock import RankClock
    calls = []
    wall = RankClock("wall", device_sync=lambda: calls.append(1))
    a = wall.now()
    assert wall.now() >= a and len(calls) == 2
    assert C.configure("wall")._sync is None                           # the host: no synchronisation
    virtual = RankClock("virtual", device_sync=lambda: calls.append(1))
    virtual.now()
    assert len(calls) == 2


# -- two lanes -----------------------------------------------------------------------------------


@pytest.fixture
def cpu(monkeypatch):
    """``cpu.burn(s)``: the calling thread's CPU time moves on by ``s`` seconds, exactly."""
    spent = defaultdict(float)

    class Script:
        @staticmethod
        def burn(seconds: float) -> None:
            spent[threading.get_ident()] += seconds

    monkeypatch.setattr(time, "thread_time", lambda: spent[threading.get_ident()])
    yield Script
    C.configure()                          # back to the default wall clock for later tests


def on_comm_thread(fn):
    """Run ``fn(lane)`` on a new thread bound to the communication lane; its result."""
    out = {}

    def body():
        with C.lanes().comm_lane() as lane:
            out["r"] = fn(lane)
    t = threading.Thread(target=body)
    t.start()
    t.join()
    return out["r"]


def _bucket(cpu, t_ready: float, codec_s: float):
    """What the hook's thread does with one bucket: wait for backward, then code it."""
    def fn(lane):
        lane.advance_to(t_ready)
        start = C.now()
        with C.phase("codec"):
            cpu.burn(codec_s)
        return start, C.now()
    return fn


def test_a_bucket_starts_when_backward_made_it_or_when_the_lane_frees(cpu):
    C.configure("virtual", codec_scale=0.5, comm_core="own")
    # a codec that must wait for backward: the lane is idle at 0, the bucket exists at 3
    assert on_comm_thread(_bucket(cpu, 3.0, 4.0)) == (3.0, 5.0)       # 4 s of CPU at codec x0.5
    # ready at 4, before the lane frees at 5: it starts at 5
    assert on_comm_thread(_bucket(cpu, 4.0, 2.0)) == (5.0, 6.0)
    # ready at 9, after the lane freed at 6: it starts at 9
    assert on_comm_thread(_bucket(cpu, 9.0, 2.0)) == (9.0, 10.0)


@pytest.mark.parametrize("core,charged", [("shared", 1.5), ("own", 0.0)])
def test_shared_charges_the_communication_lanes_work_to_compute_and_own_does_not(cpu, core, charged):
    C.configure("virtual", compute_scale=1.0, codec_scale=0.5, comm_core=core)
    with C.phase("compute"):
        cpu.burn(2.0)                                              # backward so far
        on_comm_thread(_bucket(cpu, 0.0, 3.0))                     # 1.5 s of scaled codec work
        cpu.burn(1.0)
    assert C.now() == pytest.approx(3.0 + charged)


def test_waits_and_link_time_are_never_charged_to_compute(cpu):
    C.configure("virtual", comm_core="shared")

    def wait_for_a_message(lane):
        with lane.blocked():
            cpu.burn(5.0)                      # a real wait burns some CPU: not computation
        lane.advance_to(7.0)                   # the message's arrival by the link model
        return C.now()
    assert on_comm_thread(wait_for_a_message) == 7.0
    assert C.now() == 0.0


def test_the_binding_is_per_thread_and_ends_with_the_block(cpu):
    compute = C.configure("virtual")
    seen = on_comm_thread(lambda lane: (C.get() is lane, lane is not compute))
    assert seen == (True, True) and C.get() is compute
    with pytest.raises(ValueError, match="net.comm_core"):
        C.configure("virtual", comm_core="spare")


def test_two_threads_on_one_lane_each_count_only_their_own_cpu(cpu):
    """Two hooks in one process (gvq.bench overlap's two bucket sizes) each have a thread on the rank's
    communication lane, with different CPU totals: a reading counts the reading thread's CPU since its own
    last reading, not its total minus the other thread's."""
    C.configure("virtual", codec_scale=1.0, comm_core="own")
    ready, go, done = threading.Event(), [threading.Event(), threading.Event()], [threading.Event(), threading.Event()]
    ends = {}

    def thread(name: str, before: float, work: float, turn: int):
        cpu.burn(before)                          # this thread's CPU before it joins the lane
        with C.lanes().comm_lane() as lane:
            for k in range(2):
                go[turn].wait(5)
                go[turn].clear()
                lane.advance_to(0.0)
                with C.phase("codec"):
                    cpu.burn(work)
                ends[(name, k)] = C.now()
                done[turn].set()
        ready.set()

    a = threading.Thread(target=thread, args=("a", 100.0, 1.0, 0))
    b = threading.Thread(target=thread, args=("b", 7.0, 2.0, 1))
    a.start(), b.start()
    for _ in range(2):                            # a, then b, then a, then b: one lane, one timeline
        for turn in (0, 1):
            go[turn].set()
            done[turn].wait(5)
            done[turn].clear()
    a.join(5), b.join(5)
    assert ends == {("a", 0): 1.0, ("b", 0): 3.0, ("a", 1): 4.0, ("b", 1): 6.0}
