"""The steps both schedules of GradiVeQ's Algorithm 1 share: the pipelined ring
(:func:`gvq.comm.ring.additive_allreduce_`) and the step-batched one (:mod:`gvq.comm.ring_batched`).

Both schedules add this rank's compressed share to a partial sum, and decode a summed payload into the
flat vector, with these two functions, so they sum and decode the same way and their results agree.
"""
from __future__ import annotations

import torch

from gvq.comm.clock import Stopwatch
from gvq.comm.p2p import P2P
from gvq.compressors.base import Compressor


def add_own_share(flat: torch.Tensor, q: slice, inbox: torch.Tensor, recv, comp: Compressor, p2p: P2P,
                  stopwatch: Stopwatch) -> None:
    """This rank's compressed piece ``q`` added to the partial sum arriving for it in ``inbox``
    (compressed while ``recv`` is still on the wire)."""
    with stopwatch("compress"):
        mine = comp.compress(flat[q], q)
    p2p.wait(recv, p2p.left)
    with stopwatch("add"):
        inbox.add_(mine)


def decompress_into(flat: torch.Tensor, q: slice, payload: torch.Tensor, comp: Compressor,
                    stopwatch: Stopwatch) -> None:
    """Piece ``q`` of ``flat`` overwritten with the decoded (summed) ``payload``."""
    with stopwatch("decompress"):
        flat[q] = comp.decompress(payload, q)
