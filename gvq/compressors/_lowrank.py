"""PowerSGD's state laid out for whole-tensor passes: every block's Q, P^ and raw sums stacked per shape
class (:class:`Store`), and per ring segment one gather into class-major order, views for one batched GEMM
/ QR per class and one put-back (:class:`SegLayout`), so a pass is a fixed few ops whatever the depth.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from gvq.compressors._kernels import TORCH, TRITON, Op, launch_kernel, triton_pow2

BLOCK = 1024            # values a program of the Triton path's unpacking and Q copy handles


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
        self.first = [sum(counts[:c]) for c in range(len(counts))]   # each class's first row in the stacks
        n, rows, cols, r = sum(counts), *(max((k[i] for k in self.keys), default=1) for i in range(3))
        # stacked and zero-padded to the largest shape: one orthogonalization serves every class
        self.q_all = torch.zeros(n, cols, r, dtype=dtype, device=device)
        self.phat_all = torch.zeros(n, rows, r, dtype=dtype, device=device)
        self.raw = torch.zeros(n_raw, dtype=dtype, device=device)   # a pass moves it to its input's device (to)
        self.version = 0                               # bumped when the tensors move: views are rebuilt
        self._views()

    def _views(self) -> None:
        """Each class's (count, cols, r) Q and (count, rows, r) P^: views of the padded stacks."""
        spans = [(f, f + n, key) for f, n, key in zip(self.first, self.counts, self.keys)]
        self.q = [self.q_all[a:b, :cols, :r] for a, b, (_, cols, r) in spans]
        self.phat = [self.phat_all[a:b, :rows, :r] for a, b, (rows, _, r) in spans]

    def to(self, device: torch.device) -> None:
        if self.raw.device != device:
            self.q_all, self.phat_all = self.q_all.to(device), self.phat_all.to(device)
            self.raw = self.raw.to(device)
            self._views()
            self.version += 1


class OrthWork:
    """One batched orthogonalization's buffers, (k, n, r) zero-padded, with every view made once, so that
    a call is products and factorizations only.  :meth:`run` is shifted Cholesky QR3 (Fukaya et al., SIAM
    J. Sci. Comput. 2020): QR through the r x r Gram matrix, so a GPU runs batched GEMMs and tiny
    factorizations instead of Householder QR's long chain of dependent reflector kernels.  Round one
    shifts the Gram matrix's diagonal by a multiple of its trace, which no Cholesky can fail on (a zero or
    rank-deficient block included: its missing directions come out short, never NaN); two more rounds,
    with a tiny compensated shift, restore orthonormality.  Nothing is read back to the host."""

    def __init__(self, k: int, n: int, r: int, dtype: torch.dtype, device: torch.device, ranks=None,
                 path: str = TORCH):
        kw = dict(dtype=dtype, device=device)
        self.path = path              # the plan's (``_kernels.choose_path``): Triton shifts, keeps Q in a kernel each
        self.a = torch.zeros(k, n, r, **kw)            # the input; its padding stays zero
        self.flat = self.a.view(-1)
        # padding columns (a block of rank < r) come out zero: not a deficiency of the block's own
        self.unused = None if ranks is None or min(ranks, default=r) == r else \
            (torch.arange(r, device=device) >= torch.tensor(ranks, device=device).unsqueeze(1)).to(dtype).unsqueeze(-1)
        self.q = [torch.empty(k, n, r, **kw) for _ in range(2)]
        self.at, self.qt = self.a.mT, [q.mT for q in self.q]
        self.g, self.u = torch.empty(k, r, r, **kw), torch.empty(k, r, r, **kw)
        self.gd, self.tr = self.g.diagonal(dim1=-2, dim2=-1), torch.empty(k, 1, **kw)
        self.info = torch.empty(k, dtype=torch.int32, device=device)   # never read: the shift keeps it 0
        self.pivots = self.u.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)  # (k, r, 1): min over r, per block
        self.eye, self.bad = torch.eye(r, **kw), torch.empty(k, 1, 1, dtype=torch.bool, device=device)
        eps = torch.finfo(dtype).eps
        # the shift that provably lets Cholesky through the Gram matrix's rounding (Fukaya et al.)
        self.shift = 11 * (n * r + r * (r + 1)) * eps
        self.fix = (n + r * (r + 1)) * eps               # rounds 2-3: the input is near-orthonormal
        self.floor = torch.finfo(dtype).tiny / eps     # an all-zero block: a positive diagonal still
        # the Triton path reads both in the matrices' dtype: a float64 floor is below float32's range
        self.consts = torch.tensor([self.floor, self.shift], **kw) if path == TRITON else None

    def run(self) -> Tensor:
        """``q[0]`` <- orthonormal columns spanning ``a``'s (R with a positive diagonal: unique, so equal
        to Householder QR's up to column signs)."""
        torch.bmm(self.at, self.a, out=self.g)
        SHIFT_GRAM(self.path, self)
        self._solve(self.a, self.q[0])
        for i in (0, 1):                                 # Q^T Q + s I over 1 + s: the shift cancels
            torch.baddbmm(self.eye, self.qt[i], self.q[i], beta=self.fix / (1 + self.fix),
                          alpha=1 / (1 + self.fix), out=self.g)
            self._solve(self.q[i], self.q[1 - i])
        return self.q[0]

    def shift_torch(self) -> None:
        """The Gram matrix's diagonal plus the shift times its trace (the trace at least ``floor``)."""
        torch.sum(self.gd, -1, keepdim=True, out=self.tr)
        self.gd.add_(self.tr.clamp_min_(self.floor), alpha=self.shift)

    def shift_triton(self) -> None:
        """:meth:`shift_torch` in one launch (the trace, its floor and the shift)."""
        from gvq.compressors import _triton_lowrank as k     # imports triton: only once a kernel runs
        r = self.g.shape[-1]
        launch_kernel(k.shift_gram, (self.g.shape[0],), self.g, self.consts, R=r, RP=triton_pow2(r))

    def _solve(self, a: Tensor, out: Tensor) -> None:
        torch.linalg.cholesky_ex(self.g, upper=True, out=(self.u, self.info))
        torch.linalg.solve_triangular(self.u, a, upper=True, left=False, out=out)

    def deficient(self) -> Tensor:
        """After :meth:`run`: per block, whether a direction came out short (a pivot of the last round
        under 1/2): rank-deficient input, whose Q spans fewer than r directions."""
        pivots = self.pivots if self.unused is None else self.pivots + self.unused
        return torch.lt(pivots.amin(-2, keepdim=True), 0.5, out=self.bad)

    def keep_torch(self, q_all: Tensor, at: Tensor) -> None:
        """After :meth:`run`, the warm start: ``q_all[at[j]]`` <- block j's ``q[0]``, unless it is
        :meth:`deficient` (then it keeps its row).  ``q_all`` (., n, r) as ``a``."""
        keep = q_all.index_select(0, at)
        q_all.index_copy_(0, at, torch.where(self.deficient(), keep, self.q[0]))

    def keep_triton(self, q_all: Tensor, at: Tensor) -> None:
        """:meth:`keep_torch` in one launch."""
        from gvq.compressors import _triton_lowrank as k     # imports triton: only once a kernel runs
        blocks, n, r = self.a.shape
        size = n * r
        launch_kernel(k.keep_q, (blocks, -(-size // BLOCK)), self.q[0], self.u, self.u if self.unused is None else
                      self.unused, at, q_all, size, R=r, RP=triton_pow2(r), HAS_UNUSED=self.unused is not None,
                      BLOCK=BLOCK)


class Views(NamedTuple):
    """One GEMM's operands: a run of one class's blocks with consecutive places in the store, within one
    segment, as (k, ., .) views of the segment's buffers and of the store."""
    m: Tensor            # (k, rows, cols) the values M, class-major
    mt: Tensor           # M^T
    o: Tensor            # (k, rows, cols) the output P^ (sum Q)^T
    p: Tensor            # (k, rows, r) the P payload
    qb: Tensor           # (k, cols, r) the Q payload as compress writes it
    qbt: Tensor          # (k, r, cols) the summed Q payload as decompress reads it (in the padded input)
    q: Tensor            # (k, cols, r) the store's Q of these blocks
    phat: Tensor         # (k, rows, r) the store's P^


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


def _positions(pad: Tensor, shapes: list[tuple[int, int]]) -> Tensor:
    """Where each value of payloads laid end to end, an (n, r) block each, goes in the flat (k, N, R)
    zero-padded ``pad``."""
    _, n_pad, r_pad = pad.shape
    at = [(j * n_pad * r_pad + torch.arange(n).unsqueeze(1) * r_pad + torch.arange(r)).reshape(-1)
          for j, (n, r) in enumerate(shapes)]
    return torch.cat(at or [torch.zeros(0, dtype=torch.long)])


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
        self.path = lr.path(device)           # chosen once per device by the plan (compressor's kernels)
        self._padded(st, [b for _, b in low], [st.first[c] + place for (c, place), _ in low], device)
        self.groups, v, pa, qa, j = [], 0, 0, 0, 0
        for c, a, k in runs([(c, place, 1) for (c, place), _ in low]):
            rows, cols, r = st.keys[c]
            self.groups.append(self._views(st, c, a, k, (v, pa, qa, j)))
            v, pa, qa, j = v + k * rows * cols, pa + k * rows * r, qa + k * cols * r, j + k
        self.p_low, self.p_raw, self.g_raw, self.o_raw = self.p[:pa], self.p[pa:], self.g[v:], self.o[v:]
        self.raws = [st.raw[at: at + k] for _, at, k in runs([(0, at, k) for at, k, _ in raw])]
        # the Triton path's unpacking: where each raw sum of pass P's payload goes in the store's raw values
        self.raw_all, self.raw_pos = st.raw, torch.cat([torch.arange(at, at + k) for at, k, _ in raw] or
                                                       [torch.zeros(0, dtype=torch.long)]).to(device)
        self.zeros = torch.zeros((), dtype=dt, device=device).expand(n)
        self.version = st.version

    def _padded(self, st: Store, low: list[Block], rows_in_store: list[int], device: torch.device) -> None:
        """The two orthogonalizations' padded inputs (P^'s, next Q's), where each payload value goes in
        them, and the blocks' rows in the store's stacks (``at``) that their results are written to."""
        r, dt = st.q_all.shape[2], st.q_all.dtype
        self.p_orth = OrthWork(len(low), st.phat_all.shape[1], r, dt, device, path=self.path)
        self.q_orth = OrthWork(len(low), st.q_all.shape[1], r, dt, device, [b.rank for b in low], self.path)
        self.p_pos = _positions(self.p_orth.a, [(b.rows, b.rank) for b in low]).to(device)
        self.q_pos = _positions(self.q_orth.a, [(b.cols, b.rank) for b in low]).to(device)
        self.at = torch.tensor(rows_in_store, dtype=torch.long).to(device)

    def _views(self, st: Store, c: int, a: int, k: int, at: tuple[int, int, int, int]) -> Views:
        (rows, cols, r), (v, pa, qa, j) = st.keys[c], at
        m = self.g[v: v + k * rows * cols].view(k, rows, cols)
        return Views(m, m.transpose(1, 2), self.o[v: v + k * rows * cols].view(k, rows, cols),
                     self.p[pa: pa + k * rows * r].view(k, rows, r), self.qb[qa: qa + k * cols * r].view(k, cols, r),
                     self.q_orth.a[j: j + k, :cols, :r].transpose(1, 2), st.q[c][a: a + k], st.phat[c][a: a + k])

    def unpack(self, payload: Tensor) -> None:
        """Pass P's summed payload where its decompress reads it: the low-rank sums into the padded input of
        P^'s orthogonalisation, the raw sums into the store (for pass Q to write back)."""
        UNPACK(self.path, self, payload)

    def unpack_torch(self, payload: Tensor) -> None:
        """:meth:`unpack` as a copy, a scatter and a copy a raw run."""
        self.p.copy_(payload)
        if self.groups:
            self.p_orth.flat.index_copy_(0, self.p_pos, self.p_low)
        self.put_raws(self.p_raw)

    def unpack_triton(self, payload: Tensor) -> None:
        """:meth:`unpack` in one launch (``_triton_lowrank.unpack_p``)."""
        if payload.numel():
            from gvq.compressors import _triton_lowrank as k     # imports triton: only once a kernel runs
            n = payload.numel()
            launch_kernel(k.unpack_p, (-(-n // BLOCK),), payload, self.p_pos, self.p_orth.flat, self.raw_pos,
                          self.raw_all, n, self.p_low.numel(), BLOCK=BLOCK)

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


# the low-rank steps between the GEMMs, per path (``_kernels.Op``): the torch reference, and a Triton kernel each
SHIFT_GRAM = Op(torch=OrthWork.shift_torch, triton=OrthWork.shift_triton)
KEEP_Q = Op(torch=OrthWork.keep_torch, triton=OrthWork.keep_triton)
UNPACK = Op(torch=SegLayout.unpack_torch, triton=SegLayout.unpack_triton)
