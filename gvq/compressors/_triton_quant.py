"""The Triton kernels of the scalar quantizers and fp16 (imported only through :mod:`._triton`, which owns
the launches, so that gvq imports without Triton).  Each mirrors the torch device path's arithmetic op for
op (``_batch.compress_batch``), so that, fed the same uniforms, both give the same codes.

See docs/design.md#gvqcompressors_tritonpy for how it works and why.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def bucket_stats(x_ptr, side_ptr, lim_ptr, numel, bucket, clip,
                 STAT: tl.constexpr, CLIP: tl.constexpr, BLOCK: tl.constexpr):
    """One program per bucket: its scale (``side``), and with ``CLIP`` its bound c * RMS (``lim``).  The
    ragged last bucket is masked: a masked 0 counts nowhere, as the torch path's zero padding."""
    row = tl.program_id(0)
    offs = row * bucket + tl.arange(0, BLOCK)
    real = (offs < numel) & (tl.arange(0, BLOCK) < bucket)
    v = tl.load(x_ptr + offs, mask=real, other=0.0)
    store_scale(v, row, side_ptr, lim_ptr, numel, bucket, clip, STAT, CLIP)


@triton.jit
def store_scale(v, row, side_ptr, lim_ptr, numel, bucket, clip, STAT: tl.constexpr, CLIP: tl.constexpr):
    """Bucket ``row``'s scale of its values ``v`` (0 where masked) into ``side_ptr[row]``, and with
    ``CLIP`` its bound c * RMS into ``lim_ptr[row]``: :func:`bucket_stats`'s and the ring hop's."""
    count = tl.minimum(bucket, numel - row * bucket).to(tl.float32)
    inv_count = tl.div_rn(1.0, count)              # the torch path's reciprocal_: correctly rounded
    bad = tl.sum(v - v, axis=0)                    # NaN iff a value is NaN/Inf, whatever max does with NaN
    if CLIP:
        lim = tl.sqrt_rn(tl.sum(v * v, axis=0)) * (tl.sqrt_rn(inv_count) * clip)
        v = tl.minimum(tl.maximum(v, -lim), lim)
        tl.store(lim_ptr + row, lim)
    if STAT == 0:
        stat = tl.sqrt_rn(tl.sum(v * v, axis=0))
    elif STAT == 1:
        stat = tl.max(tl.abs(v), axis=0)
    else:
        stat = tl.sum(tl.abs(v), axis=0) * inv_count
    tl.store(side_ptr + row, stat + bad)


@triton.jit
def encode_words(x_ptr, side_ptr, lim_ptr, u_ptr, out_ptr, numel, bucket, n_words,
                 radix, value, base, top, seed, offset,
                 SIGN: tl.constexpr, CLIP: tl.constexpr, HAS_U: tl.constexpr,
                 K: tl.constexpr, KP: tl.constexpr, WB: tl.constexpr, WBP: tl.constexpr, BLOCK_W: tl.constexpr):
    """A block of wire words: each value's code, ``floor(u + base + value * v / side)`` capped at ``top``
    (``SIGN``: v >= 0), its bucket's scale read where the value lies, so a word may straddle two buckets;
    K codes a word by the radix's powers, written as WB little-endian bytes.  ``u`` drawn in-kernel from
    Philox at (seed, offset + value index) unless ``HAS_U`` (a test's uniforms)."""
    w = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)[:, None]
    j = tl.arange(0, KP)[None, :]
    idx = w * K + j
    real = (j < K) & (idx < numel)
    v = tl.load(x_ptr + idx, mask=real, other=0.0)
    b = idx // bucket
    if CLIP:
        lim = tl.load(lim_ptr + b, mask=real, other=1.0)
        v = tl.minimum(tl.maximum(v, -lim), lim)
    if SIGN:
        code = (v >= 0).to(tl.int64)
    else:
        if HAS_U:
            u = tl.load(u_ptr + idx, mask=real, other=0.0)
        else:
            u = tl.rand(seed, offset + idx.to(tl.int64))
        # the CPU addcdiv's order, (value * v) / side, correctly rounded: this decides the level
        y = (u + base) + tl.div_rn(value * v, tl.load(side_ptr + b, mask=real, other=1.0))
        y = tl.where(y < top, y, top)              # fmin: a NaN (0 / 0, an all-zero bucket) is the top code
        code = y.to(tl.int32).to(tl.int64)
    code = tl.where(real, code, 0)                 # the last word zero-padded, as the host path packs it
    word = tl.sum(code * radix_powers(j, radix, KP), axis=1)
    store_bytes(out_ptr, w, word, n_words, WB, WBP)


@triton.jit
def radix_powers(j, radix, KP: tl.constexpr):
    """radix**j (j a (1, KP) row of digit places), int64, without an integer pow."""
    power = tl.full((1, KP), 1, tl.int64)
    for i in tl.static_range(KP - 1):
        power = tl.where(j > i, power * radix, power)
    return power


@triton.jit
def store_bytes(out_ptr, w, word, n_words, WB: tl.constexpr, WBP: tl.constexpr):
    byte = tl.arange(0, WBP)[None, :]
    bits = (word[:, None] >> (8 * byte)) & 0xFF
    tl.store(out_ptr + w * WB + byte, bits.to(tl.uint8), mask=(w < n_words) & (byte < WB))


@triton.jit
def read_digits(data_ptr, numel, n_words, radix, K: tl.constexpr, KP: tl.constexpr, WB: tl.constexpr,
                WBP: tl.constexpr, BLOCK_W: tl.constexpr):
    """This program's block of wire words as (value index, real, digit) rows of K digits each: what
    every decode kernel reads before it maps digits to values."""
    w = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)[:, None]
    byte = tl.arange(0, WBP)[None, :]
    raw = tl.load(data_ptr + w * WB + byte, mask=(w < n_words) & (byte < WB), other=0)
    word = tl.sum(raw.to(tl.int64) << (8 * byte), axis=1)[:, None]
    j = tl.arange(0, KP)[None, :]
    idx = w * K + j
    real = (j < K) & (idx < numel)
    return idx, real, (word // radix_powers(j, radix, KP)) % radix


@triton.jit
def decode_words(data_ptr, side_ptr, out_ptr, numel, bucket, n_words, radix, mult,
                 K: tl.constexpr, KP: tl.constexpr, WB: tl.constexpr, WBP: tl.constexpr, BLOCK_W: tl.constexpr):
    """A block of wire words back to values: digit k of each word, ``code * (side * mult) - side``
    rounded once (the torch path's addcmul)."""
    idx, real, code = read_digits(data_ptr, numel, n_words, radix, K, KP, WB, WBP, BLOCK_W)
    code = code.to(tl.float64)
    side = tl.load(side_ptr + idx // bucket, mask=real, other=0.0)
    # torch's CPU addcmul is one fused multiply-add; the interpreter's tl.fma rounds twice: in float64
    # the product and the difference are exact, so one rounding to float32 is the fma's, everywhere
    step = (side * mult).to(tl.float64)
    tl.store(out_ptr + idx, (code * step - side.to(tl.float64)).to(tl.float32), mask=real)


@triton.jit
def fp16_encode(x_ptr, out_ptr, peak_ptr, numel, BLOCK: tl.constexpr):
    """float32 -> float16 (round to nearest even, as torch's cast), and the block's max |value| (NaN
    where a value is not finite) for the iteration's range check."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    real = offs < numel
    store_half(tl.load(x_ptr + offs, mask=real, other=0.0), offs, real, out_ptr, peak_ptr)


@triton.jit
def store_half(v, offs, real, out_ptr, peak_ptr):
    """``v`` as float16 at ``offs``, and the block's max |value| (NaN where one is not finite):
    :func:`fp16_encode`'s and the ring hop's."""
    tl.store(out_ptr + offs, v.to(tl.float16), mask=real)
    tl.store(peak_ptr + tl.program_id(0), tl.max(tl.abs(v), axis=0) + tl.sum(v - v, axis=0))


@triton.jit
def fp16_decode(data_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    real = offs < numel
    tl.store(out_ptr + offs, tl.load(data_ptr + offs, mask=real, other=0.0).to(tl.float32), mask=real)
