"""Random-k's Triton kernels (set up and launched by :mod:`._triton_grace`): a program per bucket hashes its
positions as :func:`gvq.compressors.randomk._mix64` does and finds the k smallest hashes by a bitwise binary
search (hashes of distinct positions are distinct: the hash is a bijection of the counter), written in
index order; the gather (values, scaled, and each bucket's sum for the health check) and the decoder's
scatter.  Imported only once a kernel runs (it imports triton)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _ordered_hash(counter, key):
    """``_mix64(counter * GOLDEN + key)`` as uint64 whose unsigned order is the int64 hash's signed order
    (the sign bit flipped): what ``torch.topk(..., largest=False)`` ranks."""
    z = counter.to(tl.uint64) * 0x9E3779B97F4A7C15 + key.to(tl.uint64)
    z ^= z >> 33
    z *= 0xFF51AFD7ED558CCD
    z ^= z >> 33
    z *= 0xC4CEB9FE1A85EC53
    z ^= z >> 33
    return z ^ 0x8000000000000000


@triton.jit
def _count_at_most(start, length, base, key, cand, offs, BLOCK: tl.constexpr):
    count = tl.zeros((), dtype=tl.int32)
    for i in range(0, length, BLOCK):
        m = i + offs < length
        h = _ordered_hash(base + start + i + offs.to(tl.int64), key)
        count += tl.sum(((h <= cand) & m).to(tl.int32), axis=0)
    return count


@triton.jit
def _bucket(table_ptr, S, s):
    """Bucket s's row of ``table`` ((4, S) int64): its start in the segment, its length and k (int32), and its
    first slot."""
    return (tl.load(table_ptr + s), tl.load(table_ptr + S + s).to(tl.int32),
            tl.load(table_ptr + 2 * S + s).to(tl.int32), tl.load(table_ptr + 3 * S + s))


@triton.jit
def randomk_select(table_ptr, pos_ptr, seg_start, key, S, BLOCK: tl.constexpr):
    """Bucket s (``table``: start in the segment, length, k, first slot; (4, S) int64): the positions (in
    the segment, int64) of its k smallest hashes of (key, position in the vector), in index order."""
    s = tl.program_id(0)
    start, length, k, first = _bucket(table_ptr, S, s)
    offs = tl.arange(0, BLOCK)
    one = tl.full((), 1, tl.uint64)
    thr = tl.zeros((), dtype=tl.uint64)       # the k-th smallest: the least T with count(h <= T) >= k
    for r in range(64):
        bit = one << (63 - r)
        low = thr | (bit - one)               # the largest hash with thr's higher bits and this bit 0
        thr = tl.where(_count_at_most(start, length, seg_start, key, low, offs, BLOCK) >= k, thr, thr | bit)
    kept = tl.zeros((), dtype=tl.int32)
    for i in range(0, length, BLOCK):
        m = i + offs < length
        at = start + i + offs.to(tl.int64)
        keep = (_ordered_hash(seg_start + at, key) <= thr) & m
        keep_i = keep.to(tl.int32)
        slot = kept + tl.cumsum(keep_i, axis=0) - keep_i
        tl.store(pos_ptr + first + slot, at, mask=keep & (slot < k))
        kept += tl.sum(keep_i, axis=0)


@triton.jit
def randomk_gather(x_ptr, pos_ptr, table_ptr, scale_ptr, out_ptr, sums_ptr, S, SCALE: tl.constexpr,
                   BLOCK: tl.constexpr):
    """Bucket s's k values at its positions (float32; times its n/k where SCALE), and the sum of all its
    values (float32) into ``sums`` for the health check."""
    s = tl.program_id(0)
    start, length, k, first = _bucket(table_ptr, S, s)
    offs = tl.arange(0, BLOCK)
    for j in range(0, k, BLOCK):
        m = j + offs < k
        at = tl.load(pos_ptr + first + j + offs, mask=m, other=0)
        v = tl.load(x_ptr + at, mask=m, other=0.0).to(tl.float32)
        if SCALE:
            v = v * tl.load(scale_ptr + s)
        tl.store(out_ptr + first + j + offs, v, mask=m)
    total = tl.zeros((), dtype=tl.float32)
    for i in range(0, length, BLOCK):
        m = i + offs < length
        total += tl.sum(tl.load(x_ptr + start + i + offs, mask=m, other=0.0).to(tl.float32), axis=0)
    tl.store(sums_ptr + s, total)


@triton.jit
def randomk_scatter(vals_ptr, pos_ptr, out_ptr, count, BLOCK: tl.constexpr):
    """Each kept value (float32) into ``out`` (zero-filled before) at its position."""
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = j < count
    at = tl.load(pos_ptr + j, mask=m, other=0)
    tl.store(out_ptr + at, tl.load(vals_ptr + j, mask=m, other=0.0).to(tl.float32), mask=m)
