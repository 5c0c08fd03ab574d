"""The ring code's schedules replayed on a cost model, every rank at once (numpy arrays over ranks).

Each function follows one function of :mod:`gvq.comm.ring` statement by statement -- the same steps,
messages, waits and codec calls in the same order -- with costs instead of work, and the link model of
:class:`gvq.comm.p2p.VirtualLink`: one outgoing FIFO link per rank; a message handed over at t on a link
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

NEVER = -np.inf


@dataclass
class Link:
    bps: float
    alpha: float = 0.0
    msg: float = 0.0                        # CPU seconds to post one send or one receive


@dataclass
class Pieces:
    """Per segment s and piece j (shape N x P): codec costs (s) and payload bytes; ``present`` marks
    the pieces that exist (segments have up to P)."""
    compress: np.ndarray
    decompress: np.ndarray
    add: np.ndarray
    nbytes: np.ndarray
    present: np.ndarray


class _Ranks:
    """Every rank's clock and link; ``send`` hands a message per rank to its link, returns arrivals."""

    def __init__(self, n: int, link: Link, start=None):
        self.n, self.link = n, link
        self.t = np.zeros(n) if start is None else np.array(start, dtype=float)
        self.free = np.full(n, NEVER)

    def send(self, nbytes: np.ndarray, mask=True) -> np.ndarray:
        real = (np.asarray(nbytes) > 0) & mask
        self.t = self.t + real * self.link.msg
        start = np.maximum(self.t, self.free)
        end = start + 8.0 * np.asarray(nbytes, dtype=float) / self.link.bps
        self.free = np.where(real, end, self.free)
        return np.where(real, end + self.link.alpha, NEVER)

    def post(self, nbytes: np.ndarray, mask=True) -> None:
        self.t = self.t + ((np.asarray(nbytes) > 0) & mask) * self.link.msg

    def wait(self, sent_by_left: np.ndarray) -> None:
        self.t = np.maximum(self.t, np.roll(sent_by_left, 1))


def plain_ring(seg_bytes: np.ndarray, add: np.ndarray, link: Link, start=None) -> np.ndarray:
    """:func:`ring.allreduce_`: N - 1 reduce-scatter steps (send, wait, add), N - 1 all-gather steps."""
    n = len(seg_bytes)
    R, r = _Ranks(n, link, start), np.arange(n)
    for i in range(n - 1):
        out, inc = (r - i) % n, (r - i - 1) % n
        R.post(seg_bytes[inc])
        R.wait(R.send(seg_bytes[out]))
        R.t = R.t + add[inc]
    for i in range(n - 1):
        out, inc = (r + 1 - i) % n, (r - i) % n
        R.post(seg_bytes[inc])
        R.wait(R.send(seg_bytes[out]))
    return R.t


def reencode_ring(seg_bytes, compress, decompress, add, link: Link, start=None) -> np.ndarray:
    """:func:`ring.reencode_allreduce_`: every hop decompresses, adds, recompresses (nothing overlaps)."""
    n = len(seg_bytes)
    R, r = _Ranks(n, link, start), np.arange(n)
    R.t = R.t + compress[r]
    held = r.copy()
    for i in range(n - 1):
        seg = (r - i - 1) % n
        R.post(seg_bytes[seg])
        R.wait(R.send(seg_bytes[held]))
        R.t = R.t + decompress[seg] + add[seg] + compress[seg]
        held = seg
    R.t = R.t + decompress[(r + 1) % n]
    for i in range(n - 1):
        seg = (r - i) % n
        R.post(seg_bytes[seg])
        R.wait(R.send(seg_bytes[held]))
        R.t = R.t + decompress[seg]
        held = seg
    return R.t


def additive_ring(p: Pieces, link: Link, start=None) -> np.ndarray:
    """:func:`ring.additive_allreduce_` (Algorithm 1 with pieces): receives posted before compressing,
    payloads added, each piece forwarded on arrival; decompression of held pieces while later ones travel."""
    n, P = p.present.shape
    R, r = _Ranks(n, link, start), np.arange(n)
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


def _allgather(p: Pieces, R: _Ranks, held: np.ndarray) -> np.ndarray:
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
    return R.t + rest


def gather_ring(nbytes: float, compress: float, decompress: float, add: float, link: Link,
                n: int, start=None) -> np.ndarray:
    """:func:`ring.gather_allreduce_` (allgather): compress once, forward N - 1 payloads, decode and sum N."""
    R = _Ranks(n, link, start)
    R.t = R.t + compress
    for _ in range(n - 1):
        R.post(np.full(n, nbytes))
        R.wait(R.send(np.full(n, nbytes)))
    return R.t + n * decompress + (n - 1) * add


def through_server(nbytes: float, compress: float, decompress: float, add: float, link: Link,
                   n: int, start=None) -> np.ndarray:
    """``topology=ps``: every rank sends to rank 0, which decodes, sums, re-encodes and sends N - 1 copies
    on its one link (FIFO); everyone decodes the result."""
    wire = 8.0 * nbytes / link.bps
    t = np.full(n, compress) + (0.0 if start is None else float(np.max(start)))
    worker_arrival = compress + link.msg + wire + link.alpha          # each worker on its own link
    t[1:] += 2 * link.msg                                             # its send and its receive posted
    t0 = t[0] + max((n - 1) * link.msg, worker_arrival - compress if n > 1 else 0.0)
    t0 += n * decompress + (n - 1) * add + compress                   # decode, sum, re-encode
    free = -np.inf
    for k in range(1, n):
        t0 += link.msg
        free = max(t0, free) + wire
        t[k] = max(t[k], free + link.alpha)
    t[0] = t0
    return t + decompress
