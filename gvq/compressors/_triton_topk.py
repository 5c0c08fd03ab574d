"""Top-k's Triton kernels (set up and launched by :mod:`._triton_grace`): a program per scope finds the
k-th largest |v| by a bitwise binary search and compacts the kept values in index order; the packed index
writer; the decoder's zero-fill and scatter.  Imported only once a kernel runs (it imports triton)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def abs_bits(x_ptr, at, mask, lo, hi):
    """float32 |v|'s bits as int32 (monotone in |v| for non-negative floats; NaN above Inf), and v; a value
    whose bits fall outside [lo, hi] reads as +0.0 (DGC's non-candidates; top-k's [0, 2^31 - 1] is all)."""
    v = tl.load(x_ptr + at, mask=mask, other=0.0)
    bits = v.to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF
    ok = (bits >= lo) & (bits <= hi)
    return tl.where(ok, bits, 0), tl.where(ok, v, 0.0)


@triton.jit
def _count_at_least(x_ptr, start, length, cand, offs, lo, hi, BLOCK: tl.constexpr):
    count = tl.zeros((), dtype=tl.int32)
    for i in range(0, length, BLOCK):
        m = i + offs < length
        bits, _ = abs_bits(x_ptr, start + i + offs, m, lo, hi)
        count += tl.sum(((bits >= cand) & m).to(tl.int32), axis=0)
    return count


@triton.jit
def topk_select(x_ptr, scopes_ptr, idx_ptr, val_ptr, S, BLOCK: tl.constexpr):
    """Scope s (``scopes``: start, length, k, first slot; (4, S) int64) keeps the k largest |v|'s bits:
    every value above the threshold T (the largest with count(bits >= T) >= k) and, among those equal to
    T, the lowest indices; slots written in index order, the index scope-local (int32)."""
    s = tl.program_id(0)
    start = tl.load(scopes_ptr + s)
    length = tl.load(scopes_ptr + S + s).to(tl.int32)
    k = tl.load(scopes_ptr + 2 * S + s).to(tl.int32)
    base = tl.load(scopes_ptr + 3 * S + s)
    select_scope(x_ptr, start, length, k, base, idx_ptr, val_ptr, 0, 0x7FFFFFFF, BLOCK)


@triton.jit
def select_scope(x_ptr, start, length, k, base, idx_ptr, val_ptr, lo, hi, BLOCK: tl.constexpr):
    """One scope's top-k (:func:`topk_select`) among the values whose |v|'s bits lie in [lo, hi], every
    other value read as +0.0 (so it can fill a slot only where fewer than k are in range)."""
    offs = tl.arange(0, BLOCK)
    thr = tl.zeros((), dtype=tl.int32)
    for r in range(31):                  # bit 30 down to 0: bit 31 (the sign) is cleared
        cand = thr | (tl.full((), 1, tl.int32) << (30 - r))
        thr = tl.where(_count_at_least(x_ptr, start, length, cand, offs, lo, hi, BLOCK) >= k, cand, thr)
    above = tl.zeros((), dtype=tl.int32)
    for i in range(0, length, BLOCK):
        m = i + offs < length
        bits, _ = abs_bits(x_ptr, start + i + offs, m, lo, hi)
        above += tl.sum(((bits > thr) & m).to(tl.int32), axis=0)
    need = k - above                     # ties at T kept, lowest index first
    kept = tl.zeros((), dtype=tl.int32)
    ties = tl.zeros((), dtype=tl.int32)
    for i in range(0, length, BLOCK):
        m = i + offs < length
        bits, v = abs_bits(x_ptr, start + i + offs, m, lo, hi)
        eq = ((bits == thr) & m).to(tl.int32)
        keep = ((bits > thr) & m) | ((eq != 0) & (ties + tl.cumsum(eq, axis=0) - eq < need))
        keep_i = keep.to(tl.int32)
        slot = base + kept + tl.cumsum(keep_i, axis=0) - keep_i
        keep = keep & (slot < base + k)      # never past the scope's slots, whatever the floats
        tl.store(idx_ptr + slot, (i + offs).to(tl.int32), mask=keep)
        tl.store(val_ptr + slot, v.to(val_ptr.dtype.element_ty), mask=keep)
        kept += tl.sum(keep_i, axis=0)
        ties += tl.sum(eq, axis=0)


@triton.jit
def pack_indices(codes_ptr, out_ptr, count, nbytes, BITS: tl.constexpr, BLOCK: tl.constexpr):
    """``_packing.pack_bits``: each int32 code's BITS bits least significant first, back to back."""
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = j < nbytes
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for t in tl.static_range(8):
        p = j.to(tl.int64) * 8 + t
        slot = p // BITS
        c = tl.load(codes_ptr + slot, mask=m & (slot < count), other=0)
        acc |= ((c >> (p % BITS).to(tl.int32)) & 1) << t
    tl.store(out_ptr + j, acc.to(tl.uint8), mask=m)


@triton.jit
def zero_fill(out_ptr, n, BLOCK: tl.constexpr):
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + at, tl.zeros((BLOCK,), dtype=tl.float32), mask=at < n)


@triton.jit
def topk_scatter(idx_ptr, val_ptr, scopes_ptr, out_ptr, S, BITS: tl.constexpr, PACKED: tl.constexpr,
                 BLOCK: tl.constexpr):
    """Scope s's kept values into ``out`` (zero-filled before), each at its scope start + its index
    (int32, or BITS bits each at ``idx_ptr``'s bytes where PACKED); an index past its scope (a payload
    not of this layout) is dropped, never written out of bounds."""
    s = tl.program_id(0)
    start = tl.load(scopes_ptr + s)
    length = tl.load(scopes_ptr + S + s)
    k = tl.load(scopes_ptr + 2 * S + s).to(tl.int32)
    base = tl.load(scopes_ptr + 3 * S + s)
    offs = tl.arange(0, BLOCK)
    for j in range(0, k, BLOCK):
        m = j + offs < k
        slot = base + j + offs
        if PACKED:
            local = tl.zeros((BLOCK,), dtype=tl.int64)
            for t in tl.static_range(BITS):
                p = slot * BITS + t
                byte = tl.load(idx_ptr + p // 8, mask=m, other=0).to(tl.int64)
                local |= ((byte >> (p % 8)) & 1) << t
        else:
            local = tl.load(idx_ptr + slot, mask=m, other=0).to(tl.int64)
        v = tl.load(val_ptr + slot, mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + start + local, v, mask=m & (local >= 0) & (local < length))
