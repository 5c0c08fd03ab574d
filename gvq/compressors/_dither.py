"""Fresh uniforms for stochastic rounding on every call, fast: lanes of 64-bit linear congruential
generators stepped in place, an xor-fold as output function (PCG's idea, without its rotation).

See docs/design.md#gvqcompressors_ditherpy for how it works and why.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gvq.compressors import _fused as fused

A = 6364136223846793005          # Knuth's MMIX multiplier (a = 1 mod 4, c odd: full period)
C = 1442695040888963407


class DitherLanes:
    """``uniform16(n, device, gen)``: n fresh uniform 16-bit integers (int16, every bit pattern equally
    likely), on ``device``."""

    def __init__(self):
        self.state: Tensor | None = None           # int64 lanes, on the device of the data they dither
        self._tmp: Tensor | None = None            # the fold's output buffer, beside them
        self._c: Tensor | None = None              # the increment as a tensor: c + a*s in one fused pass

    def uniform16(self, n: int, device: torch.device, gen: torch.Generator) -> Tensor:
        """``gen`` (CPU, seeded) seeds lanes not yet drawn from."""
        words = -(-n // 4)
        if device.type == "meta":
            return torch.empty(n, dtype=torch.int16, device=device)
        self._grow(words, device, gen)
        s = self.state[:words]
        if fused.enabled(s):                       # the same step and fold, one compiled pass
            fused.lcg_step(s.numpy().view("uint64"), self._tmp[:words].numpy().view("uint64"))
            return self._tmp[:words].view(torch.int16)[:n]
        torch.add(self._c, s, alpha=A, out=s)      # s <- c + a*s: one LCG step per lane read, one pass
        out = torch.bitwise_right_shift(s, 32, out=self._tmp[:words]).bitwise_and_(0xFFFFFFFF)   # logical >>
        return out.bitwise_xor_(s).view(torch.int16)[:n]

    def _grow(self, words: int, device: torch.device, gen: torch.Generator) -> None:
        if self.state is None:
            self.state = torch.empty(0, dtype=torch.int64, device=device)
        if self._c is None or self._c.device != device or self.state.device != device:
            self.state = self.state.to(device)      # explicit move, with the data (e.g. a resume to CUDA)
            self._c = torch.tensor(C, dtype=torch.int64, device=device)
        have = self.state.numel()
        if have < words:                           # new lanes: 64 random bits each from the seeded CPU
            seeds = torch.empty(words - have, dtype=torch.int64, device="cpu")   # generator, then moved
            seeds.random_(-2 ** 63, None, generator=gen)
            self.state = torch.cat([self.state, seeds.to(device)])
        if self._tmp is None or self._tmp.numel() != self.state.numel() or self._tmp.device != device:
            self._tmp = torch.empty_like(self.state)

    def state_dict(self) -> dict:
        """Host data for checkpoints (empty before the first draw)."""
        lanes = self.state if self.state is not None else torch.empty(0, dtype=torch.int64, device="cpu")
        return {"lanes": lanes.cpu().clone()}

    def load_state_dict(self, sd: dict) -> None:
        self.state, self._tmp, self._c = sd["lanes"].clone(), None, None     # moved on the next draw
