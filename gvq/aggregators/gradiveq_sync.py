"""Helpers of :mod:`gvq.aggregators.gradiveq`: making every rank hold the same PCA state, payload-balanced
ring segments, and the per-refresh layer log.

See docs/design.md#gvqaggregatorsgradiveq_syncpy for how it works and why.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
import torch.distributed as dist

from gvq.comm.p2p import P2P
from gvq.compressors._segments import balanced_segments
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


def _payload_before(comp: GradiVeQ, numel: int) -> torch.Tensor:
    """Payload elements before every flat index (raw value = 1, value of a compressed slice = d/K)."""
    weight = torch.ones(numel, dtype=torch.float64)
    for g in comp.groups:
        weight[g.start: g.stop] = comp.basis(g.gid)[0].shape[1] / g.K
    return torch.cat([torch.zeros(1, dtype=torch.float64), weight.cumsum(0)])


def payload_balanced_segments(comp: GradiVeQ, numel: int, n: int, pieces: int = 1) -> list:
    """N segments on ``comp.cuts`` with about equal *payload*: the ring's time is set by its largest
    segment, and raw layers (e.g. a classifier) would otherwise make one segment many times larger on
    the wire than the others.  ``pieces > 1``: each segment becomes a list of that many pieces cut on
    *group* boundaries where the segment has them (a basis is streamed from memory once per piece that
    touches its group, so a cut inside a group reads its K x d basis twice); pieces may then be uneven."""
    cuts = comp.cuts(numel)
    cum = _payload_before(comp, numel)
    at = cum[torch.tensor(cuts)].tolist()                  # payload before each cut, non-decreasing
    segs = balanced_segments(cuts, n, at)
    if pieces == 1:
        return segs
    edges = sorted({0, numel} | {g.start for g in comp.groups} | {g.stop for g in comp.groups})
    out = []
    for seg in segs:
        inner = [seg.start] + [e for e in edges if seg.start < e < seg.stop] + [seg.stop]
        split = balanced_segments(inner, pieces, cum[torch.tensor(inner)].tolist())
        out.append([p for p in split if p.stop > p.start] or [seg])
    return out


def write_layer_stats(run_dir: str | None, comp: GradiVeQ, extra: dict) -> None:
    """Append one JSON line per compressor group (layer, K, d, K/d, energy, ...) to
    ``<run_dir>/gradiveq_layers.jsonl``; no run dir (tests, library use) -> nothing written."""
    if run_dir is None:
        return
    with open(Path(run_dir) / "gradiveq_layers.jsonl", "a") as f:
        for st in comp.layer_stats():
            row = {**extra, **st, "shape": list(st["shape"])}
            f.write(json.dumps(row) + "\n")
