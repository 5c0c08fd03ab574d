"""The per-rank communication thread a gvq DDP hook hands its buckets to.

The hook runs on the autograd thread and must not block it: it queues the bucket and returns a future.
This thread takes the buckets in the order they were queued (DDP's bucket order, the same on every
rank), averages each through the aggregator's own ring over :class:`gvq.comm.p2p.P2P` (so the link
emulator, byte counts and the clock apply) and completes its future.  It lives inside its owner's
communication lane for its whole life, so under ``net.clock=virtual`` its time is the rank's
communication lane, not its compute lane.

An exception here (a lost peer, a codec error) fails that bucket's future and every one queued or
queued later, so ``backward`` raises with the message (which names the rank) instead of hanging.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

import torch

from gvq.comm import clock
from gvq.comm.errors import RankError
from gvq.schema.columns import column


@dataclass
class BucketJob:
    """One DDP bucket on its way to the communication thread."""
    future: torch.futures.Future
    flat: torch.Tensor           # the bucket's buffer: concatenated gradients, averaged in place
    params: list[int]            # its parameters as positions in the aggregator's ``params``
    index: int
    is_last: bool
    t_ready: float               # when backward produced it, on the compute lane's clock


@dataclass
class IterationRecord:
    """What one iteration's buckets cost, on the communication lane's clock."""
    iteration: int
    buckets: int = 0
    t_first: float | None = None  # backward launched the first bucket (handed it to the hook)
    t_ready_last: float = 0.0     # backward produced the last bucket
    t_done: float = 0.0           # last bucket averaged
    t_start_last: float = 0.0     # the communication lane took up the last bucket
    averaging_s: float = 0.0      # the vectors' own averaging (each one's ``aggregate_s``), summed
    sums: dict = field(default_factory=dict)
    weighted: dict = field(default_factory=dict)
    numel: int = 0

    def add(self, t_ready: float, n: int, stats: dict) -> None:
        """One vector of ``n`` values averaged (``stats``: its ``average_bucket_`` measurements): its
        ``aggregate_s`` adds to ``averaging_s``; another amount (a declared column in seconds or bytes)
        adds up over buckets; any other number is the mean weighted by bucket size; labels are the
        aggregator's ``finish_iteration``'s to give."""
        self.buckets += 1
        self.t_first = t_ready if self.t_first is None else self.t_first
        self.t_ready_last = t_ready
        self.numel += n
        self.averaging_s += float(stats["aggregate_s"])
        for k, v in stats.items():
            if k == "aggregate_s" or isinstance(v, str):
                continue
            if column(k).unit in ("s", "B"):
                self.sums[k] = self.sums.get(k, 0.0) + float(v)
            else:
                self.weighted[k] = self.weighted.get(k, 0.0) + float(v) * n

    def result(self) -> dict:
        """The iteration's declared columns (docs/columns.md)."""
        out = {k: v / max(self.numel, 1) for k, v in self.weighted.items()}
        out.update(self.sums)
        comm = self.t_done - self.t_first if self.t_first is not None else 0.0
        return {**out, "buckets": self.buckets, "comm_s": comm, "averaging_s": self.averaging_s,
                "exposed_s": max(0.0, self.t_done - self.t_ready_last),
                "last_bucket_s": max(0.0, self.t_done - self.t_start_last)}


class CommThread:
    """A daemon thread that averages queued buckets with ``reduce(job) -> None`` (which completes the
    job's future) on ``lanes``' communication lane; :meth:`close` stops and joins it."""

    def __init__(self, reduce, name: str, label: str, lanes: clock.Lanes):
        self.reduce, self.label, self.lanes = reduce, label, lanes
        self.jobs: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, job: BucketJob) -> None:
        with self._lock:
            if self.error is None:
                self.jobs.put(job)
                return
        job.future.set_exception(self.error)

    def _run(self) -> None:
        with self.lanes.comm_lane():
            while True:
                job = self.jobs.get()
                if job is None:
                    return
                try:
                    self.reduce(job)
                except BaseException as e:              # it must reach backward
                    self._fail(job, e if isinstance(e, RankError)        # it names its rank already
                               else RuntimeError(f"{self.label}, bucket {job.index}: {type(e).__name__}: {e}"))

    def _fail(self, job: BucketJob, error: BaseException) -> None:
        """Fail this bucket and every queued one; later buckets fail at :meth:`submit`."""
        with self._lock:
            self.error = error
            failed = [job]
            while True:
                try:
                    queued = self.jobs.get_nowait()
                except queue.Empty:
                    break
                if queued is not None:
                    failed.append(queued)
                else:
                    self.jobs.put(None)                  # a close() in the queue: keep it
                    break
        for j in failed:
            if not j.future.done():
                j.future.set_exception(error)

    def close(self, timeout: float | None = None) -> None:
        """Stop after the queued buckets; join the thread (no orphan)."""
        if self.thread.is_alive():
            self.jobs.put(None)
            self.thread.join(timeout)
