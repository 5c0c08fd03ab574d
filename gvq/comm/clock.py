"""This rank's clock: the one place gvq reads time (``net.clock=wall|virtual``).

``wall`` (the default): ``time.perf_counter()``.  With more ranks than cores it measures the host's
contention as much as the algorithm.

``virtual`` is an online simulation in the manner of SimGrid's SMPI: the real code runs, but each rank's
clock advances only

* by the CPU time of its own thread while it computes (``time.thread_time()``; one intra-op thread per
  rank), multiplied by the scale of the current phase: ``net.compute_scale`` for forward / backward /
  optimizer (1/6: a GPU 6x faster, as in the GradiVeQ paper), ``net.codec_scale`` for compress /
  decompress / PCA, 1 for everything else;
* and by the link model when it waits for a message (:mod:`gvq.comm.p2p` moves it to the message's
  arrival time, computed from the sender's clock).

Time a rank spends blocked in a real wait is never counted, and nothing sleeps, so a 2-core host can
simulate 16 ranks on a 10 Gbit/s network.

``exclusive`` (``net.exclusive``, on by default): a timed phase (compute, codec, and the ring engine's
own CPU, phase ``ring`` at scale 1) runs only while its rank holds this host's clock lock (one per
user, shared by every gvq run), so no two timed phases ever run at once, as SimGrid's SMPI runs one
rank at a time.  Without it, ranks' phases that run at once on shared cores slow each other
(shared caches and memory, time slicing): the host's contention leaks into virtual time, and more
so the more ranks there are.  Wall time grows with it (phases run one at a time), virtual time does
not; docs/results.md has the measurement.  Waits release the lock (it never deadlocks a
ring); a lock not had within ``LOCK_PATIENCE_S`` is given up on with a warning, and the phase is timed
as it runs.  Each rank is a process: the clock is a process global, set
once per run by :func:`configure`.

Two lanes (``aggregator.overlap=true``: gvq's ring inside backward, on a communication thread): what they
model and why is docs/virtual-time.md ("Two lanes"), the one place that says it.  In code: a rank's
:class:`Lanes` hold its compute lane (the training thread's) and its communication lane, which a thread
binds with ``with lanes.comm_lane():`` so that every reading it makes (:func:`get`, :func:`now`,
:func:`phase`, :class:`Stopwatch`, :class:`gvq.comm.p2p.P2P`) is that lane's; ``advance_to`` starts a
bucket no earlier than backward produced it; with ``net.comm_core=shared`` the communication lane's
scaled phase time is :meth:`RankClock.owe`-d to the compute lane (its ``charge``); the communication lane
never takes the host's clock lock, and :meth:`RankClock.yield_core` gives the compute lane's up where it
only waits for peers.  A public hook state owns a pair of its own (the runner hands it the process's).
"""
from __future__ import annotations

import fcntl
import logging
import os
import tempfile
import threading
import time
from contextlib import contextmanager

log = logging.getLogger(__name__)
LOCK_PATIENCE_S = 60.0

CLOCKS = ("wall", "virtual")
COMM_CORES = ("shared", "own")           # the communication lane's CPU: on the rank's one core, or its own
PHASES = ("compute", "codec", "ring")   # timed one at a time (exclusive); "ring" advances at scale 1


class RankClock:
    """Wall clock, or the virtual clock described in the module docstring."""

    def __init__(self, mode: str = "wall", compute_scale: float = 1.0, codec_scale: float = 1.0,
                 exclusive: bool = False, device_sync=None):
        if mode not in CLOCKS:
            raise ValueError(f"net.clock={mode!r}: must be one of {', '.join(CLOCKS)}")
        for key, v in (("net.compute_scale", compute_scale), ("net.codec_scale", codec_scale)):
            if not v > 0:
                raise ValueError(f"{key}={v!r}: must be > 0")
        self.mode = mode
        self.scales = {"compute": float(compute_scale), "codec": float(codec_scale), "ring": 1.0}
        self._t = 0.0                           # virtual seconds banked so far
        # per thread, the CPU reading the bank is up to date with (two hooks' threads may read one lane: each
        # counts its own CPU since its own last reading, never one thread's clock minus another's)
        self._cpu: dict[int, float] = {threading.get_ident(): time.thread_time()}
        self._scale = 1.0                       # scale of the phase running now
        self._depth, self._held = 0, False      # phase nesting; holding the core lock
        self._lock = _open_lock() if self.virtual and exclusive else None
        self._sync = device_sync                # wall clock on a GPU: kernels are asynchronous, so every
        # reading first waits for them (torch.cuda.synchronize): each timed span holds its own GPU work
        self.charge: RankClock | None = None    # a lane that also owes this one's scaled phase time
        self._debt, self._debt_lock = 0.0, threading.Lock()   # owed by another lane, folded in at now()
        self.gave_up_lock = False               # the lock was not had within LOCK_PATIENCE_S: phases since
        # then were timed with co-runners (summary.json reports it; the run's virtual times are suspect)

    @property
    def virtual(self) -> bool:
        return self.mode == "virtual"

    def now(self) -> float:
        """Seconds on this rank's clock (an arbitrary origin: only differences mean anything)."""
        if not self.virtual:
            if self._sync is not None:
                self._sync()
            return time.perf_counter()
        tid, cpu = threading.get_ident(), time.thread_time()
        step = (cpu - self._cpu.get(tid, cpu)) * self._scale
        self._t += step
        self._cpu[tid] = cpu
        if self.charge is not None and self._depth > 0 and step > 0:
            self.charge.owe(step)
        if self._debt:
            with self._debt_lock:
                self._t, self._debt = self._t + self._debt, 0.0
        return self._t

    def owe(self, seconds: float) -> None:
        """Another lane's work on this lane's core: this lane's clock moves on by ``seconds`` at its
        next reading (thread-safe: the other lane's thread calls it)."""
        with self._debt_lock:
            self._debt += seconds

    def bind_thread(self) -> None:
        """From now on this clock also counts the calling thread's CPU time (from this moment)."""
        self._mark()

    def _mark(self) -> None:
        """The calling thread's CPU up to now is not this clock's (a wait, a lock, a new binding)."""
        self._cpu[threading.get_ident()] = time.thread_time()

    @contextmanager
    def phase(self, name: str):
        """CPU time inside runs at ``name``'s scale (nested phases: the innermost wins)."""
        if not self.virtual:
            yield
            return
        self.now()
        if self._depth == 0:
            self._acquire()
        self._depth += 1
        outer, self._scale = self._scale, self.scales[name]
        try:
            yield
        finally:
            self.now()
            self._scale = outer
            self._depth -= 1
            if self._depth == 0:
                self._release()

    @contextmanager
    def blocked(self):
        """A real wait (a message, a peer): the CPU it burns is not this rank's computation."""
        if not self.virtual:
            yield
            return
        self.now()
        held = self._held
        self._release()                         # never wait for a peer while holding a core
        try:
            yield
        finally:
            if held:
                self._acquire()
            self._mark()

    def yield_core(self) -> None:
        """The running phase waits for peers from here (a collective inside it: DDP's bucket rebuild,
        backward's tail waiting for its last bucket): give the host's clock lock up until
        :meth:`resume_core` or the phase's end, so those peers can run their own phases."""
        self.now()
        self._release()

    def resume_core(self) -> None:
        """The wait :meth:`yield_core` began is over: take the lock back for the rest of the phase; the
        CPU the wait burnt is not this rank's computation (as in :meth:`blocked`)."""
        if self._depth > 0:
            self._acquire()

    def _acquire(self) -> None:
        """Take this rank's core lock (if exclusive); the CPU spent getting it is not counted."""
        if self._lock is None or self._held:
            return
        deadline, pause = time.monotonic() + LOCK_PATIENCE_S, 1e-4
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._held = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    log.warning("net.exclusive: no clock lock within %gs; timing phases with co-runners "
                                "from now on", LOCK_PATIENCE_S)
                    os.close(self._lock)
                    self._lock, self.gave_up_lock = None, True
                    break
                time.sleep(pause)
                pause = min(2 * pause, 2e-3)
        self._mark()

    def _release(self) -> None:
        if self._held:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._held = False

    def advance_to(self, t: float) -> None:
        """Virtual mode: nothing happens on this rank before ``t`` (a message's arrival)."""
        if self.virtual:
            self._t = max(self.now(), t)


def _open_lock() -> int:
    """This host's clock lock file (per user: every gvq run of this user shares it)."""
    path = os.path.join(tempfile.gettempdir(), f"gvq-clock-{os.getuid()}.lock")
    return os.open(path, os.O_CREAT | os.O_RDWR, 0o600)


class Lanes:
    """A rank's compute lane and communication lane.  The process has one pair (:func:`configure`); a
    public hook state owns its own (the runner hands it the process's): two states never share a lane."""

    def __init__(self, compute: RankClock | None = None, comm: RankClock | None = None):
        self.compute, self.comm = compute or RankClock(), comm or RankClock()

    @contextmanager
    def comm_lane(self):
        """Bind the calling thread to the communication lane for the block (module docstring)."""
        self.comm.bind_thread()
        _LANE.clock = self.comm
        try:
            yield self.comm
        finally:
            _LANE.clock = None


_LANES = Lanes()                         # this process's (= this rank's) lanes, set by configure()


class _Binding(threading.local):
    clock: RankClock | None = None       # the lane the calling thread reads, once it bound one


_LANE = _Binding()


def configure(mode: str = "wall", compute_scale: float = 1.0, codec_scale: float = 1.0,
              exclusive: bool = False, device: str = "cpu", comm_core: str = "shared") -> RankClock:
    """Set this process's (= this rank's) clock for a run; returns its compute lane.  ``exclusive``
    (virtual only): time the compute lane's scaled phases only while holding the host's clock lock, one
    at a time.  ``device="cuda"``: the wall clock waits for the GPU's queued kernels before every
    reading (the virtual clock, CPU time, cannot time GPU work: the config refuses that pair).
    ``comm_core``: see the module docstring (two lanes)."""
    global _LANES
    if comm_core not in COMM_CORES:
        raise ValueError(f"net.comm_core={comm_core!r}: must be one of {', '.join(COMM_CORES)}")
    if _LANES.compute._lock is not None:
        os.close(_LANES.compute._lock)
    sync = None
    if device == "cuda":
        import torch
        sync = torch.cuda.synchronize
    _LANES = Lanes(RankClock(mode, compute_scale, codec_scale, exclusive, sync),
                   RankClock(mode, compute_scale, codec_scale, False, sync))
    _LANES.comm.charge = _LANES.compute if comm_core == "shared" else None
    return _LANES.compute


def lanes() -> Lanes:
    """This process's lanes (the runner's; a hook state outside the runner owns its own)."""
    return _LANES


def get() -> RankClock:
    """The calling thread's lane: the communication lane it bound, else the process's compute lane."""
    return _LANES.compute if _LANE.clock is None else _LANE.clock


def now() -> float:
    return get().now()


def phase(name: str):
    return get().phase(name)


class Stopwatch:
    """The ring's per-label stopwatch: seconds on this rank's clock accumulated per label
    (``with stopwatch("compress"):``).  Every label the ring uses is codec work, so each span runs in the
    ``codec`` phase (under ``net.clock=virtual`` it advances at ``net.codec_scale``)."""

    def __init__(self):
        self.totals: dict[str, float] = {}

    @contextmanager
    def __call__(self, label: str):
        t0 = now()
        try:
            with phase("codec"):
                yield
        finally:
            self.totals[label] = self.totals.get(label, 0.0) + now() - t0

    def get(self, label: str) -> float:
        """Seconds accumulated under ``label`` (0 for a label never timed)."""
        return self.totals.get(label, 0.0)


def sync(group=None) -> float:
    """Virtual mode: every rank's clock to the latest of them (a collective outside :class:`P2P`, e.g.
    the per-iteration statistics, is a synchronisation point); returns the clock.  Wall: a no-op."""
    lane = _LANES.compute
    if lane.virtual:
        import torch
        import torch.distributed as dist
        t = torch.tensor([lane.now()], dtype=torch.float64)
        with lane.blocked():
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        lane.advance_to(float(t))
    return lane.now()
