"""The honest 16-bit baseline: every value sent as IEEE float16 (2 bytes; ratio 2).

Not additive in our protocol (like the quantizers, a ring hop decodes, adds in float32, re-encodes: summing
float16 payloads would round each partial sum to 11 bits and can overflow).  Values beyond float16's range
(|v| > 65504) raise ``ValueError`` at the iteration's check (``check_health``) rather than pass unseen;
magnitudes under 6e-8 flush to zero and under 6e-5 lose precision (subnormals) -- the real cost of a 16-bit
wire.  NaN/Inf inputs raise.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gvq.compressors import _triton
from gvq.compressors.base import Compressor, Health, untimed
from gvq.compressors._kernels import TORCH, TRITON, DeviceKernels, Op

FP16_MAX = 65504.0


class FP16(DeviceKernels, Compressor):
    name = "fp16"
    additive = False
    stochastic = False
    ideal_ratio = 2.0
    max_abs = FP16_MAX

    def __init__(self, kernels: str = "auto"):      # auto | triton | torch (gvq/compressors/_kernels.py)
        self.health = Health("max")       # the largest |value| sent since the last check
        self.init_kernels(kernels)

    def check_health(self) -> None:
        peak = self.health.read()
        if peak is not None and not peak <= FP16_MAX:
            what = "NaN or Inf values" if peak != peak or peak == float("inf") else f"|value| {peak:.4g}"
            raise ValueError(f"{self.name}: input gradient has {what}, beyond float16's range ({FP16_MAX:g}); "
                             "scale the gradient (e.g. divide by the world size) before sending")

    def payload_spec(self, seg: slice) -> tuple[torch.dtype, int]:
        return torch.uint8, 2 * (seg.stop - seg.start)

    def compress(self, x: Tensor, seg: slice) -> Tensor:
        x = x if x.dim() == 1 else x.reshape(-1)
        return COMPRESS(self.path(x.device) if x.numel() else TORCH, x, self.health)

    def reencode_sum(self, payload: Tensor, local: Tensor, seg: slice, stopwatch=untimed) -> Tensor:
        """The ring hop in one launch on the Triton path (timed as ``compress``), else the base's three
        calls."""
        n = seg.stop - seg.start
        if not (n and self.path(payload.device) == TRITON):
            return super().reencode_sum(payload, local, seg, stopwatch)
        self._check(payload, n)
        with stopwatch("compress"):
            payload = payload.clone() if payload.storage_offset() % 2 else payload
            return _triton.fp16_reencode_sum(payload, local.reshape(-1).to(torch.float32).contiguous(), self.health)

    def _check(self, payload: Tensor, n: int) -> None:
        if payload.numel() != 2 * n or payload.dtype != torch.uint8:
            raise ValueError(f"{self.name}: payload of {payload.numel()} {payload.dtype} for a segment of "
                             f"{n} values; expected {2 * n} uint8")

    def decompress(self, payload: Tensor, seg: slice) -> Tensor:
        n = seg.stop - seg.start
        self._check(payload, n)
        if payload.storage_offset() % 2:
            payload = payload.clone()
        return DECOMPRESS(self.path(payload.device) if n else TORCH, payload)


def _compress(x: Tensor, health: Health) -> Tensor:
    if x.numel():                  # min and max in one pass (NaN propagates): max |x| at the check
        for bound in torch.aminmax(x):
            health.note(bound)
    return x.to(torch.float16).view(torch.uint8)


# fp16's calls per path (``_kernels.Op``): the torch reference, and its Triton kernels (one launch each)
COMPRESS = Op(torch=_compress, triton=lambda x, health: _triton.fp16_compress(x.to(torch.float32).contiguous(), health))
DECOMPRESS = Op(torch=lambda payload: payload.view(torch.float16).to(torch.float32), triton=_triton.fp16_decompress)
