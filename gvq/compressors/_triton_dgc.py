"""DGC's Triton kernels (set up and launched by :mod:`._dgc_triton`): a program per sparse scope finds its
sampled threshold, counts the ten tries in one pass and keeps the first that reaches ceil(0.8 k), then runs
top-k's select (:func:`._triton_topk.select_scope`) on the candidates alone; a program per run of values
copies the dense parts out (and sums its run for the health check) or, decoding, writes them back and
zeroes the rest.  Imported only once a kernel runs (it imports triton)."""
from __future__ import annotations

import triton
import triton.language as tl

from gvq.compressors._triton_topk import abs_bits, select_scope

INF = 0x7F800000             # float32 inf's bits: a NaN's (its sign cleared) are larger
TRIES = 10                   # dgc.TRIES: the thresholds t, 0.8 t, ..., 0.8^9 t
ALL = 0x7FFFFFFF             # every value's |v| bits are at most this: no value is masked


@triton.jit
def _sample_threshold(x_ptr, start, count, stride, offset, rank, BLOCK: tl.constexpr):
    """The bits of the (rank + 1)-th largest |v| of the scope's sample (every stride-th value from
    ``offset``, ``count`` of them): the largest T with at least rank + 1 sampled bits >= T (NaN ranks top,
    as ``torch.topk`` ranks it)."""
    offs = tl.arange(0, BLOCK)
    thr = tl.zeros((), dtype=tl.int32)
    for r in range(31):
        cand = thr | (tl.full((), 1, tl.int32) << (30 - r))
        seen = tl.zeros((), dtype=tl.int32)
        for i in range(0, count, BLOCK):
            m = i + offs < count
            bits, _ = abs_bits(x_ptr, start + offset + (i + offs).to(tl.int64) * stride, m, 0, ALL)
            seen += tl.sum(((bits >= cand) & m).to(tl.int32), axis=0)
        thr = tl.where(seen >= rank + 1, cand, thr)
    return thr


@triton.jit
def _adapted_floor(x_ptr, start, length, t, shrink_ptr, need, BLOCK: tl.constexpr):
    """The kept try's bits: each try's count of |v| >= 0.8^j t (NaN counted by none), in one pass; the first
    reaching ``need``, else the last.  A NaN threshold's tries sit past inf: no number clears them."""
    js = tl.arange(0, 16)
    shrink = tl.load(shrink_ptr + js, mask=js < TRIES, other=1.0)
    tries = (t.to(tl.float32, bitcast=True) * shrink).to(tl.int32, bitcast=True)
    tries = tl.where(t > INF, INF + 1, tl.minimum(tries, INF + 1))
    offs = tl.arange(0, BLOCK)
    counts = tl.zeros((16,), dtype=tl.int32)
    for i in range(0, length, BLOCK):
        m = i + offs < length
        bits, _ = abs_bits(x_ptr, start + i + offs, m, 0, ALL)
        ok = m & (bits <= INF)
        counts += tl.sum(((bits[None, :] >= tries[:, None]) & ok[None, :]).to(tl.int32), axis=1)
    tried = tl.minimum(tl.sum(((counts < need) & (js < TRIES)).to(tl.int32), axis=0), TRIES - 1)
    return tl.sum(tl.where(js == tried, tries, 0), axis=0)


@triton.jit(do_not_specialize=["key"])
def dgc_select(x_ptr, table_ptr, shrink_ptr, idx_ptr, val_ptr, S, key, BLOCK: tl.constexpr,
               SAMPLE: tl.constexpr, COUNT: tl.constexpr):
    """Sparse scope s (``table``: start in the segment, length, k, first slot, sample count, stride, rank,
    need, full; (9, S) int64) keeps the largest of its candidates, at most k: DGC's payload, slots in
    index order; the sample starts at ``key`` mod its stride (the iteration's)."""
    s = tl.program_id(0)
    start = tl.load(table_ptr + s)
    length = tl.load(table_ptr + S + s).to(tl.int32)
    k = tl.load(table_ptr + 2 * S + s).to(tl.int32)
    base = tl.load(table_ptr + 3 * S + s)
    stride = tl.load(table_ptr + 5 * S + s)
    full = tl.load(table_ptr + 8 * S + s) != 0
    t = tl.zeros((), dtype=tl.int32)
    if not full:
        t = _sample_threshold(x_ptr, start, tl.load(table_ptr + 4 * S + s).to(tl.int32), stride, key % stride,
                              tl.load(table_ptr + 6 * S + s).to(tl.int32), SAMPLE)
    need = tl.load(table_ptr + 7 * S + s).to(tl.int32)
    floor = _adapted_floor(x_ptr, start, length, t, shrink_ptr, need, COUNT)
    select_scope(x_ptr, start, length, k, base, idx_ptr, val_ptr, floor, INF, BLOCK)


@triton.jit
def _run(runs_ptr, R, r):
    """Run r's row of ``runs`` ((3, R) int64): its start, its length and its first dense slot (-1: sparse)."""
    return tl.load(runs_ptr + r), tl.load(runs_ptr + R + r), tl.load(runs_ptr + 2 * R + r)


@triton.jit
def dense_out(x_ptr, runs_ptr, dense_ptr, sums_ptr, R, BLOCK: tl.constexpr):
    """Run r (``runs``: start, length, first dense slot or -1; (3, R) int64) of at most BLOCK values: its
    float32 sum for the health check, and, where dense, its values into the payload's dense part."""
    r = tl.program_id(0)
    start, length, slot = _run(runs_ptr, R, r)
    offs = tl.arange(0, BLOCK)
    m = offs < length
    v = tl.load(x_ptr + start + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(sums_ptr + r, tl.sum(v, axis=0))
    tl.store(dense_ptr + slot + offs, v, mask=m & (slot >= 0))


@triton.jit
def dense_in(dense_ptr, runs_ptr, out_ptr, R, BLOCK: tl.constexpr):
    """Run r of the decoded segment: its dense values from the payload, or zeros (the sparse scatter
    follows)."""
    r = tl.program_id(0)
    start, length, slot = _run(runs_ptr, R, r)
    offs = tl.arange(0, BLOCK)
    m = offs < length
    v = tl.load(dense_ptr + slot + offs, mask=m & (slot >= 0), other=0.0)
    tl.store(out_ptr + start + offs, v, mask=m)
