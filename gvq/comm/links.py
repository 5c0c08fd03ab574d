"""The link models behind :class:`gvq.comm.p2p.P2P` (docs/design.md#gvqcommp2ppy has the model): ``EmulatedLink`` sleeps
it on the wall clock (a sender thread hands each message to the real transport when the link would have
delivered it), ``VirtualLink`` computes it in virtual time (:mod:`gvq.comm.clock`), and their handles."""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Cluster:
    """Where the ranks sit: nodes of ``ranks_per_node`` consecutive global ranks.  A rank has two outgoing
    links: to ranks of other nodes (the run's ``net.bandwidth_bps`` / ``latency_s``) and to the ranks of
    its own node (``intra_*``).  One rank a node (the default) is the flat net: every link the one class."""
    ranks_per_node: int = 1
    intra_bandwidth_bps: float | None = None   # None: the node's links unshaped (wall clock only)
    intra_latency_s: float = 0.0
    #: the dtype a hierarchical collective's node phases carry dense values in: "fp32" (the vector's own) or
    #: "fp16" (half the intra-node bytes, each partial sum rounded to float16)
    intra_dtype: str = "fp32"

    @classmethod
    def of_net(cls, net) -> Cluster:
        """Where a run's ranks sit: its ``net`` node's ``ranks_per_node`` and links inside a node."""
        return cls(net["ranks_per_node"], net["intra_bandwidth_bps"], net["intra_latency_s"], str(net["intra_dtype"]))

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    @property
    def flat(self) -> bool:
        return self.ranks_per_node == 1


def whole_nodes(world_size: int, ranks_per_node: int) -> int:
    """The nodes ``world_size`` ranks fill, ``ranks_per_node`` consecutive ranks each: a one-line
    ``ValueError`` unless they fill whole nodes (the one check of the shape; its callers prefix their key)."""
    if ranks_per_node < 1 or world_size % ranks_per_node:
        raise ValueError(f"ranks_per_node={ranks_per_node}: must divide world_size={world_size} "
                         "(whole nodes of consecutive ranks)")
    return world_size // ranks_per_node


def wait_all(handles, timeout) -> None:
    """Wait for every handle within one ``timeout`` overall (a message in k chunks must not get k
    timeouts: a lost peer is reported after timeout_s, not k x timeout_s)."""
    deadline = None if timeout is None else time.monotonic() + timeout.total_seconds()
    for h in handles:
        left = None if deadline is None else timedelta(seconds=max(deadline - time.monotonic(), 1e-3))
        h.wait(timeout=left)


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

    def __init__(self, bandwidth_bps: float, latency_s: float = 0.0, group=None):
        self.bandwidth_bps = float(bandwidth_bps)
        self.latency_s = float(latency_s)
        self.group = group          # the process group it sends on (None: the default); ``dst`` is global
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
                dist.send(tensor, dst, group=self.group, tag=tag)
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


class VirtualMessage:
    """A send or receive in virtual time: the real handles (header, payload) and the arrival time.
    Each real handle is waited for at most once (a second ``wait`` on a finished gloo receive would
    wait for the *next* message on its buffer)."""

    def __init__(self, header: torch.Tensor, handles: list, arrival: float | None = None):
        self.header, self.handles, self._arrival = header, handles, arrival
        self._waited = [False] * len(handles)

    @property
    def arrival(self) -> float:
        return self._arrival if self._arrival is not None else float(self.header[0])

    @property
    def arrival_in_header(self) -> bool:
        """A receive: its arrival time is the sender's, read from the header (a send knows its own)."""
        return self._arrival is None

    def wait(self, timeout=None, upto: int | None = None):
        """Wait for the real messages (only the first ``upto`` of them: the header alone is 1)."""
        todo = [i for i in range(len(self.handles[:upto])) if not self._waited[i]]
        wait_all([self.handles[i] for i in todo], timeout)
        for i in todo:
            self._waited[i] = True
        return True
