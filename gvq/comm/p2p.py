"""Point-to-point transport for the ring engine: timing, byte accounting and emulated links.

See docs/design.md#gvqcommp2ppy for how it works and why.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from gvq.comm import clock
from gvq.comm.errors import RankError
from gvq.comm.links import Cluster, EmulatedLink, VirtualLink, VirtualMessage, wait_all
from gvq.comm.staging import HostStage, Staged

CHUNK_BYTES = 64 * 1024    # ~alpha*B at 1 Gbit/s (gloo's per-message cost times the rate); small next to a ring segment


def chunks(tensor: torch.Tensor) -> list[torch.Tensor]:
    per = max(1, CHUNK_BYTES // tensor.element_size())
    return list(tensor.split(per)) if tensor.numel() > per else [tensor]


class _Tally:
    """One rank's traffic since the last reset: bytes sent, received and sent across nodes; time waited."""

    def __init__(self):
        self.sent = self.received = self.inter = 0
        self.wire_s = 0.0


class PeerLostError(RankError):
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
        """Once: a second wait on a finished gloo receive would wait for the next message (a batch's
        handle is waited for by every message of it)."""
        wait_all(self.handles, timeout)
        self.handles = []
        return True

    def is_completed(self):
        return all(h.is_completed() for h in self.handles)


def peer_timeout_s(given: float | None) -> float:
    """How long a peer is waited for: ``given``, else the default process group's timeout (what
    ``init_process_group(timeout=...)``, torchrun or a framework set: a peer paused for evaluation or a
    checkpoint is waited out as plain DDP waits it out), else torch's default."""
    if given is not None:
        return float(given)
    if dist.is_available() and dist.is_initialized():
        return dist.group.WORLD.get_group_store().timeout.total_seconds()
    return dist.default_pg_timeout.total_seconds()


def nccl_group() -> bool:
    """Does the default process group carry CUDA tensors over NCCL (``nccl``, or the launcher's
    ``cuda:nccl,cpu:gloo``)?"""
    return dist.is_initialized() and "nccl" in str(dist.get_backend())


class P2P:
    """isend / irecv / wait with accounting.  ``wire_s`` counts only time blocked in ``wait``;
    ``stage_s`` the host copies of device tensors (see :mod:`gvq.comm.staging`) on a group without NCCL,
    or under an emulated link or the virtual clock (the link model keeps time on the host: the bytes go
    through host memory over gloo); ``stage=True``: every tensor, to exercise the path without a GPU.

    ``batched`` (NCCL without a link model; ``batch=True`` forces it, e.g. on gloo in tests): a ring
    step's receive and send are posted as one ``batch_isend_irecv`` (:meth:`exchange`), so no order of
    sends and receives can deadlock (NCCL runs a pair of ranks' operations in order on one stream: at
    N = 2 both ranks would sit in their receive)."""

    def __init__(self, rank: int, world_size: int, timeout_s: float | None = None,
                 bandwidth_bps: float | None = None, latency_s: float = 0.0, stage: bool | None = None,
                 batch: bool | None = None, group=None, cluster: Cluster | None = None):
        self.rank, self.world_size = rank, world_size     # in ``group``: its ring runs among its ranks only
        self.group = group                                # None: the default process group
        self._peers = None if group is None else dist.get_process_group_ranks(group)   # group -> global
        if self._peers is not None and len(self._peers) != world_size:
            raise ValueError(f"P2P: a group of {len(self._peers)} ranks for a ring of {world_size}")
        self._timeout_s = timeout_s             # None: the process group's (read at use: it may come later)
        self._timeout: timedelta | None = None
        self.cluster = cluster or Cluster()
        # the clock is read at every use, not kept: a hook's communication thread runs on its own lane
        self.link = self._make_link(bandwidth_bps, latency_s, "net.bandwidth_bps (e.g. net=mbit50)")
        self.intra_link = None if self.cluster.flat else self._make_link(
            self.cluster.intra_bandwidth_bps, self.cluster.intra_latency_s, "net.intra_bandwidth_bps")
        self.shaped = self.link is not None or self.intra_link is not None
        self.stage, self._stage_all = HostStage(), stage is True
        self._stage_device = stage is None and (not nccl_group() or self.shaped)
        self.batched = (nccl_group() if batch is None else batch) and not self.shaped and not self._stage_all
        self._tally = _Tally()
        self._views: dict = {}                  # among()'s views by their global ranks, shared by every view

    def _make_link(self, bandwidth_bps, latency_s, key: str):
        if clock.get().virtual and not bandwidth_bps:
            raise ValueError(f"net.clock=virtual needs a link model: set {key}")
        if not bandwidth_bps:
            return None
        if clock.get().virtual:
            return VirtualLink(bandwidth_bps, latency_s)
        return EmulatedLink(bandwidth_bps, latency_s, self.group)

    def among(self, members: list[int]) -> P2P:
        """A ring among some of this ring's ranks (``members``, positions in it, this rank among them): the
        same links, counters and clock, so a hierarchical collective's phases are one rank's traffic.  Made
        once per set of ranks and kept (every hierarchical all-reduce asks again; a fresh copy would also
        resolve its timeout again)."""
        peers = tuple(self.peer(m) for m in members)
        view = self._views.get(peers)
        if view is None:
            view = copy.copy(self)
            view._peers = list(peers)
            view.rank, view.world_size = members.index(self.rank), len(members)
            view._timeout = self._timeout
            self._views[peers] = view
        return view

    def _same_node(self, dst: int) -> bool:
        return self.cluster.node_of(self.peer(dst)) == self.cluster.node_of(self.peer(self.rank))

    def _link_to(self, dst: int):
        return self.intra_link if self._same_node(dst) and not self.cluster.flat else self.link

    # the counters live in one tally that :meth:`among`'s views share
    bytes_sent = property(lambda self: self._tally.sent)
    bytes_received = property(lambda self: self._tally.received)
    bytes_inter = property(lambda self: self._tally.inter, doc="bytes sent to ranks of other nodes")
    wire_s = property(lambda self: self._tally.wire_s)

    def _count_sent(self, nbytes: int, dst: int) -> None:
        self._tally.sent += nbytes
        if not self._same_node(dst) or self.cluster.flat:
            self._tally.inter += nbytes

    @property
    def timeout(self) -> timedelta:
        """Read at every wait: resolved once a process group exists (whose timeout it may follow)."""
        if self._timeout is None:
            resolved = timedelta(seconds=peer_timeout_s(self._timeout_s))
            if self._timeout_s is not None or (dist.is_available() and dist.is_initialized()):
                self._timeout = resolved
            return resolved
        return self._timeout

    def peer(self, r: int) -> int:
        """Rank ``r`` of the ring (of ``group``) as the global rank torch's point-to-point calls take."""
        return r if self._peers is None else self._peers[r]

    def all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> None:
        """``t`` reduced over the ring's ranks in place (its group, never another's), waiting inside the
        clock's ``blocked`` (a wait, not work)."""
        with clock.get().blocked():
            dist.all_reduce(t, op=op, group=self.group)

    @property
    def right(self) -> int:
        return (self.rank + 1) % self.world_size

    @property
    def left(self) -> int:
        return (self.rank - 1) % self.world_size

    def reset(self):
        self._tally.__init__()
        self.stage.reset()

    @property
    def stage_s(self) -> float:
        return self.stage.seconds

    def _staged(self, tensor: torch.Tensor) -> bool:
        return self._stage_all or (self._stage_device and tensor.device.type != "cpu")

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0):
        if tensor.numel() == 0:
            return _Done()
        with self._posting(dst):
            if self._staged(tensor):                   # gloo must never see a device tensor
                buf = self.stage.outgoing(tensor)
                return Staged(self._isend(buf, dst, tag), self.stage, buf)
            return self._isend(tensor, dst, tag)

    @contextmanager
    def _posting(self, peer: int):
        """A message posted to a peer whose connection is already gone fails as a lost peer, as a wait
        for it does (gloo refuses the post at once when the peer closed its side)."""
        try:
            yield
        except RuntimeError as e:
            raise self._lost(peer, e) from e

    def _lost(self, peer: int | None, e: BaseException) -> PeerLostError:
        who = f"rank {self.peer(peer)}" if peer is not None else "a peer"
        return PeerLostError(
            self.peer(self.rank), f"lost {who} (no answer within {self.timeout.total_seconds():g}s "
            f"or connection closed): {str(e).splitlines()[0] if str(e) else type(e).__name__}")

    def _isend(self, tensor: torch.Tensor, dst: int, tag: int):
        nbytes = tensor.numel() * tensor.element_size()
        self._count_sent(nbytes, dst)
        link = self._link_to(dst)
        if clock.get().virtual:
            arrival = link.arrival(nbytes, clock.get().now())
            header = torch.tensor([arrival], dtype=torch.float64)
            return VirtualMessage(header, [dist.isend(header, self.peer(dst), self.group, tag),
                                            dist.isend(tensor, self.peer(dst), self.group, tag)], arrival)
        if link is not None:
            return _All([link.submit(c, self.peer(dst), tag) for c in chunks(tensor)])
        return dist.isend(tensor, self.peer(dst), self.group, tag)

    def exchange(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int, tag: int = 0):
        """One ring step: ``recv`` from ``src`` and ``send`` to ``dst``; (receive handle, send handle)
        for :meth:`wait`.  ``batched``: posted together; else irecv then isend."""
        recvs, sends = self.exchange_all([send], dst, [recv], src, tag)
        return recvs[0], sends[0]

    def exchange_all(self, sends: list, dst: int, recvs: list, src: int, tag: int = 0):
        """Several messages each way in one step (pieces): (receive handles, send handles), one per
        message; batched, every receive handle waits for the whole batch and the send handles are done."""
        if not self.batched or self._stage_device and any(t.device.type != "cpu" for t in sends + recvs):
            return [self.irecv(t, src, tag) for t in recvs], [self.isend(t, dst, tag) for t in sends]
        ops = [dist.P2POp(dist.irecv, t, self.peer(src), self.group, tag) for t in recvs if t.numel()]
        ops += [dist.P2POp(dist.isend, t, self.peer(dst), self.group, tag) for t in sends if t.numel()]
        self._count_sent(sum(t.numel() * t.element_size() for t in sends), dst)
        self._tally.received += sum(t.numel() * t.element_size() for t in recvs)
        with self._posting(src):
            both = _All(dist.batch_isend_irecv(ops) if ops else [])
        return [both] * len(recvs), [_Done()] * len(sends)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0):
        if tensor.numel() == 0:
            return _Done()
        self._tally.received += tensor.numel() * tensor.element_size()
        with self._posting(src):
            if self._staged(tensor):
                buf = self.stage.acquire(tensor)
                return Staged(self._irecv(buf, src, tag), self.stage, buf, dst=tensor)
            return self._irecv(tensor, src, tag)

    def _irecv(self, tensor: torch.Tensor, src: int, tag: int):
        if clock.get().virtual:
            header = torch.empty(1, dtype=torch.float64)
            return VirtualMessage(header, [dist.irecv(header, self.peer(src), self.group, tag),
                                            dist.irecv(tensor, self.peer(src), self.group, tag)])
        if self._link_to(src) is not None:      # the sender's link of this class sent it in chunks
            return _All([dist.irecv(c, self.peer(src), self.group, tag) for c in chunks(tensor)])
        return dist.irecv(tensor, self.peer(src), self.group, tag)

    def done(self, handle) -> bool:
        """Has ``handle`` finished?  Wall: never blocks (errors surface in :meth:`wait`).  Virtual: done
        only if the message has arrived by this rank's clock, which may need its real header first (a
        blocking read; safe in the ring, where a probe is followed by local work only, never a send)."""
        inner = handle.handle if isinstance(handle, Staged) else handle
        if not isinstance(inner, VirtualMessage):
            return inner.is_completed()                      # (a staged copy back: in the wait after)
        if inner.arrival_in_header:
            self._real_wait(inner, None, upto=1)             # the header: when does it arrive?
        if inner.arrival > clock.get().now():
            return False
        self.wait(handle)
        return True

    def wait(self, handle, peer: int | None = None) -> None:
        inner = handle.handle if isinstance(handle, Staged) else handle
        t0 = clock.get().now()
        try:
            self._real_wait(inner, peer)
            if isinstance(inner, VirtualMessage):
                clock.get().advance_to(inner.arrival)
        finally:
            self._tally.wire_s += clock.get().now() - t0
        if isinstance(handle, Staged):                       # outside wire_s: stage_s has it
            handle.finish()

    def _real_wait(self, handle, peer: int | None, **kw) -> None:
        try:
            with clock.get().blocked():
                handle.wait(timeout=self.timeout, **kw)
        except Exception as e:
            raise self._lost(peer, e) from e

    def close(self):
        for link in (self.link, self.intra_link):
            if link is not None:
                link.close()
