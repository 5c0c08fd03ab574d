"""Algorithm 1 (the compressed-domain ring, :func:`gvq.comm.ring.additive_allreduce_`) for batched
transports (NCCL): each ring step's messages posted together, one ``batch_isend_irecv`` a step.

Why a second schedule: the pipelined ring posts its receives ahead and forwards each piece the moment it
is complete.  NCCL runs the operations between two ranks in order on one stream, so at N = 2 (left and
right are the same peer) a send can queue behind a receive the peer has not matched yet, and both ranks
wait.  Here step i sends every piece this rank holds and receives every piece of the left neighbour's,
in one batch; the compression the step needs (this rank's share of the incoming segment) runs while
they travel, as do the previous step's decompressions in the all-gather (NCCL is asynchronous on the
GPU).  It gives up Algorithm 1's cut-through (a piece waits for its step), not its overlap.  The sums
are the pipelined ring's, in the same order: bitwise equal results (``tests/comm/test_ring_batched.py``).
"""
from __future__ import annotations

import torch

from gvq.comm.clock import Stopwatch
from gvq.comm.p2p import P2P
from gvq.comm.ring_steps import add_own_share, decompress_into
from gvq.compressors.base import Compressor


def additive_steps_(flat: torch.Tensor, segs: list[list[slice]], comp: Compressor, p2p: P2P,
                    clock: Stopwatch) -> None:
    """Reduce-scatter then all-gather of compressed pieces, in place in ``flat`` (N >= 2)."""
    n, r = p2p.world_size, p2p.rank
    with clock("compress"):
        held = [comp.compress(flat[q], q) for q in segs[r]]
    for i in range(n - 1):                           # reduce-scatter: add mine to what arrives
        pieces = segs[(r - i - 1) % n]
        inboxes = [comp.empty_payload(q, flat.device) for q in pieces]
        recvs, sends = p2p.exchange_all(held, p2p.right, inboxes, p2p.left)
        for q, inbox, recv in zip(pieces, inboxes, recvs):
            add_own_share(flat, q, inbox, recv, comp, p2p, clock)
        _wait(p2p, sends)
        held = inboxes                               # after the last step: segment r + 1, summed
    pending = list(zip(segs[(r + 1) % n], held))
    for i in range(n - 1):                           # all-gather: forward, decode the last step's
        pieces = segs[(r - i) % n]
        inboxes = [comp.empty_payload(q, flat.device) for q in pieces]
        recvs, sends = p2p.exchange_all(held, p2p.right, inboxes, p2p.left)
        _decode(flat, pending, comp, clock)
        _wait(p2p, recvs)
        _wait(p2p, sends)
        pending, held = list(zip(pieces, inboxes)), inboxes
    _decode(flat, pending, comp, clock)


def _wait(p2p: P2P, handles: list) -> None:
    for h in handles:
        p2p.wait(h)


def _decode(flat: torch.Tensor, pending: list, comp: Compressor, clock: Stopwatch) -> None:
    for q, payload in pending:
        decompress_into(flat, q, payload, comp, clock)

