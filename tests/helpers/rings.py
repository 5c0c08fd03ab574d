"""Every ring mode of gvq/comm/ring.py run once on fixed per-rank inputs, for tests that compare two
transports (staged vs plain, batched vs plain) result for result."""
from __future__ import annotations

import torch

from gvq.aggregators.base import equal_segments
from gvq.comm import ring
from gvq.comm.clock import Stopwatch
from gvq.comm.p2p import P2P
from gvq.compressors.base import split_on_cuts
from gvq.compressors.powersgd import PowerSGD
from tests.helpers.toy_compressors import Half, Projection


def _x(rank: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 + rank))


def every_ring_mode(rank: int, world: int, p2p: P2P) -> list[torch.Tensor]:
    """Uncompressed RAR; Algorithm 1 with one piece a segment (the paper) and with several; the
    decode-add-encode ring; the all-gather and parameter-server topologies.  Returns each result."""
    out = []
    flat = _x(rank, 1001)
    ring.allreduce_(flat, equal_segments(1001, world), p2p)
    out.append(flat)
    comp = Projection()
    cuts = comp.cuts(64 * 3)
    whole = split_on_cuts(cuts, world)
    pieces = [[slice(a, b) for a, b in zip(cuts, cuts[1:]) if s.start <= a < s.stop] for s in whole]
    for segs in ([[s] for s in whole], pieces):
        flat = _x(rank, 64 * 3)
        ring.additive_allreduce_(flat, segs, comp, p2p, Stopwatch())
        out.append(flat)
    flat = _x(rank, 64)
    ring.reencode_allreduce_(flat, split_on_cuts(Half().cuts(64), world), Half(), p2p, Stopwatch())
    out.append(flat)
    for topology in ("allgather", "ps"):
        flat = _x(rank, 64)
        ring.gather_allreduce_(flat, Half(), p2p, Stopwatch(), topology)
        out.append(flat)
    return out


def powersgd_passes(lr: PowerSGD, x: torch.Tensor, segs: list[slice]) -> torch.Tensor:
    """Both passes over ``segs`` (a sum of one), as the ring runs them: all of P, then all of Q."""
    lr.begin()
    for s in segs:
        lr.p_stage.decompress(lr.p_stage.compress(x[s], s), s)
    out = torch.empty_like(x)
    for s in segs:
        out[s] = lr.q_stage.decompress(lr.q_stage.compress(x[s], s), s)
    return out
