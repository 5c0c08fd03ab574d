"""PowerSGD (Vogels et al., NeurIPS 2019) as two additive compressors for the pipelined ring.

See docs/design.md#gvqcompressorspowersgdpy for how it works and why.
"""
from __future__ import annotations

import bisect
import itertools

import torch
from torch import Tensor

from gvq.compressors import _kernels as kernels_
from gvq.compressors._lowrank import KEEP_Q, Block, OrthWork, SegLayout, Store
from gvq.compressors._segments import balanced_segments
from gvq.compressors.base import Compressor


def low_rank(shape, rank: int, min_compression_rate: float) -> int:
    """The rank a tensor of ``shape`` travels at; 0 when it should go raw (1-D, or too little gain)."""
    if len(shape) < 2:
        return 0
    n = int(shape[0])
    m = int(torch.Size(shape).numel()) // max(n, 1)
    r = min(rank, n, m)
    return r if r > 0 and (n + m) * r * min_compression_rate < n * m else 0


def plan(shapes, rank: int, min_compression_rate: float) -> list[Block]:
    blocks, offset = [], 0
    for shape in shapes:
        numel = int(torch.Size(shape).numel())
        rows = int(shape[0]) if len(shape) else 1
        blocks.append(Block(offset, offset + numel, rows, numel // max(rows, 1),
                            low_rank(shape, rank, min_compression_rate)))
        offset += numel
    return blocks


def block_balanced_segments(blocks: list[Block], weight, n: int) -> list[slice]:
    """``n`` contiguous runs of whole blocks whose summed ``weight`` (payload elements) is as equal as
    whole blocks allow: a ring step's time is its largest segment's."""
    ends = list(itertools.accumulate((weight(b) for b in blocks), initial=0))
    return balanced_segments([0] + [b.stop for b in blocks], n, ends)


def orthogonalize(a: Tensor) -> Tensor:
    """Orthonormal columns spanning those of ``a``, an (n, r) matrix or a (k, n, r) batch: the passes' own
    Cholesky QR (:meth:`OrthWork.run`) on fresh buffers.  A zero or rank-deficient block gives short
    columns, never NaN; deterministic, so equal inputs give equal bits on every rank."""
    batch = a if a.dim() == 3 else a.unsqueeze(0)
    work = OrthWork(*batch.shape, dtype=a.dtype, device=a.device)
    work.a.copy_(batch)
    q = work.run()
    return q if a.dim() == 3 else q[0]


class PowerSGD:
    """State shared by the two passes: the layout, Q (warm start), and this iteration's P^ and raw sums,
    kept in a :class:`Store` (shared with the DDP buckets' plans, :meth:`subset`)."""

    def __init__(self, shapes, rank: int, min_compression_rate: float, warm_start: bool,
                 seed: int = 0, dtype: torch.dtype = torch.float32, kernels: str = "auto"):
        self.blocks = plan(shapes, rank, min_compression_rate)
        self.dtype = dtype                       # the gradient's: P, Q and the payloads keep its precision
        self.numel = self.blocks[-1].stop if self.blocks else 0
        self.warm_start = warm_start
        self.gen = torch.Generator().manual_seed(int(seed))   # same seed on all ranks: same Q
        self.store = Store(self.blocks, dtype)
        self.ids = list(range(len(self.blocks)))   # each block's index in the store's (whole-model) plan
        # auto | triton | torch: the packing and arithmetic between the passes' GEMMs as Triton kernels (fewer
        # launches a call; auto: on CUDA where Triton is installed) or torch ops; chosen once per device
        self.kernels, self._paths = kernels_.check_kernels(kernels), {}
        self._draw_q()
        self._setup()

    def _setup(self) -> None:
        self.q_local: list[Tensor] = []          # this rank's own pass-Q payloads (for the error metric)
        self._starts = [b.start for b in self.blocks]
        self._in: dict[tuple[int, int], list[tuple[int, Block]]] = {}
        self._layouts: dict = {}
        self.p_stage, self.q_stage = PStage(self), QStage(self)

    def subset(self, ids: list[int]) -> "PowerSGD":
        """The plan of the vector of whole-plan blocks ``ids`` laid end to end (a DDP bucket), sharing
        this plan's store: Q and P^ are each block's, whichever vector it is averaged in."""
        sub = object.__new__(PowerSGD)
        sub.dtype, sub.warm_start, sub.gen, sub.store = self.dtype, self.warm_start, self.gen, self.store
        sub.kernels, sub._paths = self.kernels, self._paths
        sub.blocks, at = [], 0
        for i in ids:
            b = self.blocks[i]
            sub.blocks.append(Block(at, at + b.stop - b.start, b.rows, b.cols, b.rank))
            at += b.stop - b.start
        sub.numel, sub.ids = at, list(ids)
        sub._setup()
        return sub

    def _draw_q(self) -> None:
        """A random orthonormal Q per block, drawn on the host on purpose: the seeded host generator gives
        every rank the same Q whatever its device (a CUDA generator's stream differs); one draw and one
        batched QR per class.  Householder QR here, not the passes' Cholesky QR: this runs on the host,
        once (or once per iteration without warm start), off the device's path, and keeps a seed's Q what
        it always was, so earlier runs and checkpoints reproduce."""
        for c, (_, cols, r) in enumerate(self.store.keys):
            draw = torch.randn(self.store.counts[c], cols, r, generator=self.gen, device="cpu")
            fresh = torch.linalg.qr(draw).Q
            self.store.q[c].copy_(fresh)

    def begin(self) -> None:
        """Start an iteration: without warm start, a fresh random Q (drawn identically on all ranks)."""
        self.q_local = []
        if not self.warm_start:
            self._draw_q()

    def to(self, device: torch.device) -> None:
        """Move the state (Q, P^, raw sums) to ``device``; a pass does it on first use anyway."""
        self.store.to(torch.device(device))

    def path(self, device: torch.device) -> str:
        """This plan's path on ``device`` (``_kernels.choose_path``), asked once per device; no host kernels."""
        return kernels_.path_for(self._paths, self.kernels, device, host=False)

    def layout(self, seg: slice, device: torch.device) -> SegLayout:
        """Segment ``seg``'s :class:`SegLayout` on ``device`` (the store moves there on first use)."""
        self.store.to(device)
        key = (seg.start, seg.stop)
        lay = self._layouts.get(key)
        if lay is None or lay.version != self.store.version or lay.g.device != device:
            lay = self._layouts[key] = SegLayout(self, seg, device)
        return lay

    @property
    def q(self) -> dict[int, Tensor]:
        """Each low-rank block's Q (views of the store), by block."""
        return {j: self.store.q[c][k] for j, (c, k) in self._slots()}

    @property
    def phat(self) -> dict[int, Tensor]:
        """Each low-rank block's P^ of the last pass P (views of the store), by block."""
        return {j: self.store.phat[c][k] for j, (c, k) in self._slots()}

    def _slots(self):
        return [(j, self.store.slot[i]) for j, i in enumerate(self.ids) if i in self.store.slot]

    def cuts(self) -> list[int]:
        return [0] + [b.stop for b in self.blocks]

    def blocks_in(self, seg: slice) -> list[tuple[int, Block]]:
        key = (seg.start, seg.stop)
        if key not in self._in:
            i = bisect.bisect_left(self._starts, seg.start)
            found = []
            while i < len(self.blocks) and self.blocks[i].stop <= seg.stop:
                found.append((i, self.blocks[i]))
                i += 1
            if sum(b.stop - b.start for _, b in found) != seg.stop - seg.start:
                raise ValueError(f"powersgd: segment {seg} does not lie on parameter boundaries")
            self._in[key] = found
        return self._in[key]

    @property
    def bytes_per_iteration(self) -> int:
        """Payload bytes of both passes for the whole gradient (before the ring's 2(N-1)/N)."""
        return torch.finfo(self.dtype).bits // 8 * sum(b.p_len + b.q_len for b in self.blocks)

    def state_dict(self) -> dict:
        return {"q": {i: q.clone() for i, q in self.q.items()}, "gen": self.gen.get_state()}

    def load_state_dict(self, sd: dict) -> None:
        mine = self.q
        if set(int(i) for i in sd["q"]) != set(mine) or any(
                tuple(q.shape) != tuple(mine[int(i)].shape) for i, q in sd["q"].items()):
            raise ValueError("powersgd.load_state_dict: the checkpoint's matrices differ from this model's")
        for i, q in sd["q"].items():
            mine[int(i)].copy_(q)
        self.gen.set_state(sd["gen"])


class _Stage(Compressor):
    """One of PowerSGD's two sums: shares the layout state; ``length`` names the block's payload size."""

    additive = True
    length = "p_len"

    def __init__(self, state: PowerSGD):
        self.s = state

    def cuts(self, numel):
        return self.s.cuts()

    def payload_spec(self, seg):
        return self.s.dtype, sum(getattr(b, self.length) for _, b in self.s.blocks_in(seg))


class PStage(_Stage):
    """Pass P: ``M Q`` for low-rank blocks, raw values for the others; decoding orthogonalizes."""

    name = "powersgd-P"

    def compress(self, x, seg):
        lay = self.s.layout(seg, x.device)
        torch.index_select(x.to(self.s.dtype), 0, lay.perm, out=lay.g)      # class-major, raw last
        for g in lay.groups:
            torch.bmm(g.m, g.q, out=g.p)
        return torch.cat([lay.p_low, lay.g_raw])         # fresh: the ring may still be sending the last one

    def decompress(self, payload, seg):
        lay = self.s.layout(seg, payload.device)
        lay.unpack(payload)                               # every class's P zero-padded, the raw sums stored
        if lay.groups:                                    # every class's P orthogonalised at once
            self.s.store.phat_all.index_copy_(0, lay.at, lay.p_orth.run())
        # nothing to write back yet: this pass's result is state (P^, raw sums) that pass Q uses
        return lay.zeros


class QStage(_Stage):
    """Pass Q: ``M^T P^`` for low-rank blocks (raw blocks send nothing); decoding writes ``P^ (sum Q)^T``
    and the raw sums, and keeps ``orth(sum Q)`` for the next iteration."""

    name = "powersgd-Q"
    length = "q_len"

    def compress(self, x, seg):
        lay = self.s.layout(seg, x.device)
        torch.index_select(x.to(self.s.dtype), 0, lay.perm, out=lay.g)
        for g in lay.groups:
            torch.bmm(g.mt, g.phat, out=g.qb)
        out = lay.qb.clone()                              # fresh: the ring may still be sending the last one
        self.s.q_local.append(out)                        # not a copy: the ring only reads what it sends
        return out

    def decompress(self, payload, seg):
        lay = self.s.layout(seg, payload.device)
        work = lay.q_orth
        work.flat.index_copy_(0, lay.q_pos, payload)      # every class's sum Q at once, zero-padded
        for g in lay.groups:
            torch.bmm(g.phat, g.qbt, out=g.o)
        if self.s.warm_start and lay.groups:              # scale-free: P^ = orth(M Q) ignores Q's scale
            work.run()
            self._warm_start(lay)
        lay.take_raws(lay.o_raw)
        return lay.o.index_select(0, lay.inv)            # back to the segment's order

    def _warm_start(self, lay) -> None:
        """Next iteration's Q <- the orthogonalised sum Q (``q_orth.run``'s), but a block whose sum Q was
        rank-deficient (a zero gradient, say) keeps its Q: Cholesky QR leaves missing directions short, and a
        Q that lost a direction would never regain it (M Q stays short there), where Householder QR filled
        them with arbitrary ones."""
        work = lay.q_orth
        KEEP_Q(work.path, work, self.s.store.q_all, lay.at)
