"""The ring code's schedules replayed on a cost model, every rank at once (numpy arrays over ranks).

Each function follows one function of :mod:`gvq.comm.ring` statement by statement -- the same steps,
messages, waits and codec calls in the same order -- with costs instead of work, and the link model of
:class:`gvq.comm.links.VirtualLink`: one outgoing FIFO link per rank; a message handed over at t on a link
free at f occupies it from max(t, f) for 8b/B and arrives alpha later; a receive waits until arrival.
Rank r's k-th receive is its left neighbour's k-th send (every rank runs the same program), so a step
reads the arrival times its left neighbour produced one step earlier (``np.roll(..., 1)``).

Costs are seconds: ``Piece`` arrays give each piece's compress / decompress / add cost and payload bytes
(absent pieces: ``present`` False; empty payloads send no message, as ``P2P.isend`` of nothing).  ``msg``
is the CPU cost of posting one send or receive.  Times returned: each rank's clock at the end (start 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gvq.comm.ring_sparse import HEADER_BYTES, message_bytes

NEVER = -np.inf


@dataclass
class Link:
    bps: float
    alpha: float = 0.0
    msg: float = 0.0                        # CPU seconds to post one send or one receive ...
    msg_per_byte: float = 0.0               # ... plus this per byte of it

    def post_cost(self, nbytes) -> np.ndarray:
        return self.msg + self.msg_per_byte * np.asarray(nbytes, dtype=float)


@dataclass
class Pieces:
    """Per segment s and piece j (shape N x P): codec costs (s) and payload bytes; ``present`` marks
    the pieces that exist (segments have up to P)."""
    compress: np.ndarray
    decompress: np.ndarray
    add: np.ndarray
    nbytes: np.ndarray
    present: np.ndarray


class Ranks:
    """Every rank's clock and link; ``send`` hands a message per rank to its link, returns arrivals.  The
    clocks may be a 2-D array (nodes x ranks a node): independent rings along the last axis."""

    def __init__(self, n: int, link: Link, start=None):
        self.n, self.link = n, link
        self.t = np.zeros(n) if start is None else np.array(start, dtype=float)
        self.free = np.full(n, NEVER)
        self.last_sent = np.full(n, NEVER)    # latest arrival of anything this rank has sent

    def send(self, nbytes: np.ndarray, mask=True) -> np.ndarray:
        real = (np.asarray(nbytes) > 0) & mask
        self.t = self.t + real * self.link.post_cost(nbytes)
        start = np.maximum(self.t, self.free)
        end = start + 8.0 * np.asarray(nbytes, dtype=float) / self.link.bps
        self.free = np.where(real, end, self.free)
        arrival = np.where(real, end + self.link.alpha, NEVER)
        self.last_sent = np.maximum(self.last_sent, arrival)
        return arrival

    def post(self, nbytes: np.ndarray, mask=True) -> None:
        self.t = self.t + ((np.asarray(nbytes) > 0) & mask) * self.link.post_cost(nbytes)

    def wait(self, sent_by_left: np.ndarray, shift: int = 1) -> None:
        """A receive from the member ``shift`` before (the left neighbour; an all-to-all's step s: s)."""
        self.t = np.maximum(self.t, np.roll(sent_by_left, shift, axis=-1))   # rings along the last axis

    def wait_sent(self, own: np.ndarray) -> None:
        """``P2P.wait`` on one's own send: the virtual clock moves to its arrival too."""
        self.t = np.maximum(self.t, own)


def plain_ring(seg_bytes: np.ndarray, add: np.ndarray, link: Link, start=None) -> np.ndarray:
    """:func:`ring.allreduce_`: N - 1 reduce-scatter steps (send, wait, add), N - 1 all-gather steps."""
    R = Ranks(len(seg_bytes), link, start)
    reduce_scatter(R, seg_bytes, add)
    allgather(R, seg_bytes)
    return R.t


def reduce_scatter(R: Ranks, seg_bytes: np.ndarray, add: np.ndarray) -> None:
    """:func:`gvq.comm.ring_plain.reduce_scatter_` on ``R`` (rings of N = ``len(seg_bytes)`` along the
    last axis of its clocks): rank r ends holding segment (r + 1) % N."""
    n = len(seg_bytes)
    r = np.arange(n)
    for i in range(n - 1):
        out, inc = (r - i) % n, (r - i - 1) % n
        R.post(seg_bytes[inc])
        sent = R.send(seg_bytes[out])
        R.wait(sent)
        R.t = R.t + add[inc]
        R.wait_sent(sent)


def allgather(R: Ranks, seg_bytes: np.ndarray) -> None:
    """:func:`gvq.comm.ring_plain.allgather_` on ``R``, as :func:`reduce_scatter`."""
    n = len(seg_bytes)
    r = np.arange(n)
    for i in range(n - 1):
        out, inc = (r + 1 - i) % n, (r - i) % n
        R.post(seg_bytes[inc])
        sent = R.send(seg_bytes[out])
        R.wait(sent)
        R.wait_sent(sent)


def reencode_ring(seg_bytes, compress, decompress, hop, link: Link, start=None) -> np.ndarray:
    """:func:`ring.reencode_allreduce_`: every hop decompresses, adds, recompresses (``hop``, one cost per
    segment; nothing overlaps), then a compressed all-gather decoding each segment into the gradient."""
    n = len(seg_bytes)
    R, r = Ranks(n, link, start), np.arange(n)
    R.t = R.t + compress[r]
    held = _pass(R, seg_bytes, r.copy(), lambda i: (r - i - 1) % n, hop)           # reduce-scatter
    R.t = R.t + decompress[(r + 1) % n]
    _pass(R, seg_bytes, held, lambda i: (r - i) % n, decompress)                      # all-gather
    return R.t


def _pass(R: Ranks, seg_bytes, held, segment, cost) -> np.ndarray:
    """One ring pass of n - 1 steps: each rank posts the receive of ``segment(i)``, sends what it holds,
    pays ``cost`` of the segment it got once both its receive and its send are done; returns what each
    rank holds at the end."""
    for i in range(len(seg_bytes) - 1):
        seg = segment(i)
        R.post(seg_bytes[seg])
        sent = R.send(seg_bytes[held])
        R.wait(sent)
        R.t = R.t + cost[seg]
        R.wait_sent(sent)
        held = seg
    return held


def additive_ring(p: Pieces, link: Link, start=None) -> np.ndarray:
    """:func:`ring.additive_allreduce_` (Algorithm 1 with pieces): receives posted before compressing,
    payloads added, each piece forwarded on arrival; decompression of held pieces while later ones travel."""
    n, P = p.present.shape
    R, r = Ranks(n, link, start), np.arange(n)
    prev = []
    for j in range(P):                                   # own segment: compress, send each piece
        have = p.present[r, j]
        R.t = R.t + have * p.compress[r, j]
        prev.append(R.send(p.nbytes[r, j], have))
    for i in range(n - 1):
        seg = (r - i - 1) % n
        for j in range(P):
            R.post(p.nbytes[seg, j], p.present[seg, j])
        cur = []
        for j in range(P):
            have = p.present[seg, j]
            R.t = R.t + have * p.compress[seg, j]
            R.wait(prev[j])                              # the left's piece j of the same segment
            R.t = R.t + have * p.add[seg, j]
            cur.append(R.send(p.nbytes[seg, j], have) if i < n - 2 else None)
        prev = cur if i < n - 2 else prev
    return _allgather(p, R, (r + 1) % n)


def _allgather(p: Pieces, R: Ranks, held: np.ndarray) -> np.ndarray:
    """Phase 2 of Algorithm 1; pending decompressions kept per rank as a FIFO of costs."""
    n, P = p.present.shape
    r = np.arange(n)
    queue = np.zeros((n, P * (n + 1)))                   # decompress cost of each pending piece, in order
    head, tail = np.zeros(n, int), np.zeros(n, int)
    prev = []
    for j in range(P):
        have = p.present[held, j]
        prev.append(R.send(p.nbytes[held, j], have))
        queue[r, tail] = p.decompress[held, j]
        tail = tail + have
    count = p.present.sum(axis=1)
    for i in range(n - 1):
        seg = (r - i) % n
        for j in range(P):
            R.post(p.nbytes[seg, j], p.present[seg, j])
        cur = []
        for j in range(P):
            have = p.present[seg, j]
            arrival = np.where(have, np.roll(prev[j], 1), NEVER)
            while True:                              # decompress while the piece is still on the wire
                busy = have & (head < tail) & ((arrival > R.t) | (tail - head > 2 * count[seg]))
                if not busy.any():
                    break
                R.t = R.t + busy * queue[r, np.minimum(head, queue.shape[1] - 1)]
                head = head + busy
            R.t = np.maximum(R.t, arrival)
            cur.append(R.send(p.nbytes[seg, j], have) if i < n - 2 else None)
            queue[r, tail] = np.where(have, p.decompress[seg, j], 0.0)
            tail = tail + have
        prev = cur if i < n - 2 else prev
    rest = np.array([queue[k, head[k]:tail[k]].sum() for k in range(n)])
    return np.maximum(R.t + rest, R.last_sent)          # then every send handle is waited for


def sparse_message_bytes(kept: np.ndarray, lengths: np.ndarray, ranks: int) -> np.ndarray:
    """Per segment, the bytes of a chunk (header + body) holding ``ranks`` ranks' entries, each rank's
    ``kept`` entries of the segment assumed on a support disjoint from the others' (an upper bound: a
    union of h ranks holds min(h k, L) entries, dense from 1/2 on; identical supports would keep k)."""
    pairs = np.minimum(ranks * np.asarray(kept, float), lengths).round().astype(int)
    return np.array([message_bytes(int(p), int(L)) for p, L in zip(pairs, lengths)], float)


def sparse_traffic(kept: np.ndarray, lengths: np.ndarray, n: int) -> tuple[float, int]:
    """(bytes a rank of :func:`sparse_ring` sends on average, messages it sends): each segment's chunk
    goes N - 1 times in the reduce-scatter (holding 1 .. N - 1 ranks' entries) and N - 1 times whole."""
    total = sum(sparse_message_bytes(kept, lengths, h).sum() for h in range(1, n))
    total += (n - 1) * sparse_message_bytes(kept, lengths, n).sum()
    return float(total) / max(n, 1), 4 * (n - 1)


def sparse_ring(kept, lengths, compress: float, merge: np.ndarray, write: float, link: Link,
                start=None) -> np.ndarray:
    """:func:`gvq.comm.ring_sparse.sparse_allreduce_`: compress the whole vector once; every hop a header
    then a body each way (:func:`sparse_message_bytes`: disjoint supports); a reduce-scatter hop merges
    the chunk that arrived (``merge``, one cost per segment); at the end every chunk is written back."""
    lengths = np.asarray(lengths, float)
    n = len(lengths)
    R, r = Ranks(n, link, start), np.arange(n)
    R.t = R.t + compress

    def hop(out, inc, ranks):
        body = sparse_message_bytes(kept, lengths, ranks) - HEADER_BYTES
        for nbytes in (np.full(n, float(HEADER_BYTES)), body):
            R.post(nbytes[inc])
            sent = R.send(nbytes[out])
            R.wait(sent)
            R.wait_sent(sent)
    for i in range(n - 1):
        out, inc = (r - i) % n, (r - i - 1) % n
        hop(out, inc, i + 1)
        R.t = R.t + np.asarray(merge)[inc]
    for i in range(n - 1):
        hop((r + 1 - i) % n, (r - i) % n, n)
    return R.t + write


def gather_ring(nbytes: float, compress: float, decompress: float, add: float, link: Link,
                n: int, start=None) -> np.ndarray:
    """:func:`ring.gather_allreduce_` (allgather): compress once, forward N - 1 payloads, decode and sum N."""
    R = Ranks(n, link, start)
    R.t = R.t + compress
    for _ in range(n - 1):
        R.post(np.full(n, nbytes))
        sent = R.send(np.full(n, nbytes))
        R.wait(sent)
        R.wait_sent(sent)
    return R.t + n * decompress + (n - 1) * add


def through_server(nbytes: float, compress: float, decompress: float, add: float, link: Link,
                   n: int, start=None) -> np.ndarray:
    """``topology=ps``: every rank sends to rank 0, which decodes, sums, re-encodes and sends N - 1 copies
    on its one link (FIFO); everyone decodes the result."""
    wire, msg = 8.0 * nbytes / link.bps, float(link.post_cost(nbytes))
    t = np.full(n, compress) + (0.0 if start is None else float(np.max(start)))
    worker_arrival = t[1:] + msg + wire + link.alpha                  # each worker on its own link
    t[1:] = np.maximum(t[1:] + msg, worker_arrival) + msg             # send waited for, receive posted
    t0 = max(t[0] + (n - 1) * msg, float(worker_arrival.max()) if n > 1 else 0.0)
    t0 += n * decompress + (n - 1) * add + compress                   # decode, sum, re-encode
    free = -np.inf
    for k in range(1, n):
        t0 += msg
        free = max(t0, free) + wire
        t[k] = max(t[k], free + link.alpha)
    t[0] = max(t0, free + link.alpha) if n > 1 else t0               # its sends waited for
    return t + decompress
