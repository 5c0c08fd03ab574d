"""The uncompressed ring's two halves, each on its own: :func:`gvq.comm.ring.allreduce_` is one after the
other; the hierarchical all-reduce (:mod:`gvq.comm.hierarchy`) runs them among a node's ranks, around the
ring across nodes."""
from __future__ import annotations

import functools
import threading

import torch

from gvq.comm import clock as rank_clock
from gvq.comm.p2p import P2P


def timed_alone(fn):
    """Virtual clock, ``net.exclusive``: a ring's own CPU (posting messages, adds, bookkeeping) is timed
    one rank at a time like its codec calls (waits release the host lock).  Time-sliced with 15 other
    ranks on a few cores it is billed for their cache and TLB refills, and a late step delays the whole
    chain, so the ring's time would swing from run to run."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with rank_clock.phase("ring"):
            return fn(*args, **kwargs)
    return run


def reduce_scatter_(flat: torch.Tensor, segs: list[slice], p2p: P2P) -> int:
    """(a)'s first half: after it, segment ``(rank + 1) % N`` of ``flat`` holds the sum over the ranks (the
    others partial sums); returns that segment's index."""
    n, r = p2p.world_size, p2p.rank
    bufs = _scratch(flat, segs)
    for i in range(n - 1):
        out, k = segs[(r - i) % n], (r - i - 1) % n
        recv, send = p2p.exchange(flat[out], p2p.right, bufs[k], p2p.left)
        p2p.wait(recv, p2p.left)
        flat[segs[k]] += bufs[k]
        p2p.wait(send, p2p.right)
    return (r + 1) % n


def allgather_(flat: torch.Tensor, segs: list[slice], p2p: P2P) -> None:
    """(a)'s second half: each rank's segment ``(rank + 1) % N`` to every rank, in place."""
    n, r = p2p.world_size, p2p.rank
    for i in range(n - 1):
        out, inc = segs[(r + 1 - i) % n], segs[(r - i) % n]
        recv, send = p2p.exchange(flat[out], p2p.right, flat[inc], p2p.left)
        p2p.wait(recv, p2p.left)
        p2p.wait(send, p2p.right)


#: per thread: two hook states (two models in one backward) run their rings at once on their own threads,
#: and buffers shared between them would receive each other's segments
_SCRATCH = threading.local()
_LAYOUTS = 4    # segment layouts kept a thread: a hierarchical all-reduce alternates between two (node, across)


def _scratch(flat: torch.Tensor, segs: list[slice]) -> list[torch.Tensor]:
    """Receive buffers per segment (by index: empty segments may share a start), reused across this
    thread's calls (segment-sized allocations cost page faults), a few layouts kept at once."""
    key = (flat.dtype, flat.device, tuple((s.start, s.stop) for s in segs))
    kept = getattr(_SCRATCH, "bufs", None)
    if kept is None:
        kept = _SCRATCH.bufs = {}
    if key not in kept:
        if len(kept) >= _LAYOUTS:
            kept.pop(next(iter(kept)))
        kept[key] = [torch.empty(s.stop - s.start, dtype=flat.dtype, device=flat.device) for s in segs]
    return kept[key]
