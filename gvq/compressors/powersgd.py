"""PowerSGD (Vogels et al., NeurIPS 2019) as two additive compressors for the pipelined ring.

See docs/design.md#gvqcompressorspowersgdpy for how it works and why.
"""
from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from gvq.compressors._segments import balanced_segments
from gvq.compressors.base import Compressor


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
    """Orthonormal columns spanning ``a``'s (Householder QR: a zero column gives no NaN, unlike plain
    Gram-Schmidt without an epsilon; deterministic, so equal inputs give equal bits on every rank)."""
    return torch.linalg.qr(a).Q


class PowerSGD:
    """State shared by the two passes: the layout, Q (warm start), and this iteration's P^ and raw sums."""

    def __init__(self, shapes, rank: int = 2, min_compression_rate: float = 2.0, warm_start: bool = True,
                 seed: int = 0, dtype: torch.dtype = torch.float32):
        self.blocks = plan(shapes, rank, min_compression_rate)
        self.dtype = dtype                       # the gradient's: P, Q and the payloads keep its precision
        self.numel = self.blocks[-1].stop if self.blocks else 0
        self.warm_start = warm_start
        self.gen = torch.Generator().manual_seed(int(seed))   # same seed on all ranks: same Q
        self.q = self._random_q()
        self.phat: dict[int, Tensor] = {}
        self.raw: dict[int, Tensor] = {}
        self.q_local: list[Tensor] = []          # this rank's own pass-Q payloads (for the error metric)
        self._starts = [b.start for b in self.blocks]
        self._in: dict[tuple[int, int], list[tuple[int, Block]]] = {}
        self.p_stage, self.q_stage = PStage(self), QStage(self)

    def _random_q(self) -> dict[int, Tensor]:
        """Drawn on the host on purpose: the seeded host generator gives every rank the same Q whatever
        its device (a CUDA generator's stream differs); ``q_on`` moves each block once, to the gradient."""
        return {i: orthogonalize(torch.randn(b.cols, b.rank, generator=self.gen, device="cpu"))
                for i, b in enumerate(self.blocks) if b.rank}

    def q_on(self, i: int, device: torch.device) -> Tensor:
        """Block ``i``'s Q on the gradient's device, in its dtype (drawn by the seeded host generator in
        float32, moved and cast once)."""
        if self.q[i].device != device or self.q[i].dtype != self.dtype:
            self.q[i] = self.q[i].to(device=device, dtype=self.dtype)
        return self.q[i]

    def begin(self) -> None:
        """Start an iteration: without warm start, a fresh random Q (drawn identically on all ranks)."""
        self.q_local = []
        if not self.warm_start:
            self.q = self._random_q()

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
        if set(sd["q"]) != set(self.q):
            raise ValueError("powersgd.load_state_dict: the checkpoint's matrices differ from this model's")
        self.q = {int(i): q.clone() for i, q in sd["q"].items()}
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
        out = torch.empty(self.payload_spec(seg)[1], dtype=self.s.dtype, device=x.device)
        off = 0
        for i, b in self.s.blocks_in(seg):
            piece, n = x[b.start - seg.start: b.stop - seg.start].to(self.s.dtype), b.p_len
            if b.rank:
                torch.mm(piece.view(b.rows, b.cols), self.s.q_on(i, x.device),
                         out=out[off: off + n].view(b.rows, b.rank))
            else:
                out[off: off + n] = piece
            off += n
        return out

    def decompress(self, payload, seg):
        off = 0
        for i, b in self.s.blocks_in(seg):
            n = b.p_len
            piece = payload[off: off + n]
            if b.rank:
                self.s.phat[i] = orthogonalize(piece.view(b.rows, b.rank))
            else:
                self.s.raw[i] = piece          # the ring never writes a payload it has decoded
            off += n
        # nothing to write back yet: this pass's result is state (P^, raw sums) that pass Q uses
        return torch.zeros((), dtype=payload.dtype, device=payload.device).expand(seg.stop - seg.start)


class QStage(_Stage):
    """Pass Q: ``M^T P^`` for low-rank blocks (raw blocks send nothing); decoding writes ``P^ (sum Q)^T``
    and the raw sums, and keeps ``orth(sum Q)`` for the next iteration."""

    name = "powersgd-Q"
    length = "q_len"

    def compress(self, x, seg):
        out = torch.empty(self.payload_spec(seg)[1], dtype=self.s.dtype, device=x.device)
        off = 0
        for i, b in self.s.blocks_in(seg):
            if b.rank:
                m = x[b.start - seg.start: b.stop - seg.start].to(self.s.dtype).view(b.rows, b.cols)
                torch.mm(m.t(), self.s.phat[i], out=out[off: off + b.q_len].view(b.cols, b.rank))
                off += b.q_len
        self.s.q_local.append(out)             # not a copy: the ring only reads what it sends
        return out

    def decompress(self, payload, seg):
        out = torch.empty(seg.stop - seg.start, dtype=payload.dtype, device=payload.device)
        off = 0
        for i, b in self.s.blocks_in(seg):
            dst = out[b.start - seg.start: b.stop - seg.start]
            if not b.rank:
                dst.copy_(self.s.raw[i])
                continue
            qsum = payload[off: off + b.q_len].view(b.cols, b.rank)
            torch.mm(self.s.phat[i], qsum.t(), out=dst.view(b.rows, b.cols))
            if self.s.warm_start:              # scale-free: P^ = orth(M Q) ignores Q's scale
                self.s.q[i] = orthogonalize(qsum)
            off += b.q_len
        return out
