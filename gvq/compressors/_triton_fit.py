"""The Triton kernels of the fitted scalar quantizers (Linear-s so far; imported only through
:mod:`._triton`, which owns the launches).  A program per bucket fits its levels on a histogram, as the
torch device path does (``_histogram.encode_on_grid``), op for op, so that, fed the same uniforms, both
give the same codes; then a program per block of wire words rounds and packs.

See docs/design.md#gvqcompressors_tritonpy for how it works and why.
"""
from __future__ import annotations

import triton
import triton.language as tl

from gvq.compressors._triton_quant import _radix_powers, _store_bytes, read_digits


@triton.jit
def _rint(x):
    """Round half to even (float64 -> int32), as torch's ``round`` and numpy's ``rint``."""
    f = tl.floor(x)
    d = x - f                                       # exact: |x| is far below 2^52
    odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    return (f + tl.where((d > 0.5) | ((d == 0.5) & odd), 1.0, 0.0)).to(tl.int32)


@triton.jit
def _grid(x_ptr, row, numel, bucket, bins, scale, BLOCK: tl.constexpr):
    """A bucket's values, bounds and grid (``_histogram.grid_coords``): the ragged last bucket's missing
    values read as its first value (the torch path's padding), counted nowhere."""
    offs = row * bucket + tl.arange(0, BLOCK)
    real = (offs < numel) & (tl.arange(0, BLOCK) < bucket)
    v = tl.where(real, tl.load(x_ptr + offs, mask=real, other=0.0), tl.load(x_ptr + row * bucket))
    lo, hi = tl.min(v, axis=0), tl.max(v, axis=0)
    span = hi - lo
    # torch's python float / tensor is a reciprocal times the float: two roundings, as here
    sc = tl.div_rn(1.0, span) * scale
    sc = tl.where((span > 0) & (sc * 0.0 == 0.0), sc, 0.0)     # x * 0 == 0: finite
    idx = tl.minimum(tl.maximum(((v - lo) * sc).to(tl.int32), 0), bins - 1)
    bad = tl.sum(tl.where(real, v - v, 0.0), axis=0)   # NaN iff a value is NaN/Inf, whatever min does
    return real, lo, hi, sc, idx, span + bad


@triton.jit
def _quantile_edge(frac, counts, cs, n, bins, BINS_P: tl.constexpr):
    """``linear.quantile_edges``' edge of the quantile ``frac`` (float64): the 0-based rank
    frac * (n - 1) placed in its bin (``_histogram.rank_edge``), rounded to the nearest edge."""
    rank = frac * (n - 1).to(tl.float64)
    b = tl.arange(0, BINS_P)
    j = tl.sum(((cs <= rank) & (b < bins)).to(tl.int32), axis=0)   # searchsorted(cum, rank, right) - 1
    j = tl.minimum(tl.maximum(j, 0), bins - 1)
    c = tl.sum(tl.where(b == j, counts, 0), axis=0)
    below = tl.sum(tl.where(b == j, cs, 0), axis=0) - c
    # float64 division is correctly rounded on GPUs too (tl.div_rn is float32 only)
    fr = ((rank - below.to(tl.float64)) + 0.5) / tl.where(c > 0, c, 1).to(tl.float64)
    return _rint(j.to(tl.float64) + tl.minimum(tl.maximum(fr, 0.0), 1.0))


@triton.jit
def linear_fit(x_ptr, frac_ptr, side_ptr, grid_ptr, edges_ptr, ca_ptr, numel, bucket, m, bins, scale,
               shift, S: tl.constexpr, BLOCK: tl.constexpr, BINS_P: tl.constexpr):
    """One program per bucket: bounds, histogram, the s quantile edges, their values into the payload's
    side floats (``_histogram.edge_values``), and per interval the rounding's (C, A) with
    y = A t + C (``_histogram.rounding_table``) for :func:`fit_encode_words`.  ``grid``: (3, m) lo, sc
    and the span (NaN/Inf where an input is) for the health check."""
    row = tl.program_id(0)
    real, lo, hi, sc, idx, span = _grid(x_ptr, row, numel, bucket, bins, scale, BLOCK)
    counts = tl.histogram(idx, BINS_P, mask=real)
    cs = tl.cumsum(counts, axis=0)
    n = tl.sum(real.to(tl.int32), axis=0)
    inv = tl.where(sc > 0, tl.div_rn(1.0, sc), 0.0)
    tl.store(grid_ptr + row, lo)
    tl.store(grid_ptr + m + row, sc)
    tl.store(grid_ptr + 2 * m + row, span)
    prev = bins * 0
    for j in tl.static_range(S):
        if j == 0:
            e = bins * 0
            val = lo
        elif j == S - 1:
            e = bins
            val = hi
        else:
            e = _quantile_edge(tl.load(frac_ptr + j), counts, cs, n, bins, BINS_P)
            # torch's addcmul is one fused multiply-add: exact in float64, then one rounding
            val = (e.to(tl.float64) * inv.to(tl.float64) + lo.to(tl.float64)).to(tl.float32)
            val = tl.where(e <= 0, lo, tl.where(e >= bins, hi, val))
        tl.store(side_ptr + row * S + j, val)
        tl.store(edges_ptr + row * S + j, e)
        if j > 0:
            _store_interval(ca_ptr + (row * (S - 1) + j - 1) * 2, j - 1, prev, e, shift)
        prev = e


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
    _store_bytes(out_ptr, w, tl.sum(code * _radix_powers(j, radix, KP), axis=1), n_words, WB, WBP)


@triton.jit
def fit_decode_words(data_ptr, side_ptr, out_ptr, numel, bucket, n_words, radix, S: tl.constexpr,
                     K: tl.constexpr, KP: tl.constexpr, WB: tl.constexpr, WBP: tl.constexpr,
                     BLOCK_W: tl.constexpr):
    """A block of wire words back to values: each code's level, looked up in its bucket's side floats."""
    idx, real, code = read_digits(data_ptr, numel, n_words, radix, K, KP, WB, WBP, BLOCK_W)
    code = tl.minimum(code.to(tl.int32), S - 1)                 # a corrupt digit must not read past the bucket's levels
    tl.store(out_ptr + idx, tl.load(side_ptr + (idx // bucket) * S + code, mask=real, other=0.0), mask=real)
