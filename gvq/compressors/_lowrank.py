"""PowerSGD's state laid out for whole-tensor passes: every block's Q, P^ and raw sums stacked per shape
class (:class:`Store`), and per ring segment one gather into class-major order, views for one batched GEMM
/ QR per class and one put-back (:class:`SegLayout`), so a pass is a fixed few ops whatever the depth.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor


@dataclass(frozen=True)
class Block:
    """One parameter's span of the flat gradient and how it travels."""
    start: int
    stop: int
    rows: int
    cols: int
    rank: int            # 0: sent raw (uncompressed) in pass P

    @property
    def p_len(self) -> int:
        return self.rows * self.rank if self.rank else self.stop - self.start

    @property
    def q_len(self) -> int:
        return self.cols * self.rank


class Store:
    """Every block's Q, P^ and raw sums, stacked per shape class (rows, cols, rank): a class's blocks are
    one (count, ., .) tensor, so a pass runs one batched GEMM / QR per class, not one per parameter.  A
    DDP bucket's plan (:meth:`PowerSGD.subset`) shares it: each block's state lives in one place."""

    def __init__(self, blocks: list[Block], dtype: torch.dtype, device: torch.device = torch.device("cpu")):
        self.keys: list[tuple[int, int, int]] = []      # (rows, cols, rank) per class
        self.slot: dict[int, tuple[int, int]] = {}      # block -> (class, place in the class)
        self.raw_at: dict[int, int] = {}                # raw block -> its first value in ``raw``
        counts, n_raw = [], 0
        for i, b in enumerate(blocks):
            if b.rank:
                key = (b.rows, b.cols, b.rank)
                if key not in self.keys:
                    self.keys.append(key)
                    counts.append(0)
                c = self.keys.index(key)
                self.slot[i] = (c, counts[c])
                counts[c] += 1
            else:
                self.raw_at[i] = n_raw
                n_raw += b.stop - b.start
        self.counts = counts
        self.q = [torch.zeros(n, cols, r, dtype=dtype, device=device) for (_, cols, r), n in zip(self.keys, counts)]
        self.phat = [torch.zeros(n, rows, r, dtype=dtype, device=device) for (rows, _, r), n in zip(self.keys, counts)]
        self.raw = torch.zeros(n_raw, dtype=dtype, device=device)   # a pass moves it to its input's device (to)
        self.version = 0                               # bumped when the tensors move: views are rebuilt

    def to(self, device: torch.device) -> None:
        if self.raw.device != device:
            self.q = [t.to(device) for t in self.q]
            self.phat = [t.to(device) for t in self.phat]
            self.raw = self.raw.to(device)
            self.version += 1


class Views(NamedTuple):
    """One GEMM's operands: a run of one class's blocks with consecutive places in the store, within one
    segment, as (k, ., .) views of the segment's buffers and of the store."""
    m: Tensor            # (k, rows, cols) the values M, class-major
    mt: Tensor           # M^T
    o: Tensor            # (k, rows, cols) the output P^ (sum Q)^T
    p: Tensor            # (k, rows, r) the P payload
    qb: Tensor           # (k, cols, r) the Q payload
    qbt: Tensor          # its transpose
    q: Tensor            # (k, cols, r) the store's Q of these blocks
    phat: Tensor         # (k, rows, r) the store's P^
    r: Tensor            # (k, r, r) scratch for QR's R


def runs(items: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """(key, start, length) items sorted by (key, start), merged while one starts where the last ended:
    (key, start, total length) per run."""
    out: list[tuple[int, int, int]] = []
    for key, start, n in items:
        if out and out[-1][0] == key and out[-1][1] + out[-1][2] == start:
            out[-1] = (key, out[-1][1], out[-1][2] + n)
        else:
            out.append((key, start, n))
    return out


class SegLayout:
    """One segment's order and buffers: its values gathered class-major (each class's blocks by their
    place in the store, then the raw blocks) by ONE index, P and Q payloads laid out the same way, the
    output put back in segment order by one inverse index; every view a pass needs is made once here.
    ``lr``: the :class:`~gvq.compressors.powersgd.PowerSGD` plan whose segment it is."""

    def __init__(self, lr, seg: slice, device: torch.device):
        st, found = lr.store, lr.blocks_in(seg)
        low = sorted((st.slot[lr.ids[j]], b) for j, b in found if b.rank)
        raw = sorted((st.raw_at[lr.ids[j]], b.stop - b.start, b) for j, b in found if not b.rank)
        order = [b for _, b in low] + [b for *_, b in raw]
        host = torch.device("cpu")           # planned once per segment on the host, then moved below
        perm = torch.cat([torch.arange(b.start - seg.start, b.stop - seg.start, device=host) for b in order] or
                         [torch.zeros(0, dtype=torch.long, device=host)])
        self.perm, self.inv = perm.to(device), torch.argsort(perm).to(device)
        n, dt = seg.stop - seg.start, lr.dtype
        self.g, self.o = (torch.empty(n, dtype=dt, device=device) for _ in range(2))
        self.p = torch.empty(sum(b.p_len for b in order), dtype=dt, device=device)
        self.qb = torch.empty(sum(b.q_len for _, b in low), dtype=dt, device=device)
        self.groups, v, pa, qa = [], 0, 0, 0
        for c, a, k in runs([(c, place, 1) for (c, place), _ in low]):
            rows, cols, r = st.keys[c]
            self.groups.append(self._views(st, c, a, k, (v, pa, qa)))
            v, pa, qa = v + k * rows * cols, pa + k * rows * r, qa + k * cols * r
        self.p_low, self.p_raw, self.g_raw, self.o_raw = self.p[:pa], self.p[pa:], self.g[v:], self.o[v:]
        self.raws = [st.raw[at: at + k] for _, at, k in runs([(0, at, k) for at, k, _ in raw])]
        self.zeros = torch.zeros((), dtype=dt, device=device).expand(n)
        self.version = st.version

    def _views(self, st: Store, c: int, a: int, k: int, at: tuple[int, int, int]) -> Views:
        (rows, cols, r), (v, pa, qa) = st.keys[c], at
        m = self.g[v: v + k * rows * cols].view(k, rows, cols)
        qb = self.qb[qa: qa + k * cols * r].view(k, cols, r)
        return Views(m, m.transpose(1, 2), self.o[v: v + k * rows * cols].view(k, rows, cols),
                     self.p[pa: pa + k * rows * r].view(k, rows, r), qb, qb.transpose(1, 2),
                     st.q[c][a: a + k], st.phat[c][a: a + k], torch.empty(k, r, r, dtype=m.dtype, device=m.device))

    def put_raws(self, src: Tensor) -> None:
        """The store's raw runs of this segment <- ``src`` (their values end to end): one copy a run."""
        at = 0
        for run in self.raws:
            run.copy_(src[at: at + run.numel()])
            at += run.numel()

    def take_raws(self, dst: Tensor) -> None:
        """``dst`` <- the store's raw runs of this segment, end to end."""
        if len(self.raws) == 1:
            dst.copy_(self.raws[0])
        elif self.raws:
            torch.cat(self.raws, out=dst)
