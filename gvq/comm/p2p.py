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

Under ``net.clock=virtual`` (:mod:`gvq.comm.clock`) the same link model is computed instead of slept
(:class:`VirtualLink`): a send at virtual time ``t`` on a link free at ``f`` occupies it from
``max(t, f)`` for ``8b/B`` and arrives ``alpha`` later; the arrival time travels in-band (an 8-byte header
message before the payload, same tag, not counted in ``bytes_sent``); waiting on a receive moves the
clock to ``max(clock, arrival)``, waiting on a send to ``max(clock, its arrival)`` (the wall emulator's
send handle completes then too).  The real bytes move at once.
"""
from __future__ import annotations

import queue
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from gvq.comm import clock
from gvq.comm.staging import HostStage, Staged

CHUNK_BYTES = 64 * 1024    # ~alpha*B at 1 Gbit/s (gloo: ~0.5 ms a message); small next to a ring segment


def chunks(tensor: torch.Tensor) -> list[torch.Tensor]:
    per = max(1, CHUNK_BYTES // tensor.element_size())
    return list(tensor.split(per)) if tensor.numel() > per else [tensor]


def wait_all(handles, timeout) -> None:
    """Wait for every handle within one ``timeout`` overall (a message in k chunks must not get k
    timeouts: a lost peer is reported after timeout_s, not k x timeout_s)."""
    deadline = None if timeout is None else time.monotonic() + timeout.total_seconds()
    for h in handles:
        left = None if deadline is None else timedelta(seconds=max(deadline - time.monotonic(), 1e-3))
        h.wait(timeout=left)


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
        wait_all(self.handles, timeout)
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


class VirtualLink:
    """One rank's outgoing link in virtual time: FIFO, serialisation at ``bandwidth_bps``, then
    ``latency_s``; computed, never slept."""

    def __init__(self, bandwidth_bps: float, latency_s: float = 0.0):
        self.bandwidth_bps, self.latency_s = float(bandwidth_bps), float(latency_s)
        self.free_at = float("-inf")

    def arrival(self, nbytes: int, t: float) -> float:
        """Arrival time of a message of ``nbytes`` handed to the link at ``t`` (occupies the link)."""
        self.free_at = max(t, self.free_at) + 8.0 * nbytes / self.bandwidth_bps
        return self.free_at + self.latency_s

    def close(self):
        pass


class _VirtualMessage:
    """A send or receive in virtual time: the real handles (header, payload) and the arrival time.
    Each real handle is waited for at most once (a second ``wait`` on a finished gloo receive would
    wait for the *next* message on its buffer)."""

    def __init__(self, header: torch.Tensor, handles: list, arrival: float | None = None):
        self.header, self.handles, self._arrival = header, handles, arrival
        self._waited = [False] * len(handles)

    @property
    def arrival(self) -> float:
        return self._arrival if self._arrival is not None else float(self.header[0])

    def wait(self, timeout=None, upto: int | None = None):
        """Wait for the real messages (only the first ``upto`` of them: the header alone is 1)."""
        todo = [i for i in range(len(self.handles[:upto])) if not self._waited[i]]
        wait_all([self.handles[i] for i in todo], timeout)
        for i in todo:
            self._waited[i] = True
        return True


class P2P:
    """isend / irecv / wait with accounting.  ``wire_s`` counts only time blocked in ``wait``;
    ``stage_s`` the host copies of device tensors on a process group that is not NCCL (see
    :mod:`gvq.comm.staging`; ``stage=True``: every tensor, to exercise the path without a GPU)."""

    def __init__(self, rank: int, world_size: int, timeout_s: float = 60.0,
                 bandwidth_bps: float | None = None, latency_s: float = 0.0, stage: bool | None = None):
        self.rank, self.world_size = rank, world_size
        self.stage, self._stage_all = HostStage(), stage is True
        self._stage_device = stage is None and not (dist.is_initialized() and dist.get_backend() == "nccl")
        self.timeout = timedelta(seconds=timeout_s)
        self.clock = clock.get()
        if self.clock.virtual and not bandwidth_bps:
            raise ValueError("net.clock=virtual needs a link model: set net.bandwidth_bps (e.g. net=mbit50)")
        link = VirtualLink if self.clock.virtual else EmulatedLink
        self.link = link(bandwidth_bps, latency_s) if bandwidth_bps else None
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
        self.stage.reset()

    @property
    def stage_s(self) -> float:
        return self.stage.seconds

    def _staged(self, tensor: torch.Tensor) -> bool:
        return self._stage_all or (self._stage_device and tensor.device.type != "cpu")

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0):
        if tensor.numel() == 0:
            return _Done()
        if self._staged(tensor):                   # gloo must never see a device tensor
            buf = self.stage.outgoing(tensor)
            return Staged(self._isend(buf, dst, tag), self.stage, buf)
        return self._isend(tensor, dst, tag)

    def _isend(self, tensor: torch.Tensor, dst: int, tag: int):
        nbytes = tensor.numel() * tensor.element_size()
        self.bytes_sent += nbytes
        if self.clock.virtual:
            arrival = self.link.arrival(nbytes, self.clock.now())
            header = torch.tensor([arrival], dtype=torch.float64)
            return _VirtualMessage(header, [dist.isend(header, dst, tag=tag), dist.isend(tensor, dst, tag=tag)],
                                   arrival)
        if self.link is not None:
            return _All([self.link.submit(c, dst, tag) for c in chunks(tensor)])
        return dist.isend(tensor, dst, tag=tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0):
        if tensor.numel() == 0:
            return _Done()
        if self._staged(tensor):
            buf = self.stage.acquire(tensor)
            return Staged(self._irecv(buf, src, tag), self.stage, buf, dst=tensor)
        return self._irecv(tensor, src, tag)

    def _irecv(self, tensor: torch.Tensor, src: int, tag: int):
        if self.clock.virtual:
            header = torch.empty(1, dtype=torch.float64)
            return _VirtualMessage(header, [dist.irecv(header, src, tag=tag), dist.irecv(tensor, src, tag=tag)])
        if self.link is not None:
            return _All([dist.irecv(c, src, tag=tag) for c in chunks(tensor)])
        return dist.irecv(tensor, src, tag=tag)

    def done(self, handle) -> bool:
        """Has ``handle`` finished?  Wall: never blocks (errors surface in :meth:`wait`).  Virtual: done
        only if the message has arrived by this rank's clock, which may need its real header first (a
        blocking read; safe in the ring, where a probe is followed by local work only, never a send)."""
        inner = handle.handle if isinstance(handle, Staged) else handle
        if not isinstance(inner, _VirtualMessage):
            return inner.is_completed()                      # (a staged copy back: in the wait after)
        if inner._arrival is None:
            self._real_wait(inner, None, upto=1)             # the header: when does it arrive?
        if inner.arrival > self.clock.now():
            return False
        self.wait(handle)
        return True

    def wait(self, handle, peer: int | None = None) -> None:
        inner = handle.handle if isinstance(handle, Staged) else handle
        t0 = self.clock.now()
        try:
            self._real_wait(inner, peer)
            if isinstance(inner, _VirtualMessage):
                self.clock.advance_to(inner.arrival)
        finally:
            self.wire_s += self.clock.now() - t0
        if isinstance(handle, Staged):                       # outside wire_s: stage_s has it
            handle.finish()

    def _real_wait(self, handle, peer: int | None, **kw) -> None:
        try:
            with self.clock.blocked():
                handle.wait(timeout=self.timeout, **kw)
        except Exception as e:
            who = f"rank {peer}" if peer is not None else "a peer"
            raise PeerLostError(
                f"rank {self.rank}: lost {who} (no answer within {self.timeout.total_seconds():g}s "
                f"or connection closed): {str(e).splitlines()[0] if str(e) else type(e).__name__}"
            ) from e

    def close(self):
        if self.link is not None:
            self.link.close()
