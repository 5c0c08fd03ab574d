"""GradiVeQ's ring segments: N segments of about equal *payload*, cut where the codec allows, so that no
segment (a raw classifier layer) is many times larger on the wire than the others."""
from __future__ import annotations

import torch

from gvq.compressors._segments import balanced_segments
from gvq.compressors.gradiveq.codec import GradiVeQ


def _payload_before(comp: GradiVeQ, numel: int) -> torch.Tensor:
    """Payload elements before every flat index (raw value = 1, value of a compressed slice = d/K)."""
    # a plan made once per fit and read on the host (cut positions), whatever device the codec runs on
    weight = torch.ones(numel, dtype=torch.float64, device="cpu")
    for g in comp.groups:
        weight[g.start: g.stop] = comp.basis(g.gid)[0].shape[1] / g.K
    return torch.cat([torch.zeros(1, dtype=torch.float64, device="cpu"), weight.cumsum(0)])


def payload_balanced_segments(comp: GradiVeQ, numel: int, n: int, pieces: int = 1) -> list:
    """N segments on ``comp.cuts`` with about equal *payload*: the ring's time is set by its largest
    segment, and raw layers (e.g. a classifier) would otherwise make one segment many times larger on
    the wire than the others.  ``pieces > 1``: each segment becomes a list of that many pieces cut on
    *group* boundaries where the segment has them (a basis is streamed from memory once per piece that
    touches its group, so a cut inside a group reads its K x d basis twice); pieces may then be uneven."""
    cuts = comp.cuts(numel)
    cum = _payload_before(comp, numel).tolist()             # a host plan: read once, indexed as a list
    segs = balanced_segments(cuts, n, [cum[i] for i in cuts])   # payload before each cut, non-decreasing
    if pieces == 1:
        return segs
    edges = sorted({0, numel} | {g.start for g in comp.groups} | {g.stop for g in comp.groups})
    out = []
    for seg in segs:
        inner = [seg.start] + [e for e in edges if seg.start < e < seg.stop] + [seg.stop]
        split = balanced_segments(inner, pieces, [cum[i] for i in inner])
        out.append([p for p in split if p.stop > p.start] or [seg])
    return out
