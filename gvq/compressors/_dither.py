"""Fresh uniforms for stochastic rounding on every call, fast: lanes of 64-bit linear congruential
generators stepped in place, an xor-fold as output function (PCG's idea, without its rotation).

See docs/design.md#gvqcompressors_ditherpy for how it works and why.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gvq.compressors import _fused as fused
from gvq.compressors._packing import digit_dtype
from gvq.compressors._kernels import HOST

#: ``floor(y + DITHER_OFFSET + r * 2**-16)`` with r uniform int16 is unbiased stochastic rounding of y
DITHER_OFFSET = 0.5 + 2.0 ** -17

A = 6364136223846793005          # Knuth's MMIX multiplier (a = 1 mod 4, c odd: full period)
C = 1442695040888963407


class DitherLanes:
    """``uniform16(n, device, gen)``: n fresh uniform 16-bit integers (int16, every bit pattern equally
    likely), on ``device``."""

    def __init__(self):
        self.state: Tensor | None = None           # int64 lanes, on the device of the data they dither
        self._tmp: Tensor | None = None            # the fold's output buffer, beside them
        self._c: Tensor | None = None              # the increment as a tensor: c + a*s in one fused pass

    def uniform16(self, n: int, device: torch.device, gen: torch.Generator, compiled: bool = True) -> Tensor:
        """``gen`` (CPU, seeded) seeds lanes not yet drawn from; ``compiled``: host lanes step in numba's
        one pass (the host path's; the torch ops' draws are the same bit for bit)."""
        words = -(-n // 4)
        if device.type == "meta":
            return torch.empty(n, dtype=torch.int16, device=device)
        self._grow(words, device, gen)
        s = self.state[:words]
        if compiled and s.device.type == "cpu":    # the same step and fold, one compiled pass
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


class Dithering:
    """Stochastic rounding for a bucket quantizer (mixed into ``BucketQuantizer``, whose ``levels``,
    ``dither_base``, ``gen``, ``lanes``, ``path``, ``scratch`` and ``_ws`` it uses): integer codes of a batch of
    scaled values, drawn fresh every call, from the lanes on the host and the device's own generator
    elsewhere."""

    @property
    def dither_shift(self) -> float:
        """The constant ``dither_floor_`` adds (base + offset): an encoder that can fold it into a pass
        it makes anyway (an addcmul, a table) says ``shifted=True`` and saves one pass."""
        return self.dither_base + DITHER_OFFSET

    def dither_floor_(self, y: Tensor, shifted: bool = False, scale: Tensor | None = None) -> Tensor:
        """Unbiased stochastic rounding, in place: integer codes ``floor(y + base + u)`` clamped to
        [0, levels), u fresh (``base`` = ``self.dither_base``); ``shifted``: y already holds +
        ``dither_shift``; ``scale`` (m, 1): round ``y * scale`` (y not written), on the host in one fused
        pass (``_fused.scale_dither_floor``, with the lanes' uniforms)."""
        codes = self.scratch("codes", y.shape, digit_dtype(self.levels), y.device)
        host = self.path(y.device) == HOST
        if scale is not None and not shifted and host \
                and y.is_contiguous() and y.dtype == torch.float32 and y.dim() == 2:
            u = self.lanes.uniform16(y.numel(), y.device, self.gen)
            fused.scale_dither_floor(y.numpy(), scale.reshape(-1).contiguous().numpy(), self.dither_shift,
                                     u.numpy(), codes.numpy(), self.levels - 1)
            return codes
        # the device path: a fresh uniform in [base, base + 1) from the device's own generator (one
        # kernel), floor(y + u) unbiased; fmin, not clamp: a NaN (a NaN/Inf input, which the side info
        # flags) becomes the top code, never an out-of-range integer
        if host:                   # the host: the lanes' uniforms, so every host path (the fused kernels,
            # a sorted fit beside them) draws the same numbers: common random numbers for comparisons
            if scale is not None:
                y = torch.mul(y, scale, out=self.scratch_like("y", y))
            y.add_(self.lanes.uniform16(y.numel(), y.device, self.gen).view(y.shape), alpha=2.0 ** -16)
            if not shifted:
                y.add_(self.dither_shift)
            return codes.copy_(y).clamp_(max=self.levels - 1)          # float -> int truncates = floor
        u = self.uniform(y, -DITHER_OFFSET if shifted else self.dither_base)
        return self.floor_codes(torch.addcmul(u, y, scale, out=u) if scale is not None else u.add_(y))

    def dither_div(self, y: Tensor, divisor: Tensor, value: float = 1.0) -> Tensor:
        """The device path's ``dither_floor_(y, scale=value / divisor)`` in one op less: a zero divisor
        (an all-zero bucket) gives NaN, the top code, which its zero side info decodes to 0."""
        u = self.uniform(y, self.dither_base)
        return self.floor_codes(torch.addcdiv(u, y, divisor, value=value, out=u))

    def uniform(self, like: Tensor, lo: float) -> Tensor:
        """A scratch of ``like``'s shape filled with fresh uniforms in [lo, lo + 1) from the device's own
        generator: one kernel, floor(y + u) unbiased."""
        u = self.scratch("u", like.shape, torch.float32, like.device)
        return u.uniform_(lo, lo + 1.0, generator=self.generator_on(like.device))

    def floor_codes(self, y: Tensor) -> Tensor:
        """Integer codes of y >= 0 (the cast floors), capped at the top level by fmin, not clamp: a NaN (a
        NaN/Inf input, which the side info flags) becomes the top code, never an out-of-range integer."""
        torch.fmin(y, self._const("top", float(self.levels - 1), y.device), out=y)
        return self.scratch("codes", y.shape, digit_dtype(self.levels), y.device).copy_(y)

    def generator_on(self, device) -> torch.Generator:
        """The dither's generator for ``device``: the seeded host one, or one on the device seeded from it
        on first use there (its state travels in :meth:`state_dict`)."""
        device = torch.device(device)
        if device.type in ("cpu", "meta"):
            return self.gen
        if self._dgen is None or self._dgen.device != device:
            state, self._dgen = self._dgen_state, torch.Generator(device=device)
            if state is not None:
                self._dgen.set_state(state)
            else:
                self._dgen.manual_seed(int(torch.randint(2 ** 62, (1,), generator=self.gen, device="cpu")))
        return self._dgen

    _dgen: torch.Generator | None = None
    _dgen_state: Tensor | None = None

    def _const(self, tag: str, value: float, device) -> Tensor:
        """A cached 0-d float32 ``value`` on ``device`` (an op's operand without a host-to-device copy)."""
        key = (tag, value, torch.device(device))
        if key not in self._ws:
            self._ws[key] = torch.tensor(value, dtype=torch.float32, device=device)
        return self._ws[key]


def draws_as_bytes(gen: torch.Generator, lanes: "DitherLanes") -> dict:
    """A codec's generator and lanes for pickling, as bytes, not tensors: spawn would share tensors between
    ranks through a file descriptor, and ranks would step one another's lanes (:func:`draws_from_bytes`)."""
    return {"gen": gen.get_state().numpy().tobytes(), "lanes": lanes.state_dict()["lanes"].numpy().tobytes()}


def draws_from_bytes(state: dict) -> dict:
    """Inverse of :func:`draws_as_bytes`: ``{"gen": Generator, "lanes": DitherLanes}``."""
    gen = torch.Generator()
    gen.set_state(torch.frombuffer(bytearray(state["gen"]), dtype=torch.uint8))
    lanes = DitherLanes()
    if state["lanes"]:
        lanes.load_state_dict({"lanes": torch.frombuffer(bytearray(state["lanes"]), dtype=torch.int64)})
    return {"gen": gen, "lanes": lanes}
