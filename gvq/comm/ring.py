"""Ring engine: the five ways gvq sums a flat gradient over N ranks, all over :class:`gvq.comm.p2p.P2P`.

See docs/design.md#gvqcommringpy for how it works and why.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gvq.comm.alltoall_quant import qgz_allreduce_
from gvq.comm.clock import Stopwatch
from gvq.comm.hierarchy import hierarchical_allreduce_
from gvq.comm.p2p import P2P
from gvq.comm.ring_plain import allgather_, reduce_scatter_, timed_alone
from gvq.comm.ring_batched import additive_steps_
from gvq.comm.ring_sparse import sparse_allreduce_
from gvq.comm.ring_steps import add_own_share, decompress_into
from gvq.compressors.base import Compressor


@dataclass
class Ring:
    """One ring an aggregator's ``average`` runs on a vector at N ranks: what it runs, and what the cost
    model (:mod:`gvq.predict`) prices, declared once (``Aggregator.rings``)."""
    kind: str                          # plain | additive | reencode | sparse | allgather | ps (the functions
                                       #   below) | hierarchical (gvq/comm/hierarchy.py: ``inner`` across nodes)
                                       #   | qgz (gvq/comm/alltoall_quant.py: two all-to-alls, then a gather)
    segs: list                         # per rank: a slice of the vector, or a list of pieces (slices);
                                       #   allgather / ps: [[the span]]; hierarchical, qgz: the codec's cuts
    codec: Compressor | None = None    # None: plain values
    label: str = ""                    # names this ring's codec costs beside the option's ("P", "Q")
    inner: str = ""                    # hierarchical: the kind of the ring across nodes; qgz: the intra-node
                                       #   reduce's wire (compressed | fp16 | fp32)
    gather: str = ""                   # qgz: the all-gather's wire (compressed | fp32)

    def run_(self, flat: torch.Tensor, p2p: P2P, stopwatch: Stopwatch) -> dict | None:
        """Overwrite ``flat`` with its sum over the ranks, on this ring; the columns the ring itself
        measures (the sparse ring's ``ring_density``), or None."""
        if self.kind == "sparse":
            return sparse_ring_(flat, self.segs, self.codec, p2p, stopwatch)
        if self.kind == "plain":
            allreduce_(flat, self.segs, p2p)
        elif self.kind == "additive":
            additive_allreduce_(flat, self.segs, self.codec, p2p, stopwatch)
        elif self.kind == "reencode":
            reencode_allreduce_(flat, self.segs, self.codec, p2p, stopwatch)
        elif self.kind == "hierarchical":
            hierarchical_allreduce_(flat, self, p2p, stopwatch)
        elif self.kind == "qgz":
            qgz_allreduce_(flat, self, p2p, stopwatch)
        else:
            gather_allreduce_(flat, self.codec, p2p, stopwatch, self.kind, self.segs[0][0])


#: (e) the sparse ring (gvq/comm/ring_sparse.py): unions of sparse chunks, dense from density 1/2 on
sparse_ring_ = timed_alone(sparse_allreduce_)


@timed_alone
def allreduce_(flat: torch.Tensor, segs: list[slice], p2p: P2P) -> None:
    """(a) Uncompressed ring all-reduce, in place."""
    if p2p.world_size > 1:
        reduce_scatter_(flat, segs, p2p)
        allgather_(flat, segs, p2p)


@timed_alone
def additive_allreduce_(flat: torch.Tensor, segs: list, comp: Compressor, p2p: P2P,
                        clock: Stopwatch) -> None:
    """(b) Pipelined compressed-domain RAR (GradiVeQ Algorithm 1) for ``comp.additive``.

    ``segs``: N segments, each a slice or a list of consecutive slices ("pieces", on ``comp.cuts``).
    Pieces make Algorithm 1's pipeline finer without changing what is summed or sent: each piece is
    its own message, forwarded as soon as it is complete (cut-through), so only the first piece's
    compression and the last piece's decompression stay outside the wire time, instead of a whole
    segment's (1/N of all the compute).  One piece per segment is the paper's Algorithm 1 exactly.
    """
    if not comp.additive:
        raise ValueError(f"aggregator.topology=ring: compressor {comp.name!r} is not additive; "
                         "its payloads cannot be summed in the compressed domain (use the re-encode ring)")
    segs = [[s] if isinstance(s, slice) else list(s) for s in segs]
    if p2p.world_size == 1:                      # a sum of one payload: encode and decode, no wire
        for q in (q for seg in segs for q in seg):
            with clock("compress"):
                payload = comp.compress(flat[q], q)
            decompress_into(flat, q, payload, comp, clock)
        return
    if p2p.batched:                              # NCCL: a step's messages posted together
        additive_steps_(flat, segs, comp, p2p, clock)
        return
    sends: list = []
    held = _compressed_reduce_scatter(flat, segs, comp, p2p, clock, sends)
    _compressed_allgather(flat, segs, held, comp, p2p, clock, sends)
    for h in sends:
        p2p.wait(h, p2p.right)


def _compressed_reduce_scatter(flat, segs: list[list[slice]], comp: Compressor, p2p: P2P, clock: Stopwatch,
                               sends: list) -> list:
    """Phase 1 of Algorithm 1: N - 1 steps, each adding this rank's compressed piece to the payload
    received from the left and passing it on; returns the fully summed payloads of segment r + 1.
    Every send handle is appended to ``sends`` (waited for once, at the end of the ring)."""
    n, r = p2p.world_size, p2p.rank
    held = []
    for q in segs[r]:                                   # own segment: each piece leaves once compressed
        with clock("compress"):
            held.append(comp.compress(flat[q], q))
        sends.append(p2p.isend(held[-1], p2p.right))
    for i in range(n - 1):
        pieces = segs[(r - i - 1) % n]
        inboxes = [comp.empty_payload(q, flat.device) for q in pieces]
        recvs = [p2p.irecv(b, p2p.left) for b in inboxes]    # posted first: compression overlaps them
        for q, inbox, recv in zip(pieces, inboxes, recvs):
            add_own_share(flat, q, inbox, recv, comp, p2p, clock)
            if i < n - 2:
                sends.append(p2p.isend(inbox, p2p.right))
        held = inboxes
    return held


def _compressed_allgather(flat, segs: list[list[slice]], held: list, comp: Compressor, p2p: P2P,
                          clock: Stopwatch, sends: list) -> None:
    """Phase 2: forward each summed piece on arrival; decompress earlier ones while later ones travel
    (at most two segments' worth of payloads wait, so memory stays bounded)."""
    n, r = p2p.world_size, p2p.rank
    pending = list(zip(segs[(r + 1) % n], held))
    sends += [p2p.isend(b, p2p.right) for b in held]
    for i in range(n - 1):
        pieces = segs[(r - i) % n]
        inboxes = [comp.empty_payload(q, flat.device) for q in pieces]
        recvs = [p2p.irecv(b, p2p.left) for b in inboxes]
        for q, inbox, recv in zip(pieces, inboxes, recvs):
            while pending and (not p2p.done(recv) or len(pending) > 2 * len(pieces)):
                decompress_into(flat, *pending.pop(0), comp, clock)
            p2p.wait(recv, p2p.left)
            if i < n - 2:
                sends.append(p2p.isend(inbox, p2p.right))
            pending.append((q, inbox))
    for q, payload in pending:
        decompress_into(flat, q, payload, comp, clock)


@timed_alone
def reencode_allreduce_(flat: torch.Tensor, segs: list[slice], comp: Compressor, p2p: P2P,
                        clock: Stopwatch) -> None:
    """(c) Decode-add-encode RAR: every hop pays decompress + add + compress on the critical path
    (``Compressor.reencode_sum``: fused into one or two kernel launches on the Triton path)."""
    n, r = p2p.world_size, p2p.rank
    with clock("compress"):
        held = comp.compress(flat[segs[r]], segs[r])
    for i in range(n - 1):
        seg = segs[(r - i - 1) % n]
        inbox = comp.empty_payload(seg, flat.device)
        recv, send = p2p.exchange(held, p2p.right, inbox, p2p.left)
        p2p.wait(recv, p2p.left)
        held = comp.reencode_sum(inbox, flat[seg], seg, clock)     # timed per phase inside
        p2p.wait(send, p2p.right)
    idx = (r + 1) % n
    with clock("decompress"):
        flat[segs[idx]] = comp.decompress(held, segs[idx])
    for i in range(n - 1):
        seg = segs[(r - i) % n]
        inbox = comp.empty_payload(seg, flat.device)
        recv, send = p2p.exchange(held, p2p.right, inbox, p2p.left)
        p2p.wait(recv, p2p.left)
        with clock("decompress"):
            flat[seg] = comp.decompress(inbox, seg)
        p2p.wait(send, p2p.right)
        held = inbox


@timed_alone
def gather_allreduce_(flat: torch.Tensor, comp: Compressor, p2p: P2P, clock: Stopwatch,
                      topology: str = "allgather", whole: slice | None = None) -> None:
    """(d) Compress the whole vector (or its span ``whole``) once; all-gather the payloads or go through
    rank 0 (``ps``)."""
    n, r = p2p.world_size, p2p.rank
    whole = slice(0, flat.numel()) if whole is None else whole
    with clock("compress"):
        own = comp.compress(flat[whole], whole)
    if topology == "ps":
        _through_server(flat, own, comp, p2p, clock, whole)
        return
    payloads = {r: own}
    for i in range(n - 1):                          # forward payloads around the ring, unchanged
        inbox = comp.empty_payload(whole, flat.device)
        recv, send = p2p.exchange(payloads[(r - i) % n], p2p.right, inbox, p2p.left)
        p2p.wait(recv, p2p.left)
        p2p.wait(send, p2p.right)
        payloads[(r - i - 1) % n] = inbox
    _decode_sum(flat, [payloads[k] for k in range(n)], comp, clock, whole)


def _decode_sum(flat, payloads, comp, clock, whole: slice):
    """Sum of decoded payloads in rank order, so every rank gets the same bits."""
    with clock("decompress"):
        total = comp.decompress(payloads[0], whole).clone()
        for p in payloads[1:]:
            total += comp.decompress(p, whole)
    flat[whole] = total


def _through_server(flat, own, comp, p2p, clock, whole: slice):
    n, r = p2p.world_size, p2p.rank
    if r != 0:
        p2p.wait(p2p.isend(own, 0), 0)
        result = comp.empty_payload(whole, flat.device)
        p2p.wait(p2p.irecv(result, 0), 0)
    else:
        inboxes = [comp.empty_payload(whole, flat.device) for _ in range(n - 1)]
        recvs = [p2p.irecv(b, k + 1) for k, b in enumerate(inboxes)]
        for k, h in enumerate(recvs):
            p2p.wait(h, k + 1)
        _decode_sum(flat, [own] + inboxes, comp, clock, whole)
        with clock("compress"):
            result = comp.compress(flat[whole], whole)
        sends = [p2p.isend(result, k) for k in range(1, n)]
        for k, h in enumerate(sends):
            p2p.wait(h, k + 1)
    with clock("decompress"):
        flat[whole] = comp.decompress(result, whole)
