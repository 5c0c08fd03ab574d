"""Simple compressors for engine tests: an additive one (a fixed orthogonal projection per unit)
and non-additive ones (fp16 cast, scaled sign)."""
from __future__ import annotations

import torch

from gvq.compressors.base import Compressor


class Projection(Compressor):
    """x -> Q^T x per unit of ``unit`` values (Q: unit x d, orthonormal columns, same on all ranks).
    Linear, hence additive: sum_n Q^T x_n = Q^T sum_n x_n."""

    additive = True
    name = "projection"

    def __init__(self, unit: int = 8, d: int = 3, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.unit, self.d = unit, d
        self.Q = torch.linalg.qr(torch.randn(unit, d, generator=g, dtype=torch.float64))[0].float()

    def cuts(self, numel):
        assert numel % self.unit == 0
        return list(range(0, numel + 1, self.unit))

    def payload_spec(self, seg):
        return torch.float32, (seg.stop - seg.start) // self.unit * self.d

    def compress(self, x, seg):
        return (x.reshape(-1, self.unit) @ self.Q).reshape(-1)

    def decompress(self, payload, seg):
        return (payload.reshape(-1, self.d) @ self.Q.T).reshape(-1)


class Half(Compressor):
    """fp16 cast: a lossy, non-additive format (declared so, to exercise the re-encode ring)."""

    name = "half"

    def payload_spec(self, seg):
        return torch.float16, seg.stop - seg.start

    def compress(self, x, seg):
        return x.half()

    def decompress(self, payload, seg):
        return payload.float()


class Sign(Compressor):
    """Scaled sign per unit: mean |x| * sign(x); payload = int8 signs + one float per unit, as bytes."""

    name = "sign"

    def __init__(self, unit: int = 4):
        self.unit = unit

    def cuts(self, numel):
        return sorted(set(range(0, numel, self.unit)) | {numel})

    def payload_spec(self, seg):
        n = seg.stop - seg.start
        return torch.uint8, n + 4 * (-(-n // self.unit))

    def compress(self, x, seg):
        n = x.numel()
        units = -(-n // self.unit)
        pad = torch.zeros(units * self.unit)
        pad[:n] = x
        scale = pad.view(units, self.unit).abs().sum(1) / torch.tensor(
            [min(self.unit, n - i * self.unit) for i in range(units)], dtype=torch.float32)
        signs = torch.sign(x).to(torch.int8).view(torch.uint8)
        return torch.cat([scale.view(torch.uint8), signs])  # floats first: aligned views

    def decompress(self, payload, seg):
        n = seg.stop - seg.start
        units = -(-n // self.unit)
        scale = payload[: 4 * units].view(torch.float32)
        signs = payload[4 * units:].view(torch.int8).float()
        return signs * scale.repeat_interleave(self.unit)[:n]
