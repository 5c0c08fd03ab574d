"""SparseLoCo's chunked top-k (Sarfi et al. 2025; templar's ``TopKCompressor``): the vector in chunks of
``chunk`` values (4,096), the k (64, 1.6%) of largest |v| in each, their offsets in 12 bits, their values in
2 bits.  ``python cli.py experiment=lm_compare method=diloco aggregator=topk_chunk`` (on DiLoCo's Δ, error
feedback with decay 0.95: conf/aggregator/topk_chunk.yaml); per step as well (``aggregator=topk_chunk``).

Selection is top-k's ``bucket`` scope (:class:`gvq.compressors.topk.TopK`, bucket = chunk): exactly the k
largest |v| of each chunk, ties to the lower index.  A last, shorter chunk keeps max(1, floor(k * len /
chunk)), top-k's density.  Chunks run over the segment's flat values, across parameter boundaries
(templar chunks each tensor apart; a chunk here is the unit of the payload, not of the model).

Values: sigma is per chunk, the RMS of its kept values (templar takes one per tensor: the std of the
tensor's kept values about their mean).  Each kept value is clipped to [-clip*sigma, clip*sigma] (clip = 6)
and coded in ``bits`` bits as the cell of 2^bits equal cells over that range it falls in, decoded to the
cell's midpoint: level_j = sigma * clip * ((2j + 1) / 2^bits - 1), for 2 bits +-1.5 sigma and +-4.5 sigma.
(templar's ``quantization_range: 6`` spans 6 sigma in all, +-3 about the mean, and decodes to each bin's
mean, four more floats a tensor: set clip=3 for its width.)  A chunk whose kept values are all zero has
sigma 0 and decodes to zeros; a NaN or inf makes its chunk's sigma non-finite, which the run's guard sees.

Payload, one uint8 tensor of fixed size: the chunks' sigmas (float32, one a chunk), the value codes packed
at ``bits`` bits, then the offsets packed at ceil(log2 chunk) bits (12), back to back
(:func:`gvq.compressors._packing.pack_bits`): 4 * chunks + ceil(K * bits / 8) + ceil(K * 12 / 8) bytes for
K kept values, i.e. 4 + k * 14 / 8 = 116 a chunk where k * bits and k * 12 are whole bytes (k = 64).  Not
additive: all-gathered, each rank decoding every rank's payload.

Kernels (``kernels``): the torch ops here are the reference; the Triton path
(:mod:`gvq.compressors._triton_grace`: 3 launches to compress, 2 to decompress) keeps the same set, writes
its slots in index order (the torch path's are best first) and sums each chunk's squares in another order,
so its sigmas may differ in the last bits; either path decodes the other's payload.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gvq.compressors import _packing, _triton_grace
from gvq.compressors._kernels import Op
from gvq.compressors.base import check_int
from gvq.compressors._topk_plan import Plan
from gvq.compressors.topk import TopK


def check_span(clip) -> float:
    ok = isinstance(clip, (int, float)) and not isinstance(clip, bool) and math.isfinite(clip) and clip > 0
    if not ok:
        raise ValueError(f"clip={clip!r}: must be a finite number > 0 (values clipped to +-clip*sigma of their chunk)")
    return float(clip)


class ChunkTopK(TopK):
    name = "topk_chunk"
    additive = False
    stochastic = False

    def __init__(self, k: int = 64,             # values kept per chunk; lower => fewer bytes, more error
                 chunk: int = 4096,           # values per chunk; larger => longer offsets, k spread less evenly
                 bits: int = 2,               # bits per kept value; lower => fewer bytes, coarser levels
                 clip: float = 6.0,           # levels span +-clip*sigma; lower => finer levels, more clipped
                 kernels: str = "auto"):      # auto | triton | torch (gvq/compressors/_kernels.py)
        self.chunk = check_int("chunk", chunk, 2, 1 << 24)
        self.k = check_int("k", k, 1, chunk, " (values kept per chunk, at most chunk)")
        self.bits = check_int("bits", bits, 1, 8)
        self.clip = check_span(clip)
        super().__init__(ratio=k / chunk, scope="bucket", bucket=chunk, values="float32", indices="packed",
                         kernels=kernels)
        self.ideal_ratio = 32.0 * chunk / (k * (bits + max(1, (chunk - 1).bit_length())) + 32)

    def keep(self, length: int) -> int:
        return max(1, self.k * length // self.chunk)     # integers: exactly k in a whole chunk

    def layout_bytes(self, plan: Plan) -> tuple[int, int, int]:
        """(sigma, value-code, offset) bytes of a payload."""
        return 4 * len(plan.ks), -(-plan.k * self.bits // 8), -(-plan.k * plan.bits // 8)

    def payload_spec(self, seg: slice) -> tuple[torch.dtype, int]:
        return torch.uint8, sum(self.layout_bytes(self.plan(seg)))

    def _build_const(self, plan: Plan, device) -> dict[str, Tensor]:
        c = super()._build_const(plan, device)
        c["row"] = c["slot_start"] // self.chunk                 # each kept slot's chunk
        c["count"] = torch.tensor(plan.ks, dtype=torch.float32, device=device)
        steps = torch.arange(1 << self.bits, dtype=torch.float32, device=device)
        c["levels"] = self.clip * ((2 * steps + 1) / (1 << self.bits) - 1)    # in units of sigma
        return c

    def levels(self, seg: slice, device) -> Tensor:
        """The 2^bits decoded levels in units of sigma (float32, the plan's constant on ``device``)."""
        return self._const(seg, device)["levels"]

    def compress(self, x: Tensor, seg: slice) -> Tensor:
        x = x.reshape(-1)
        if self.plan(seg).n == 0:
            return torch.empty(0, dtype=torch.uint8, device=x.device)
        return COMPRESS(self.path(x.device), self, x, seg)

    def decompress(self, payload: Tensor, seg: slice) -> Tensor:
        if self.plan(seg).n == 0:
            return torch.zeros(0, dtype=torch.float32, device=payload.device)
        return DECOMPRESS(self.path(payload.device), self, payload, seg)

    def torch_compress(self, x: Tensor, seg: slice) -> Tensor:
        plan, c = self.plan(seg), self._const(seg, x.device)
        pos = self.select(x, seg)
        vals = x[pos].to(torch.float32)
        sq = torch.zeros(len(plan.ks), dtype=torch.float32, device=x.device).index_add_(0, c["row"], vals * vals)
        sigma = sq.div_(c["count"]).sqrt_()
        safe = torch.where(sigma > 0, sigma, torch.ones_like(sigma))         # all-zero chunk: codes of 0, sent as 0
        cells = 1 << self.bits       # cell j covers [-clip + j * w, -clip + (j + 1) * w) sigmas, w = 2 clip / cells
        u = (vals / safe[c["row"]] + self.clip) * (cells / (2 * self.clip))
        codes = u.floor_().clamp_(0, cells - 1).to(torch.int64)             # clamp: the clip at +-clip*sigma
        local = pos - c["slot_start"]
        return torch.cat([sigma.view(torch.uint8), _packing.pack_bits(codes, self.bits),
                          _packing.pack_bits(local, plan.bits)])

    def unpack(self, payload: Tensor, seg: slice) -> tuple[Tensor, Tensor]:
        """(positions relative to the segment, int64; decoded values, float32) of a payload."""
        plan, payload = self.plan(seg), self.checked(payload, seg)
        c = self._const(seg, payload.device)
        side, vbytes, _ = self.layout_bytes(plan)
        sigma = payload[:side].view(torch.float32)
        codes = _packing.unpack_bits(payload[side: side + vbytes], self.bits, plan.k)
        local = _packing.unpack_bits(payload[side + vbytes:], plan.bits, plan.k)
        return local + c["slot_start"], sigma[c["row"]] * c["levels"][codes]


# chunked top-k's calls per path (``_kernels.Op``): the torch reference, and its Triton kernels; the input as
# contiguous float32 for the kernels, where it is not already
COMPRESS = Op(torch=ChunkTopK.torch_compress,
              triton=lambda q, x, seg: _triton_grace.chunk_compress(q, x.to(torch.float32).contiguous(), seg))
DECOMPRESS = Op(torch=ChunkTopK.torch_decompress, triton=_triton_grace.chunk_decompress)
