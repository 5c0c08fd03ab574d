"""SparseLoCo's chunked top-k's Triton kernels (set up and launched by :mod:`._triton_grace`; its select is
top-k's, :mod:`._triton_topk`): each chunk's sigma and value cells, both code arrays packed in one launch,
and the decoder's scatter.  Imported only once a kernel runs (it imports triton)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def chunk_codes(val_ptr, scopes_ptr, sigma_ptr, code_ptr, S, clip, per_sigma, CELLS: tl.constexpr,
                BLOCK: tl.constexpr):
    """Chunk s's sigma (the RMS of its k kept values) and each kept value's cell: floor((v / sigma + clip)
    * per_sigma) clamped to [0, CELLS), ``ChunkTopK.compress``'s rule (an all-zero chunk: sigma 0, codes
    of v / 1).  BLOCK holds a chunk's k."""
    s = tl.program_id(0)
    k = tl.load(scopes_ptr + 2 * S + s).to(tl.int32)
    base = tl.load(scopes_ptr + 3 * S + s)
    offs = tl.arange(0, BLOCK)
    m = offs < k
    v = tl.load(val_ptr + base + offs, mask=m, other=0.0)
    sigma = tl.sqrt_rn(tl.div_rn(tl.sum(v * v, axis=0), k.to(tl.float32)))
    safe = tl.where(sigma > 0, sigma, 1.0)
    u = tl.floor((tl.div_rn(v, safe) + clip) * per_sigma)
    code = tl.minimum(tl.maximum(u, 0.0), CELLS - 1).to(tl.int32)
    tl.store(sigma_ptr + s, sigma)
    tl.store(code_ptr + base + offs, code, mask=m)


@triton.jit
def _packed_byte(codes_ptr, j, count, m, BITS: tl.constexpr):
    acc = tl.zeros(j.shape, dtype=tl.int32)
    for t in tl.static_range(8):
        p = j.to(tl.int64) * 8 + t
        slot = p // BITS
        c = tl.load(codes_ptr + slot, mask=m & (slot < count), other=0)
        acc |= ((c >> (p % BITS).to(tl.int32)) & 1) << t
    return acc.to(tl.uint8)


@triton.jit
def pack_two(a_ptr, b_ptr, out_a_ptr, out_b_ptr, count, bytes_a, bytes_b, BITS_A: tl.constexpr,
             BITS_B: tl.constexpr, BLOCK: tl.constexpr):
    """:func:`pack_indices` of two code arrays of ``count`` each (the value cells, the offsets) in one
    launch: a program writes bytes j of both."""
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_a_ptr + j, _packed_byte(a_ptr, j, count, j < bytes_a, BITS_A), mask=j < bytes_a)
    tl.store(out_b_ptr + j, _packed_byte(b_ptr, j, count, j < bytes_b, BITS_B), mask=j < bytes_b)


@triton.jit
def _unpacked(packed_ptr, slot, m, BITS: tl.constexpr):
    out = tl.zeros(slot.shape, dtype=tl.int64)
    for t in tl.static_range(BITS):
        p = slot * BITS + t
        byte = tl.load(packed_ptr + p // 8, mask=m, other=0).to(tl.int64)
        out |= ((byte >> (p % 8)) & 1) << t
    return out


@triton.jit
def chunk_scatter(sigma_ptr, codes_ptr, idx_ptr, levels_ptr, scopes_ptr, out_ptr, S, BITS: tl.constexpr,
                  IDX_BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Chunk s's kept values, sigma * level[cell], into ``out`` (zero-filled before) at the chunk's
    start + offset; an offset past the chunk (a payload not of this layout) is dropped."""
    s = tl.program_id(0)
    start = tl.load(scopes_ptr + s)
    length = tl.load(scopes_ptr + S + s)
    k = tl.load(scopes_ptr + 2 * S + s).to(tl.int32)
    base = tl.load(scopes_ptr + 3 * S + s)
    sigma = tl.load(sigma_ptr + s)
    offs = tl.arange(0, BLOCK)
    for j in range(0, k, BLOCK):
        m = j + offs < k
        slot = base + j + offs
        local = _unpacked(idx_ptr, slot, m, IDX_BITS)
        level = tl.load(levels_ptr + _unpacked(codes_ptr, slot, m, BITS), mask=m, other=0.0)
        tl.store(out_ptr + start + local, sigma * level, mask=m & (local >= 0) & (local < length))
