"""A run's processes live and die together: the launcher stops its ranks on Ctrl-C, SIGTERM or SIGHUP
(a bounded grace, then SIGKILL), and a rank never outlives its launcher, even one killed by SIGKILL.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import torch.multiprocessing as mp

from gvq.run.errors import RunEnded
from gvq.comm.internals import rank_error_trace

GRACE_S = 10.0       # seconds a stopped rank gets to close its CSV and summary before SIGKILL
FAIL_GRACE_S = 2.0   # after one rank failed: the others' time to exit, then to obey SIGTERM (torch's
                     # default grace period kept a frozen rank's job alive half a minute past timeout_s)


def _state(pid: int) -> str | None:
    """The process's state letter from Linux /proc (R, S, T, Z ...); None if gone or not Linux."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return None


def _stopped(pid: int) -> bool:
    """Is the process stopped (state T: SIGSTOP, a debugger)?"""
    return _state(pid) in ("T", "t")


def _alive(pid: int) -> bool:
    """Does the process exist and not as a zombie (a killed launcher its shell has not reaped yet)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return _state(pid) not in ("Z", "X")


def die_with_parent(launcher: int | None = None, grace_s: float = GRACE_S) -> None:
    """A rank never outlives its launcher, even one killed by SIGKILL: Linux signals it (SIGTERM,
    ``PR_SET_PDEATHSIG``) the moment its parent dies, and a watchdog thread that sees the parent gone
    (reparented: a new ppid) or the launcher gone sends SIGTERM too and, ``grace_s`` later, ends the
    process outright -- a rank blocked inside a collective does not run Python signal handlers until
    the call returns.  ``launcher``: the launcher's pid, so a launcher that died before this call is
    noticed too (a rank forked by the fork server has the server as parent, which exits with the
    launcher)."""
    parent = os.getppid()
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))    # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):                                       # not Linux: the watchdog
        pass

    def watch():
        while os.getppid() == parent and (launcher is None or _alive(launcher)):
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(128 + signal.SIGTERM)
    threading.Thread(target=watch, name="gvq-parent-watchdog", daemon=True).start()


class Interrupted(KeyboardInterrupt, RunEnded):
    """The launcher got SIGINT, SIGTERM or SIGHUP (Ctrl-C, ``kill``, SLURM, Kubernetes, a closed
    terminal): every rank stopped within a grace, the run recorded as interrupted; exit 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def code(self) -> int:
        return 128 + self.signum

    def __reduce__(self):              # rebuilt from the signal (a joblib worker's is sent back pickled)
        return type(self), (self.signum,)


class RanksFailed(Exception):
    """A rank failed: torch's ``ProcessRaisedException`` or ``ProcessExitedException`` as ``cause`` (this
    message is its message), and ``stopped``: the ranks that were frozen (SIGSTOP, a debugger) when it
    happened -- the others timed out waiting on them."""

    def __init__(self, cause: Exception, stopped: list[int]):
        super().__init__(str(cause))
        self.cause, self.stopped = cause, list(stopped)


#: what the launcher handles itself while ranks run, whatever disposition it inherited: a script's
#: ``cli.py ... &`` in a non-interactive shell starts with SIGINT ignored, and ``kill -INT`` must still
#: stop it (torchrun's agent does the same)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_interrupt():
    """While ranks run, SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` in the launcher."""
    def on_signal(signum, frame):
        raise Interrupted(signum)
    old = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    for s in old:
        signal.signal(s, on_signal)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def on_sigterm(signum, frame):
    """Unwind once through ``finally`` (CSV closed, summary written).  Further SIGTERM/SIGHUP are ignored
    from here: a rank whose launcher died gets two (PDEATHSIG and its watchdog), and the second one
    interrupted the first's summary write; the watchdog's ``os._exit`` after the grace still ends it."""
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    raise Interrupted(signum)


@contextlib.contextmanager
def signals_deferred():
    """SIGTERM and SIGHUP held while a rank records how its run ended, then acted on: a peer's death and
    the launcher's SIGTERM arrive together (torchrun stops the other workers as soon as one exits), and a
    signal raised inside the summary's write left no summary.  One that arrived meanwhile is handed to the
    handler that was in place, after the block.  Python runs handlers only in the main thread, so
    elsewhere (a rank run in a test's thread) nothing is deferred."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if held and callable(old[held[0]]):
            old[held[0]](held[0], None)


def _root_cause(ctx, e: Exception) -> Exception:
    """When several ranks failed, the one to report is the cause: torch reports the first to exit, and a
    rank that lost its peer (``PeerLostError``) may exit before the peer that raised does (forked ranks
    exit in milliseconds).  Returns the lowest rank whose traceback is not a lost peer's, else ``e``."""
    if "PeerLostError" not in str(e):
        return e
    for i in range(len(ctx.processes)):
        trace = rank_error_trace(ctx, i)     # None: this rank raised nothing (exited, or killed)
        if trace is not None and "PeerLostError" not in trace:
            return mp.ProcessRaisedException(f"\n\n-- Process {i:d} terminated with the following error:\n"
                                             f"{trace}", i, ctx.processes[i].pid)
    return e


def spawn_and_join(fn, args: tuple, nprocs: int, grace_s: float = GRACE_S,
                   start_method: str = "spawn") -> None:
    """``mp.spawn`` that also stops every rank on Ctrl-C: ranks ignore SIGINT (so one keypress is not
    N+1 tracebacks racing), the launcher sends them SIGTERM (they finish their logs) and, after
    ``grace_s``, SIGKILL.  A failed rank raises :class:`RanksFailed`.  ``start_method``: spawn or forkserver
    (see :mod:`gvq.run.warm`)."""
    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False,
                             start_method=start_method)
    try:
        while True:
            stopped = [i for i, p in enumerate(ctx.processes) if _stopped(p.pid)]
            try:
                if ctx.join(timeout=1.0, grace_period=FAIL_GRACE_S):
                    return
            except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
                raise RanksFailed(_root_cause(ctx, e), stopped) from e
    except KeyboardInterrupt:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + grace_s
        for p in ctx.processes:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
        raise
