"""The Triton kernels of the level-fitting scalar quantizers, Linear-s and ORQ-s (imported only through
:mod:`._triton`, which owns the launches).  A program per bucket fits its levels on a histogram, as the
torch device path does (``_histogram.encode_on_grid``), op for op, so that, fed the same uniforms, both
give the same codes; then a program per block of wire words rounds and packs.

See docs/design.md#gvqcompressors_tritonpy for how it works and why.
"""
from __future__ import annotations

import triton
import triton.language as tl

from gvq.compressors._triton_quant import radix_powers, read_digits, store_bytes


@triton.jit
def rint(x):
    """Round half to even (float64 -> int32), as torch's ``round`` and numpy's ``rint``."""
    f = tl.floor(x)
    d = x - f                                       # exact: |x| is far below 2^52
    odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    return (f + tl.where((d > 0.5) | ((d == 0.5) & odd), 1.0, 0.0)).to(tl.int32)


@triton.jit
def bucket_grid(x_ptr, row, numel, bucket, bins, scale, ABS: tl.constexpr, BLOCK: tl.constexpr):
    """A bucket's values, bounds and grid (``_histogram.grid_coords``): (min, max), or ``ABS`` (0,
    max|v|) of |v|; the ragged last bucket's missing values read as its first value (the torch path's
    padding), counted nowhere.  Returns the values (|v| where ``ABS``; 0 where missing), their mask, the
    bounds, the scale, each value's bin and the span (NaN/Inf where a value is)."""
    offs = row * bucket + tl.arange(0, BLOCK)
    real = (offs < numel) & (tl.arange(0, BLOCK) < bucket)
    x = tl.load(x_ptr + offs, mask=real, other=0.0)
    v = tl.where(real, x, tl.load(x_ptr + row * bucket))
    if ABS:
        v = tl.abs(v)
        lo = 0.0                                    # v - 0 == v: the torch path's product alone
    else:
        lo = tl.min(v, axis=0)
    hi = tl.max(v, axis=0)
    span = hi - lo
    # torch's python float / tensor is a reciprocal times the float: two roundings, as here
    sc = tl.div_rn(1.0, span) * scale
    sc = tl.where((span > 0) & (sc * 0.0 == 0.0), sc, 0.0)     # x * 0 == 0: finite
    idx = tl.minimum(tl.maximum(((v - lo) * sc).to(tl.int32), 0), bins - 1)
    bad = tl.sum(tl.where(real, v - v, 0.0), axis=0)   # NaN iff a value is NaN/Inf, whatever min does
    return tl.where(real, v, 0.0), real, lo, hi, sc, idx, span + bad


@triton.jit
def pick(vec, lanes, at):
    """vec[at] (``lanes``: vec's arange; 0 where ``at`` is no lane): the kernels' scalar gather."""
    return tl.sum(tl.where(lanes == at, vec, 0), axis=0)


@triton.jit
def _edge_of_rank(rank, counts, cs, b, bins):
    """``_histogram.rank_edge`` (float64): the value of 0-based sorted position ``rank`` (float64) placed
    in its bin (``cs``: the inclusive prefix counts over bins ``b``), spread evenly over the bin."""
    j = tl.sum(((cs <= rank) & (b < bins)).to(tl.int32), axis=0)   # searchsorted(cum, rank, right) - 1
    j = tl.minimum(tl.maximum(j, 0), bins - 1)
    c = pick(counts, b, j)
    below = pick(cs, b, j) - c
    # float64 division is correctly rounded on GPUs too (tl.div_rn is float32 only)
    fr = ((rank - below.to(tl.float64)) + 0.5) / tl.where(c > 0, c, 1).to(tl.float64)
    return j.to(tl.float64) + tl.minimum(tl.maximum(fr, 0.0), 1.0)


@triton.jit
def _orq_mid(lo, hi, counts, cs, m2, b, bins):
    """``orq.orq_edges``' edge between edges lo and hi: Eq. (12) on the interval's counts, R = sum (t -
    lo) / (hi - lo) in bin units, the (floor(R)+1)-th largest value's edge kept in [lo, hi]; an empty
    interval's middle.  ``m2``: twice the prefix moments, integers, so R's numerator is exact and its
    float64 division rounds once, as torch's does."""
    first, end = pick(cs, b, lo - 1), pick(cs, b, hi - 1)
    num = (pick(m2, b, hi - 1) - pick(m2, b, lo - 1)).to(tl.float64) * 0.5 \
        - lo.to(tl.float64) * (end - first).to(tl.float64)
    rhs = num / tl.maximum(hi - lo, 1).to(tl.float64)
    last = end.to(tl.float64) - 1.0
    rank = tl.minimum(tl.maximum(last - tl.floor(rhs), first.to(tl.float64)), last)
    mid = tl.minimum(tl.maximum(rint(_edge_of_rank(rank, counts, cs, b, bins)), lo), hi)
    return tl.where((end > first) & (hi > lo), mid, (lo + hi) // 2)


@triton.jit
def _halving_edges(counts, cs, b, bins, S: tl.constexpr, SP: tl.constexpr):
    """Algorithm 1's halving rounds on the histogram: (SP,) int32 edges, s = 2^K + 1 of them in order;
    round r splits every interval of the round before at its Eq. (12) edge."""
    m2 = tl.cumsum(counts * (2 * b + 1), axis=0)
    lanes = tl.arange(0, SP)
    edges = tl.where(lanes == S - 1, bins, 0)
    for r in tl.static_range(S):
        half: tl.constexpr = (S - 1) >> (r + 1)
        if half > 0:
            for p in tl.static_range(half, S - 1, 2 * half):
                mid = _orq_mid(pick(edges, lanes, p - half), pick(edges, lanes, p + half), counts, cs, m2, b, bins)
                edges = tl.where(lanes == p, mid, edges)
    return edges


@triton.jit
def edge_value(e, lo, hi, inv, bins):
    """``_histogram.edge_values``: lo + e / sc, torch's addcmul one fused multiply-add (exact in float64,
    then one rounding); edge 0 exactly lo, edge ``bins`` exactly hi."""
    val = (e.to(tl.float64) * inv.to(tl.float64) + lo.to(tl.float64)).to(tl.float32)
    return tl.where(e <= 0, lo, tl.where(e >= bins, hi, val))


@triton.jit
def _level_fit(x_ptr, frac_ptr, side_ptr, grid_ptr, edges_ptr, ca_ptr, numel, bucket, m, bins, scale,
               shift, ORQ: tl.constexpr, S: tl.constexpr, SP: tl.constexpr, BLOCK: tl.constexpr,
               BINS_P: tl.constexpr):
    """One program per bucket: bounds, histogram, the s level edges (Linear's quantiles, ORQ's halving
    rounds), their values into the payload's side floats, and per interval the rounding's (C, A) with
    y = A t + C (``_histogram.rounding_table``) for :func:`fit_encode_words`.  ``grid``: (3, m) lo, sc
    and the span (NaN/Inf where an input is) for the health check."""
    row = tl.program_id(0)
    _, real, lo, hi, sc, idx, span = bucket_grid(x_ptr, row, numel, bucket, bins, scale, False, BLOCK)
    counts = tl.histogram(idx, BINS_P, mask=real)
    cs = tl.cumsum(counts, axis=0)
    b = tl.arange(0, BINS_P)
    n = tl.sum(real.to(tl.int32), axis=0)
    inv = tl.where(sc > 0, tl.div_rn(1.0, sc), 0.0)
    tl.store(grid_ptr + row, lo)
    tl.store(grid_ptr + m + row, sc)
    tl.store(grid_ptr + 2 * m + row, span)
    if ORQ:
        orq = _halving_edges(counts, cs, b, bins, S, SP)
    prev = bins * 0
    for j in tl.static_range(S):
        if j == 0:
            e = bins * 0
        elif j == S - 1:
            e = bins
        elif ORQ:
            e = pick(orq, tl.arange(0, SP), j)
        else:   # linear.quantile_edges: the 0-based rank (n - 1) j / (s - 1), on its nearest edge
            e = rint(_edge_of_rank(tl.load(frac_ptr + j) * (n - 1).to(tl.float64), counts, cs, b, bins))
        tl.store(side_ptr + row * S + j, edge_value(e, lo, hi, inv, bins))
        tl.store(edges_ptr + row * S + j, e)
        if j > 0:
            _store_interval(ca_ptr + (row * (S - 1) + j - 1) * 2, j - 1, prev, e, shift)
        prev = e


@triton.jit
def linear_fit(x_ptr, frac_ptr, side_ptr, grid_ptr, edges_ptr, ca_ptr, numel, bucket, m, bins, scale, shift,
               S: tl.constexpr, SP: tl.constexpr, BLOCK: tl.constexpr, BINS_P: tl.constexpr):
    """Linear-s's fit (:func:`_level_fit`): the quantiles ``frac`` (float64, as ``linspace`` makes them)."""
    _level_fit(x_ptr, frac_ptr, side_ptr, grid_ptr, edges_ptr, ca_ptr, numel, bucket, m, bins, scale, shift,
               False, S, SP, BLOCK, BINS_P)


@triton.jit
def orq_fit(x_ptr, frac_ptr, side_ptr, grid_ptr, edges_ptr, ca_ptr, numel, bucket, m, bins, scale, shift,
            S: tl.constexpr, SP: tl.constexpr, BLOCK: tl.constexpr, BINS_P: tl.constexpr):
    """ORQ-s's fit (:func:`_level_fit`, Algorithm 1; ``frac`` unused: the launch is Linear's)."""
    _level_fit(x_ptr, frac_ptr, side_ptr, grid_ptr, edges_ptr, ca_ptr, numel, bucket, m, bins, scale, shift,
               True, S, SP, BLOCK, BINS_P)


@triton.jit
def _store_interval(ptr, k, e_lo, e_hi, shift):
    """Interval k's (C, A): A = 1 / width (0 if empty), C = k + shift - e_lo * A, float32 ops in the
    torch path's order (the product rounded alone: no fused multiply-add may merge it)."""
    w = (e_hi - e_lo).to(tl.float32)
    a = tl.where(w > 0, tl.div_rn(1.0, tl.where(w > 0, w, 1.0)), 0.0)
    p = (e_lo.to(tl.float64) * a.to(tl.float64)).to(tl.float32)
    tl.store(ptr, (k + shift) - p)
    tl.store(ptr + 1, a)


@triton.jit
def fit_encode_words(x_ptr, grid_ptr, edges_ptr, ca_ptr, u_ptr, out_ptr, numel, bucket, m, n_words,
                     radix, bins, top, ushift, seed, offset, S: tl.constexpr, HAS_U: tl.constexpr,
                     K: tl.constexpr, KP: tl.constexpr, WB: tl.constexpr, WBP: tl.constexpr,
                     BLOCK_W: tl.constexpr):
    """A block of wire words of a level quantizer: each value's bin on its bucket's grid, its interval
    k (edges at or below the bin), y = A t + C, code ``floor(y + u - shift)`` capped at ``top`` (Eq. 7);
    ``u`` from Philox at (seed, offset + value index) unless ``HAS_U`` (a test's uniforms)."""
    w = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)[:, None]
    j = tl.arange(0, KP)[None, :]
    idx = w * K + j
    real = (j < K) & (idx < numel)
    v = tl.load(x_ptr + idx, mask=real, other=0.0)
    b = idx // bucket
    lo = tl.load(grid_ptr + b, mask=real, other=0.0)
    t = (v - lo) * tl.load(grid_ptr + m + b, mask=real, other=0.0)
    cell = tl.minimum(tl.maximum(t.to(tl.int32), 0), bins - 1)
    k = tl.zeros(v.shape, tl.int32)
    for e in tl.static_range(1, S - 1):
        k += (tl.load(edges_ptr + b * S + e, mask=real, other=0) <= cell).to(tl.int32)
    at = ca_ptr + (b * (S - 1) + k) * 2
    c, a = tl.load(at, mask=real, other=0.0), tl.load(at + 1, mask=real, other=0.0)
    y = (t.to(tl.float64) * a.to(tl.float64) + c.to(tl.float64)).to(tl.float32)   # the addcmul, fused
    if HAS_U:
        u = tl.load(u_ptr + idx, mask=real, other=0.0)
    else:
        u = tl.rand(seed, offset + idx.to(tl.int64))
    y = (u + ushift) + y
    y = tl.where(y < top, y, top)                  # fmin: a NaN is the top code
    code = tl.where(real, y.to(tl.int32).to(tl.int64), 0)
    store_bytes(out_ptr, w, tl.sum(code * radix_powers(j, radix, KP), axis=1), n_words, WB, WBP)


@triton.jit
def fit_decode_words(data_ptr, side_ptr, out_ptr, numel, bucket, n_words, radix, S: tl.constexpr,
                     K: tl.constexpr, KP: tl.constexpr, WB: tl.constexpr, WBP: tl.constexpr,
                     BLOCK_W: tl.constexpr):
    """A block of wire words back to values: each code's level, looked up in its bucket's side floats."""
    idx, real, code = read_digits(data_ptr, numel, n_words, radix, K, KP, WB, WBP, BLOCK_W)
    code = tl.minimum(code.to(tl.int32), S - 1)                 # a corrupt digit must not read past the bucket's levels
    tl.store(out_ptr + idx, tl.load(side_ptr + (idx // bucket) * S + code, mask=real, other=0.0), mask=real)
