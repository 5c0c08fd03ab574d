"""Natural compression (Horváth et al. 2019): each value rounded at random to one of the two powers of two
around it, unbiased, and sent as its sign and 8-bit exponent: 9 bits a value.  ``python cli.py
aggregator=natural``.

|x| = 2^e (1 + m), m in [0, 1), becomes 2^(e+1) with probability m, else 2^e: E[C(x)] = x and
E[C(x)^2] = 2^2e (1 + 3m) <= 9/8 x^2 (the worst at m = 1/3, x = (4/3) 2^e); powers of two are exact.  On
float32's bits that is one integer add: a uniform 23-bit integer added to the 23 mantissa bits carries
into the exponent with probability m, and the mantissa is dropped.  Fresh uniforms every call, per rank
(``reseed``) and kept by checkpoints, from the quantizers' dither lanes (:mod:`gvq.compressors._dither`).

Edge values: +-0 are sent as they are (exponent 0; the sign kept).  Subnormals (|x| < 2^-126) round to 0
or to 2^-126 with the same rule, still unbiased (the carry is into exponent 1).  |x| >= 2^127 may round to
2^128, which float32 carries as Inf, and NaN/Inf inputs are Inf/NaN's exponent (255): any code 255
raises at the iteration's check (the ``Health`` watch), after the ring.  Not additive (codes of two ranks
do not sum): the ring decodes, adds and re-encodes at every hop; allgather decodes each rank's once.

Wire: n exponent bytes, then the n signs packed 8 to a byte (``_packing``): ceil(9n/8) bytes (GRACE
sends 8 bits, clipping the exponent to [18, 145]: a flush to zero below 2^-108).
"""
from __future__ import annotations

import torch
from torch import Tensor

from gvq.compressors import _triton_grace
from gvq.compressors._dither import DitherLanes, draws_as_bytes, draws_from_bytes
from gvq.compressors._kernels import TORCH, DeviceKernels, Op
from gvq.compressors._packing import Layout, pack_rows, unpack_digits, word_format
from gvq.compressors.base import Compressor, Health

MANTISSA = (1 << 23) - 1
INF_CODE = 255                     # float32's exponent of Inf and NaN


def _sign_layout(n: int) -> Layout:
    """n sign bits, 8 to a byte."""
    return Layout(n, 0, 0, *word_format(2, False))


class Natural(DeviceKernels, Compressor):
    name = "natural"
    additive = False
    stochastic = True
    ideal_ratio = 32 / 9

    def __init__(self, kernels: str = "auto"):      # auto | triton | torch (gvq/compressors/_kernels.py)
        self.health = Health("max")      # the largest exponent code sent since the last check
        self.init_kernels(kernels)
        self.reseed(0)

    def reseed(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(int(seed))   # seeds new lanes (host), then the lanes run
        self.lanes = DitherLanes()
        # the Triton path's Philox key and the count of values drawn: each call draws at fresh offsets
        self.triton_seed, self.triton_offset = (int(seed) * 0x9E3779B97F4A7C15 + 1) % (1 << 63), 0

    def __getstate__(self):              # its generator travels as bytes
        return {**super().__getstate__(), **draws_as_bytes(self.gen, self.lanes)}

    def __setstate__(self, state):
        self.__dict__.update(state, **draws_from_bytes(state))

    def state_dict(self) -> dict:
        """The generator and lanes: a resumed run draws the uniforms the run would have."""
        return {"gen": self.gen.get_state(), **self.lanes.state_dict(), "triton_seed": self.triton_seed,
                "triton_offset": self.triton_offset}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["gen"])
        self.lanes = DitherLanes()
        self.lanes.load_state_dict(state)
        self.triton_seed = state.get("triton_seed", self.triton_seed)      # absent from older checkpoints
        self.triton_offset = state.get("triton_offset", self.triton_offset)

    def check_health(self) -> None:
        top = self.health.read()
        if top is not None and not top < INF_CODE:
            raise ValueError(f"{self.name}: input gradient has NaN or Inf values (or |values| >= 2^127, which "
                             "round up past float32); refusing to send them")

    def payload_spec(self, seg: slice) -> tuple[torch.dtype, int]:
        n = seg.stop - seg.start
        return torch.uint8, n + _sign_layout(n).nbytes

    def compress(self, x: Tensor, seg: slice) -> Tensor:
        x = x.reshape(-1)
        return COMPRESS(self.path(x.device) if x.numel() else TORCH, self, x, seg)

    def torch_compress(self, x: Tensor, seg: slice) -> Tensor:
        n = x.numel()
        bits = x.reshape(-1).to(torch.float32).contiguous().view(torch.int32)
        u = self.lanes.uniform16(2 * n, x.device, self.gen).view(torch.int32)
        # |bits| + u: a carry out of the mantissa (probability m) bumps the exponent; finite inputs stay
        # below 2^31, Inf/NaN may wrap past it: the masked shift reads 256 there, then capped at 255
        mag = torch.bitwise_and(bits, 0x7FFFFFFF).add_(u.bitwise_and(MANTISSA))
        code = torch.bitwise_right_shift(mag, 23).bitwise_and_(0x1FF).clamp_(max=INF_CODE)
        out = torch.empty(self.payload_spec(seg)[1], dtype=torch.uint8, device=x.device)
        out[:n] = code
        if n:
            self.health.note(code.amax())
            out[n:] = pack_rows(torch.lt(bits, 0).view(1, n), _sign_layout(n))
        return out

    def decompress(self, payload: Tensor, seg: slice) -> Tensor:
        n = seg.stop - seg.start
        if payload.numel() != self.payload_spec(seg)[1] or payload.dtype != torch.uint8:
            raise ValueError(f"{self.name}: payload of {payload.numel()} {payload.dtype} for a segment of {n} "
                             f"values; expected {self.payload_spec(seg)[1]} uint8")
        return DECOMPRESS(self.path(payload.device) if n else TORCH, payload, n)


def _decompress(payload: Tensor, n: int) -> Tensor:
    signs = unpack_digits(payload[n:], _sign_layout(n), n).to(torch.int32)
    bits = payload[:n].to(torch.int32).bitwise_left_shift_(23).bitwise_or_(signs.bitwise_left_shift_(31))
    return bits.view(torch.float32)


# natural compression's calls per path (``_kernels.Op``): the torch reference, and its Triton kernels (one
# launch each); the input as float32, contiguous, where it is not already
COMPRESS = Op(torch=Natural.torch_compress,
              triton=lambda q, x, seg: _triton_grace.natural_compress(q, x.to(torch.float32).contiguous()))
DECOMPRESS = Op(torch=_decompress, triton=_triton_grace.natural_decompress)
