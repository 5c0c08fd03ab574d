"""The sparse ring (``aggregator.topology=sparse_ring``): a ring all-reduce of a sparse codec's payload
(top-k, topk_chunk: ``Compressor.sparse``), SparCML's split all-reduce on gvq's ring.

Each rank compresses its whole vector once (the selection allgather makes, so the scopes are the same) and
cuts its entries into the ring's N segments.  Reduce-scatter: at each of N - 1 hops a rank decodes the chunk
that arrived, adds its own entries of that segment (the union of the supports, values summed: nothing is
re-selected, so nothing is dropped mid-ring and the sum is the allgather's, in another order) and sends it
on; all-gather: each fully summed chunk is forwarded unchanged.  A chunk travels as (position, value) pairs
while the union's density is below 1/2 and as the segment's dense values from 1/2 on (then 8 bytes a pair
would cost more than 4 a value), dense for the rest of the ring.

Wire, per message: a header (one int32: the pairs that follow, or ``DENSE``) and the body (int32 positions
relative to the segment, then float32 values: 8 bytes a pair; or 4 bytes a value of the segment).  The
receiver sizes the body's buffer from the header, so a hop is two messages: :class:`gvq.comm.p2p.P2P` counts
both (``bytes_sent``, ``bytes_received``), and the link model charges each.  The sizes are host numbers, so
the ring reads each union's count back once per hop (a message's size must be known to send it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gvq.comm.clock import Stopwatch
from gvq.comm.p2p import P2P
from gvq.compressors.base import Compressor

DENSE = -1              # header: the body is the segment's dense float32 values
HEADER_BYTES = 4        # one int32
PAIR_BYTES = 8          # int32 position + float32 value
VALUE_BYTES = 4


@dataclass
class Chunk:
    """One segment's partial sum: (position, value) pairs, or its dense values (``pos`` None)."""
    pos: Tensor | None          # int64, sorted, unique, relative to the segment
    vals: Tensor                # float32: the pairs' values, or the whole segment's
    length: int                 # the segment's values

    @property
    def density(self) -> float:
        return 1.0 if self.pos is None else self.pos.numel() / max(self.length, 1)

    def settled(self) -> Chunk:
        """Dense once the density reaches 1/2 (8 bytes a pair >= 4 a value)."""
        if self.pos is None or 2 * self.pos.numel() < self.length:
            return self
        dense = torch.zeros(self.length, dtype=torch.float32, device=self.vals.device)
        dense[self.pos] = self.vals
        return Chunk(None, dense, self.length)

    def body(self) -> Tensor:
        if self.pos is None:
            return self.vals
        return torch.cat([self.pos.to(torch.int32).view(torch.uint8), self.vals.view(torch.uint8)])

    def header(self) -> Tensor:
        return torch.tensor([DENSE if self.pos is None else self.pos.numel()], dtype=torch.int32,
                            device=self.vals.device)


def message_bytes(pairs: int, length: int) -> int:
    """Bytes of one chunk's message (header + body) with ``pairs`` entries in a segment of ``length``
    values: what the cost model prices (:mod:`gvq.predict.schedule`)."""
    body = VALUE_BYTES * length if 2 * pairs >= length else PAIR_BYTES * pairs
    return HEADER_BYTES + body


def merged(inbox: Chunk, own: Chunk) -> Chunk:
    """The union of ``inbox``'s and ``own``'s supports, values summed (inbox's first), dense from 1/2 on."""
    if inbox.pos is None or own.pos is None:
        dense, other = (inbox, own) if inbox.pos is None else (own, inbox)
        total = dense.vals.clone()
        if other.pos is None:
            total += other.vals
        else:
            total.index_add_(0, other.pos, other.vals)
        return Chunk(None, total, inbox.length)
    union, where = torch.unique(torch.cat([inbox.pos, own.pos]), sorted=True, return_inverse=True)
    vals = torch.zeros(union.numel(), dtype=torch.float32, device=union.device)
    vals.index_add_(0, where, torch.cat([inbox.vals, own.vals]))
    return Chunk(union, vals, inbox.length).settled()


def own_chunks(flat: Tensor, segs: list[slice], comp: Compressor, clock: Stopwatch) -> list[Chunk]:
    """This rank's entries, compressed on the whole vector, cut into the segments."""
    whole = slice(0, flat.numel())
    with clock("compress"):
        payload = comp.compress(flat, whole)
    with clock("decompress"):
        pos, vals = comp.entries(payload, whole)
        pos, order = torch.sort(pos)
        vals = vals[order]
        bounds = torch.tensor([s.start for s in segs[1:]], dtype=torch.int64, device=pos.device)
        counts = torch.bucketize(pos, bounds, right=True).bincount(minlength=len(segs)).tolist()
    return [Chunk(p - s.start, v, s.stop - s.start).settled()
            for s, p, v in zip(segs, pos.split(counts), vals.split(counts))]


def _hop(held: Chunk, length: int, p2p: P2P) -> Chunk:
    """Send ``held`` right, receive the left's chunk of a segment of ``length`` values (header, then body)."""
    device = held.vals.device
    head = torch.empty(1, dtype=torch.int32, device=device)
    recv, send = p2p.exchange(held.header(), p2p.right, head, p2p.left)
    p2p.wait(recv, p2p.left)
    p2p.wait(send, p2p.right)
    pairs = int(head[0])
    inbox = torch.empty(length if pairs == DENSE else PAIR_BYTES * pairs,
                        dtype=torch.float32 if pairs == DENSE else torch.uint8, device=device)
    recv, send = p2p.exchange(held.body(), p2p.right, inbox, p2p.left)
    p2p.wait(recv, p2p.left)
    p2p.wait(send, p2p.right)
    if pairs == DENSE:
        return Chunk(None, inbox, length)
    return Chunk(inbox[: 4 * pairs].view(torch.int32).to(torch.int64), inbox[4 * pairs:].view(torch.float32), length)


def sparse_allreduce_(flat: Tensor, segs: list[slice], comp: Compressor, p2p: P2P, clock: Stopwatch) -> dict:
    """Overwrite ``flat`` with the sum over the ranks of each one's decoded payload; returns the
    ``ring_density`` column: the densest chunk this rank sent (1 on one rank: nothing sent)."""
    if not comp.sparse:
        raise ValueError(f"aggregator.topology=sparse_ring: compressor {comp.name!r} is not sparse (top-k, "
                         "topk_chunk): its payload has no entries to sum as unions")
    n, r = p2p.world_size, p2p.rank
    own = own_chunks(flat, segs, comp, clock)
    if n == 1:
        for s, chunk in zip(segs, own):
            _write(flat, s, chunk)
        return {"ring_density": 1.0}
    densest, held = 0.0, own[r]
    for i in range(n - 1):                       # reduce-scatter: held is segment (r - i)'s partial sum
        inc = (r - i - 1) % n
        densest = max(densest, held.density)
        inbox = _hop(held, segs[inc].stop - segs[inc].start, p2p)
        with clock("add"):
            held = merged(inbox, own[inc])
    done = {(r + 1) % n: held}
    for i in range(n - 1):                       # all-gather: forward each summed chunk unchanged
        inc = (r - i) % n
        densest = max(densest, held.density)
        held = _hop(held, segs[inc].stop - segs[inc].start, p2p)
        done[inc] = held
    with clock("decompress"):
        for k, s in enumerate(segs):
            _write(flat, s, done[k])
    return {"ring_density": densest}


def _write(flat: Tensor, seg: slice, chunk: Chunk) -> None:
    if chunk.pos is None:
        flat[seg] = chunk.vals
        return
    part = flat[seg]
    part.zero_()
    part[chunk.pos] = chunk.vals.to(flat.dtype)
