"""The Triton kernels of the re-encode ring's hop (imported only through :mod:`._triton`, which owns the
launches): the received payload decoded, the local segment added and the sum's bucket scales taken in
one program per bucket (the words are then encoded by ``_triton_quant.encode_words``, as a compress
encodes them); fp16's hop in one launch.  Each step is the torch path's decompress, add and compress
in its order, so that, fed the same uniforms, the payload is the same.

See docs/design.md#gvqcompressors_tritonpy for how it works and why.
"""
from __future__ import annotations

import triton
import triton.language as tl

from gvq.compressors._triton_quant import store_half, store_scale


@triton.jit
def digit_places(j, radix, K: tl.constexpr):
    """radix**j for a block of digit places ``j`` (each in [0, K)), int64, without an integer pow."""
    power = (j * 0 + 1).to(tl.int64)
    for i in tl.static_range(K - 1):
        power = tl.where(j > i, power * radix, power)
    return power


@triton.jit
def hop_stats(data_ptr, in_side_ptr, local_ptr, sum_ptr, side_ptr, lim_ptr, numel, bucket, radix, mult, clip,
              STAT: tl.constexpr, CLIP: tl.constexpr, BLOCK: tl.constexpr,
              K: tl.constexpr, WB: tl.constexpr, WBP: tl.constexpr):
    """One program per bucket: each value's digit read from its wire word (a word may straddle two
    buckets: both programs read it, neither writes it), decoded as ``decode_words`` does, the local value
    added in float32 (the ring's ``partial += local``) and written to ``sum``; then the sum's scale
    (and with ``CLIP`` its bound) as ``bucket_stats`` takes it.  The ragged last bucket is masked."""
    row = tl.program_id(0)
    lane = tl.arange(0, BLOCK)
    offs = row * bucket + lane
    real = (offs < numel) & (lane < bucket)
    byte = tl.arange(0, WBP)[None, :]
    raw = tl.load(data_ptr + (offs // K)[:, None] * WB + byte, mask=real[:, None] & (byte < WB), other=0)
    word = tl.sum(raw.to(tl.int64) << (8 * byte), axis=1)
    code = ((word // digit_places(offs % K, radix, K)) % radix).to(tl.float64)
    scale = tl.load(in_side_ptr + row)
    # one rounding of code * step - scale, in float64 where both are exact (decode_words' reason)
    decoded = (code * (scale * mult).to(tl.float64) - scale.to(tl.float64)).to(tl.float32)
    v = tl.where(real, decoded + tl.load(local_ptr + offs, mask=real, other=0.0), 0.0)
    tl.store(sum_ptr + offs, v, mask=real)
    store_scale(v, row, side_ptr, lim_ptr, numel, bucket, clip, STAT, CLIP)


@triton.jit
def fp16_hop(data_ptr, local_ptr, out_ptr, peak_ptr, numel, BLOCK: tl.constexpr):
    """float16 payload + local float32 values, added in float32 and sent as float16 (round to nearest
    even), with the block's max |value| for the range check: fp16's decompress, add and compress."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    real = offs < numel
    v = tl.load(data_ptr + offs, mask=real, other=0.0).to(tl.float32)
    store_half(v + tl.load(local_ptr + offs, mask=real, other=0.0), offs, real, out_ptr, peak_ptr)
