"""Point-to-point transport for the ring engine: timing, byte accounting and emulated links.

Every byte an aggregator sends goes through :class:`P2P`, so ``bytes_sent`` and ``wire_s`` (time the
rank spent blocked on communication) are measured in one place for every aggregator.

Emulated links (``net`` config group) model one outgoing link per rank, full duplex, with bandwidth
``B`` bit/s and a per-message latency ``alpha`` s: a message of ``b`` bytes handed to the link at time
``t`` starts when the link is free, occupies it for ``8b/B`` s and arrives ``alpha`` s after it has left.
The real send happens at the emulated arrival time from a sender thread that *sleeps* until then, so
waiting burns no CPU and the main thread keeps computing (the overlap Algorithm 1 needs).  Messages
travel as chunks of ``CHUNK_BYTES`` (both sides cut them the same way), each released when the link
would have finished serialising it: a real link streams, so the receiver's last byte arrives one
chunk's real transfer after the emulated finish, not one whole message's.  Receivers
need no emulation: a message simply cannot be received before it is sent.  Only traffic that goes
through this class is shaped; collectives the runner does not own (e.g. DDP's) need kernel shaping
(``sudo python -m gvq.bench netns train``).
"""
from __future__ import annotations

import queue
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

CHUNK_BYTES = 64 * 1024    # ~alpha*B at 1 Gbit/s (PERFORMANCE.md); small next to a ring segment


def chunks(tensor: torch.Tensor) -> list[torch.Tensor]:
    per = max(1, CHUNK_BYTES // tensor.element_size())
    return list(tensor.split(per)) if tensor.numel() > per else [tensor]


class PeerLostError(RuntimeError):
    """A peer did not answer within the timeout, or its connection broke."""


class _Done:
    """A finished handle (empty messages, or non-distributed runs)."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


class _All:
    """Several handles as one (a message sent or received as chunks)."""

    def __init__(self, handles):
        self.handles = handles

    def wait(self, timeout=None):
        for h in self.handles:
            h.wait(timeout=timeout)
        return True

    def is_completed(self):
        return all(h.is_completed() for h in self.handles)


class _Emulated:
    """Handle of an emulated send: done when the sender thread has really sent it."""

    def __init__(self):
        self.event = threading.Event()
        self.error: BaseException | None = None

    def wait(self, timeout=None):
        secs = timeout.total_seconds() if timeout is not None else None
        if not self.event.wait(secs):
            raise TimeoutError("emulated send did not complete")
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self):
        return self.event.is_set()


class EmulatedLink:
    """One rank's outgoing link: FIFO, serialisation at ``bandwidth_bps``, then ``latency_s``."""

    def __init__(self, bandwidth_bps: float, latency_s: float = 0.0):
        self.bandwidth_bps = float(bandwidth_bps)
        self.latency_s = float(latency_s)
        self.free_at = 0.0
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gvq-link")
        self._thread.start()

    def submit(self, tensor: torch.Tensor, dst: int, tag: int) -> _Emulated:
        now = time.perf_counter()
        start = max(now, self.free_at)
        self.free_at = start + 8.0 * tensor.numel() * tensor.element_size() / self.bandwidth_bps
        handle = _Emulated()
        self._q.put((self.free_at + self.latency_s, tensor, dst, tag, handle))
        return handle

    def _run(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            arrive, tensor, dst, tag, handle = item
            delay = arrive - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            try:
                dist.send(tensor, dst, tag=tag)
            except BaseException as e:  # surfaced to the main thread on wait()
                handle.error = e
            handle.event.set()

    def close(self):
        """Drain and stop the sender thread before the process group goes away: a send still in
        flight during ``destroy_process_group`` aborts the process (``terminate called ...``)."""
        self._q.put(None)
        self._thread.join(timeout=10)


class P2P:
    """isend / irecv / wait with accounting.  ``wire_s`` counts only time blocked in ``wait``."""

    def __init__(self, rank: int, world_size: int, timeout_s: float = 60.0,
                 bandwidth_bps: float | None = None, latency_s: float = 0.0):
        self.rank, self.world_size = rank, world_size
        self.timeout = timedelta(seconds=timeout_s)
        self.link = EmulatedLink(bandwidth_bps, latency_s) if bandwidth_bps else None
        self.bytes_sent = 0
        self.wire_s = 0.0

    @property
    def right(self) -> int:
        return (self.rank + 1) % self.world_size

    @property
    def left(self) -> int:
        return (self.rank - 1) % self.world_size

    def reset(self):
        self.bytes_sent, self.wire_s = 0, 0.0

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0):
        if tensor.numel() == 0:
            return _Done()
        self.bytes_sent += tensor.numel() * tensor.element_size()
        if self.link is not None:
            return _All([self.link.submit(c, dst, tag) for c in chunks(tensor)])
        return dist.isend(tensor, dst, tag=tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0):
        if tensor.numel() == 0:
            return _Done()
        if self.link is not None:
            return _All([dist.irecv(c, src, tag=tag) for c in chunks(tensor)])
        return dist.irecv(tensor, src, tag=tag)

    @staticmethod
    def done(handle) -> bool:
        """Has ``handle`` finished?  Never blocks (errors surface in :meth:`wait`)."""
        return handle.is_completed()

    def wait(self, handle, peer: int | None = None) -> None:
        t0 = time.perf_counter()
        try:
            handle.wait(timeout=self.timeout)
        except Exception as e:
            who = f"rank {peer}" if peer is not None else "a peer"
            raise PeerLostError(
                f"rank {self.rank}: lost {who} (no answer within {self.timeout.total_seconds():g}s "
                f"or connection closed): {str(e).splitlines()[0] if str(e) else type(e).__name__}"
            ) from e
        finally:
            self.wire_s += time.perf_counter() - t0

    def close(self):
        if self.link is not None:
            self.link.close()
