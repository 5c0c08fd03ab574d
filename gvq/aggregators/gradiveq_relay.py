"""Making every rank hold the same GradiVeQ PCA state: each fits, digests are compared, rank 0's state is
relayed along the ring only on a mismatch.

See docs/design.md#gvqaggregatorsgradiveq_relaypy for how it works and why.
"""
from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from gvq.comm.p2p import P2P
from gvq.compressors.gradiveq.codec import GradiVeQ
from gvq.compressors.gradiveq.state import PCAState, value_count

log = logging.getLogger("gvq")
CHUNK = 1 << 18     # relay chunk (floats): small enough to pipeline, large enough to amortise latency


def relay_(t: torch.Tensor, p2p: P2P, chunk: int = CHUNK) -> None:
    """Overwrite ``t`` on every rank with rank 0's ``t``, forwarded along the ring in chunks."""
    n, r = p2p.world_size, p2p.rank
    if n == 1 or t.numel() == 0:
        return
    send = None
    for piece in t.split(chunk):
        if r != 0:
            p2p.wait(p2p.irecv(piece, p2p.left), p2p.left)
        if send is not None:
            p2p.wait(send, p2p.right)
        send = p2p.isend(piece, p2p.right) if r != n - 1 else None
    if send is not None:
        p2p.wait(send, p2p.right)


def relay_state(comp: GradiVeQ, p2p: P2P, device) -> None:
    """Rank 0's fitted state onto every rank (rank 0 reloads its own, so all take the same path);
    receive buffers on ``device`` (the samples', i.e. the gradient's)."""
    if p2p.rank == 0:
        ds, vals = comp.pca.tensors()
    else:
        ds = torch.empty(len(comp.groups), dtype=torch.int64, device=device)   # count fixed by the layout
    relay_(ds, p2p)
    if p2p.rank != 0:
        vals = torch.empty(value_count(comp.groups, ds), dtype=torch.float32, device=ds.device)
    relay_(vals, p2p)
    comp.load_pca(PCAState.from_tensors(ds, vals, comp.groups))


def fit_everywhere(comp: GradiVeQ, samples: torch.Tensor, p2p: P2P) -> bool:
    """Every rank fits; rank 0's state is relayed only if the digests differ.  Returns True when the
    relay was needed."""
    comp.fit(samples)
    if p2p.world_size == 1:
        return False
    h = comp.pca.digest
    both = torch.tensor([h, -h], dtype=torch.int64)
    p2p.all_reduce(both, op=dist.ReduceOp.MAX)              # max == -min  <=>  all digests equal
    if int(both[0]) == -int(both[1]):
        return False
    log.warning("gradiveq: PCA state differs between ranks after a local fit; relaying rank 0's")
    relay_state(comp, p2p, samples.device)
    return True
