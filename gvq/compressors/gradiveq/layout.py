"""GradiVeQ's view of the flat gradient: conv flattening (Fig. 3a), slices of K, compressor groups.

See docs/design.md#gvqcompressorsgradiveqlayoutpy for how it works and why.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor


def is_conv(shape: tuple[int, ...]) -> bool:
    return len(shape) == 4


#: which parameters GradiVeQ compresses (the rest travel raw): ``conv`` the paper's conv kernels only;
#: ``rows`` the conv kernels and every 2-D weight (a Linear's (out, in) or an embedding's (V, width)) as
#: its rows, slices of length ``in``; ``auto`` the conv kernels where the model has any, else the rows
#: (a transformer has no conv, and would otherwise travel uncompressed)
MATRICES = ("auto", "conv", "rows")


def resolve_matrices(shapes, matrices: str) -> str:
    """``conv`` or ``rows``: ``auto`` decided on the whole model's shapes (a DDP bucket's codec inherits the
    decision, so a bucket of only 2-D weights in a CNN is not sliced where the whole codec would not)."""
    if matrices == "auto":
        return "conv" if any(is_conv(s) for s in shapes) else "rows"
    return matrices


def compressed_layers(shapes, matrices: str) -> list[int]:
    """The positions of the parameters GradiVeQ compresses under ``matrices`` (see :data:`MATRICES`)."""
    rows = resolve_matrices(shapes, matrices) == "rows"
    return [i for i, s in enumerate(shapes) if is_conv(s) or (rows and len(s) == 2)]


class GradLayout:
    """Offsets of every parameter in the flat vector, and the (bijective) flatten / unflatten."""

    def __init__(self, shapes):
        self.shapes = [tuple(int(v) for v in s) for s in shapes]
        self.offsets, off = [], 0
        for s in self.shapes:
            self.offsets.append(off)
            off += math.prod(s)
        self.numel = off

    def _check(self, tensors) -> None:
        if len(tensors) != len(self.shapes):
            raise ValueError(f"GradLayout: got {len(tensors)} tensors for {len(self.shapes)} shapes")

    def flatten(self, grads: list[Tensor], out: Tensor | None = None) -> Tensor:
        """Concatenate ``grads`` (paper order for conv weights) into ``out`` (allocated if None)."""
        self._check(grads)
        if out is None:
            out = torch.empty(self.numel, dtype=grads[0].dtype, device=grads[0].device)
        for g, shape, off in zip(grads, self.shapes, self.offsets):
            n = g.numel()
            if is_conv(shape):
                f, d, h, w = shape
                # one copy straight into place: no intermediate contiguous tensor, no torch.cat
                out[off: off + n].view(h, w, d, f).copy_(g.permute(2, 3, 1, 0))
            else:
                out[off: off + n].copy_(g.reshape(-1))
        return out

    def unflatten(self, flat: Tensor, out: list[Tensor]) -> None:
        """Write ``flat`` back into the tensors ``out`` (e.g. every ``param.grad``), inverse of flatten."""
        self._check(out)
        for t, shape, off in zip(out, self.shapes, self.offsets):
            n = t.numel()
            if is_conv(shape):
                f, d, h, w = shape
                t.copy_(flat[off: off + n].view(h, w, d, f).permute(3, 2, 0, 1))
            else:
                t.copy_(flat[off: off + n].view_as(t))


def parse_K(K) -> tuple[str, int]:
    """Validate the K config: 'auto' -> ('auto', 0), 'x3' -> ('x', 3), 768 or '768' -> ('int', 768)."""
    bad = ValueError(f"K={K!r}: must be 'auto', 'x<m>' with an int m >= 1, or a positive int")
    if isinstance(K, bool):
        raise bad
    if isinstance(K, int):
        if K < 1:
            raise bad
        return "int", K
    if isinstance(K, str):
        k = K.strip().lower()
        if k == "auto":
            return "auto", 0
        if k.isdigit() and int(k) >= 1:
            return "int", int(k)
        if k.startswith("x") and k[1:].isdigit() and int(k[1:]) >= 1:
            return "x", int(k[1:])
    raise bad


def resolve_K(spec: tuple[str, int], K_raw, layer: int, shape: tuple[int, ...]) -> int:
    """Slice size of layer ``layer`` under the parsed K rule: a conv's (F, D, H, W) as Fig. 3a flattens
    it; a 2-D weight (out, in) as its rows (auto: one row; x<m>: m rows)."""
    if len(shape) == 2:
        row = shape[1]
        if spec[0] == "int" and spec[1] % row:
            raise ValueError(f"K={K_raw}: must be a multiple of a row ({row}) for layer {layer} shape {tuple(shape)}")
        return {"auto": row, "x": spec[1] * row, "int": spec[1]}[spec[0]]
    f, d, _, w = shape
    kind, m = spec
    if kind == "auto":
        return f * d * w
    if kind == "x":
        return m * f * d
    if m % (f * d):
        raise ValueError(f"K={K_raw}: must be a multiple of F*D={f * d} for layer {layer} shape "
                         f"{tuple(shape)}")
    return m


def check_config(lam, s, pool, d, target_ratio, mu, matrices="auto") -> float:
    """One-line ValueErrors naming the user-facing key; returns s as float (inf allowed)."""
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0.0 <= lam < 1.0:
        raise ValueError(f"lambda={lam!r}: must be in [0, 1)")
    s_val = float("inf") if isinstance(s, str) and s.strip().lower() in ("inf", ".inf") else s
    if (isinstance(s_val, bool) or not isinstance(s_val, (int, float)) or not s_val >= 1
            or (not math.isinf(s_val) and s_val != int(s_val))):
        raise ValueError(f"s={s!r}: must be an integer >= 1 or inf")
    if not isinstance(pool, bool):
        raise ValueError(f"pool={pool!r}: must be true or false")
    if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
        raise ValueError(f"d={d!r}: must be an integer >= 1 or null")
    if target_ratio is not None and (isinstance(target_ratio, bool)
                                     or not isinstance(target_ratio, (int, float)) or not target_ratio > 1):
        raise ValueError(f"target_ratio={target_ratio!r}: must be a number > 1 or null")
    if d is not None and target_ratio is not None:
        raise ValueError(f"d={d}, target_ratio={target_ratio}: set at most one of them")
    if mu not in ("slice", "group"):
        raise ValueError(f"mu={mu!r}: must be 'slice' or 'group'")
    if matrices not in MATRICES:
        raise ValueError(f"matrices={matrices!r}: must be one of {', '.join(MATRICES)}")
    return float(s_val)


@dataclass(frozen=True)
class Group:
    """s consecutive slices of one layer (a conv kernel, or a 2-D weight's rows) that share one PCA basis
    (U_d, per-slice mu)."""
    gid: int
    layer: int          # index of the parameter in the shapes list
    shape: tuple
    start: int          # flat offset of the group's first slice
    K: int
    n: int              # number of slices in the group
    tail: int           # raw tail of the layer (same for all its groups; informational)

    @property
    def stop(self) -> int:
        return self.start + self.n * self.K


def build_groups(layout: GradLayout, spec: tuple[str, int], K_raw, s: float, matrices: str = "auto") -> list[Group]:
    """All compressor groups, sorted by flat offset (validates K against every compressed layer first)."""
    groups: list[Group] = []
    for i in compressed_layers(layout.shapes, matrices):
        shape, off = layout.shapes[i], layout.offsets[i]
        K = resolve_K(spec, K_raw, i, shape)
        numel = math.prod(shape)
        n_slices, tail = numel // K, numel % K
        size = n_slices if math.isinf(s) else int(s)
        for first in range(0, n_slices, max(size, 1)):
            n = min(size, n_slices - first)
            groups.append(Group(len(groups), i, shape, off + first * K, K, n, tail))
    return groups


def layer_groups(groups: list[Group], layers: list[int]) -> list[int]:
    """The ids of the groups of ``layers`` (parameter positions), in the order ``layers`` lists them: the
    groups a codec bound to just those layers has, in its own order."""
    by_layer: dict[int, list[int]] = {}
    for g in groups:
        by_layer.setdefault(g.layer, []).append(g.gid)
    return [gid for i in layers for gid in by_layer.get(i, [])]


def cuts(groups: list[Group], numel: int) -> list[int]:
    """Every position outside groups, plus slice boundaries inside them.  Index bookkeeping that ends as a
    Python list, never gradient data: a host mask, whatever device the gradient lives on."""
    ok = torch.ones(numel + 1, dtype=torch.bool, device="cpu")
    for g in groups:
        ok[g.start + 1: g.stop] = False
        ok[g.start: g.stop + 1: g.K] = True
    return ok.nonzero().flatten().tolist()


class Piece(NamedTuple):
    """One run of a segment: raw values (gid = -1) or slices i0..i1 of group gid."""
    gid: int
    start: int          # flat offset where the run begins
    stop: int
    i0: int = 0
    i1: int = 0


def pieces(groups: list[Group], starts: list[int], seg: slice) -> list[Piece]:
    """Split ``seg`` into raw runs and group runs, in order; ends must lie on slice boundaries."""
    pos, end, out = seg.start, seg.stop, []
    j = max(bisect.bisect_right(starts, pos) - 1, 0)
    while pos < end:
        g = groups[j] if j < len(groups) else None
        if g is not None and pos >= g.stop:
            j += 1
            continue
        if g is None or pos < g.start:           # raw run up to the next group (or the segment end)
            stop = end if g is None else min(end, g.start)
            out.append(Piece(-1, pos, stop))
            pos = stop
            continue
        stop = min(end, g.stop)
        for p in (pos, stop):
            if (p - g.start) % g.K:
                raise ValueError(f"segment {seg.start}:{seg.stop}: end {p} lies inside a slice of layer "
                                 f"{g.layer} (K={g.K}); segment ends must lie on cuts(numel)")
        out.append(Piece(g.gid, pos, stop, (pos - g.start) // g.K, (stop - g.start) // g.K))
        pos = stop
    return out
