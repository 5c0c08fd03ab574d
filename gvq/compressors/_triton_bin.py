"""The Triton kernels of the binary fitted quantizers, BinGrad-b and BinGrad-pb (imported only through
:mod:`._triton`, which owns the launches).  A program per bucket fits its threshold (BinGrad-b: Lloyd's
rounds on the bucket's histogram, or its mean) or its clip level (BinGrad-pb: the root on the histogram of
|v|, then one exact step on the values) as the torch device path does, op for op, and writes the side
floats; then a program per block of wire words codes and packs.

See docs/design.md#gvqcompressors_tritonpy for how it works and why.
"""
from __future__ import annotations

import triton
import triton.language as tl

from gvq.compressors._triton_fit import bucket_grid, edge_value, pick, rint
from gvq.compressors._triton_quant import radix_powers, store_bytes


@triton.jit
def _fdiv(a, b, F64: tl.constexpr):
    """a / b correctly rounded in the fit's float type (``_histogram.bin_counts``': float32 where every
    prefix sum is exact in it, float64 otherwise)."""
    if F64:
        return a.to(tl.float64) / b.to(tl.float64)
    else:
        return tl.div_rn(a.to(tl.float32), b.to(tl.float32))


@triton.jit
def _fcast(x, F64: tl.constexpr):
    if F64:
        return x.to(tl.float64)
    else:
        return x.to(tl.float32)


@triton.jit
def _lloyd_step(e, cs, m2, b, n, total, mean, bins, F64: tl.constexpr):
    """One Lloyd round from edge e (``bingrad_b.lloyd_edge``'s f): the means below and at or above it
    (a bin's values at its centre), their midpoint rounded to an edge."""
    below = _fcast(pick(cs, b, e - 1), F64)
    mom = _fcast(pick(m2, b, e - 1), F64) * 0.5
    lo = tl.where(below > 0, _fdiv(mom, tl.maximum(below, 1.0), F64), mean)
    hi = tl.where(below < n, _fdiv(total - mom, tl.maximum(n - below, 1.0), F64), lo)
    return tl.minimum(tl.maximum(rint(((lo + hi) * 0.5).to(tl.float64)), 0), bins)


@triton.jit
def _lloyd_fixed_edge(counts, b, bins, rounds, F64: tl.constexpr):
    """Lloyd's rounds on the histogram from the mean's edge until a fixed point, at most ``rounds``
    (2^k >= bins + 1): where the torch path's pointer doubling lands, f^(2^k) of the start."""
    cs = tl.cumsum(counts, axis=0)
    m2 = tl.cumsum(counts * (2 * b + 1), axis=0)       # twice the moments: integers
    n = _fcast(tl.sum(counts, axis=0), F64)
    total = _fcast(tl.sum(counts * (2 * b + 1), axis=0), F64) * 0.5
    mean = _fdiv(total, tl.maximum(n, 1.0), F64)
    e = rint(mean.to(tl.float64))
    step = _lloyd_step(e, cs, m2, b, n, total, mean, bins, F64)
    done = tl.full((), 1, tl.int32)
    while (done < rounds) & (step != e):
        e = step
        step = _lloyd_step(e, cs, m2, b, n, total, mean, bins, F64)
        done += 1
    return step


@triton.jit
def bingrad_b_fit(x_ptr, side_ptr, par_ptr, health_ptr, numel, bucket, bins, scale, rounds,
                  MEAN: tl.constexpr, PADDED: tl.constexpr, F64: tl.constexpr, BLOCK: tl.constexpr,
                  BINS_P: tl.constexpr):
    """One program per bucket: the threshold b0 (Lloyd's on the histogram, or ``MEAN`` the bucket's
    mean) into ``par``, the exact means below and at or above it into the side floats
    (``bingrad_b.side_means``: float32 sums, float64 arithmetic on them; where the torch path pads,
    ``PADDED``, its count is 1 / (1 / n) in float64, as there), ``health`` NaN/Inf where an input is."""
    row = tl.program_id(0)
    v, real, lo, hi, sc, idx, span = bucket_grid(x_ptr, row, numel, bucket, bins, scale, False, BLOCK)
    count = tl.sum(real.to(tl.int32), axis=0)
    inv_count = tl.div_rn(1.0, count.to(tl.float32))
    if MEAN:
        b0 = tl.sum(v, axis=0) * inv_count
        span = span * 0.0                             # the torch path has no grid here
    else:
        b = tl.arange(0, BINS_P)
        e = _lloyd_fixed_edge(tl.histogram(idx, BINS_P, mask=real), b, bins, rounds, F64)
        b0 = edge_value(e, lo, hi, tl.where(sc > 0, tl.div_rn(1.0, sc), 0.0), bins)
    above = real & (v >= b0)
    n_hi = tl.sum(above.to(tl.int32), axis=0).to(tl.float64)
    s_hi = tl.sum(tl.where(above, v, 0.0), axis=0).to(tl.float64)
    total = tl.sum(v, axis=0).to(tl.float64)
    if PADDED:
        n = 1.0 / inv_count.to(tl.float64)
    else:
        n = count.to(tl.float64)
    mean_hi = s_hi / tl.maximum(n_hi, 1.0)
    mean_lo = tl.where(n_hi < n, (total - s_hi) / tl.maximum(n - n_hi, 1.0), mean_hi)
    mean_hi = tl.where(n_hi > 0, mean_hi, mean_lo)
    tl.store(side_ptr + 2 * row, mean_lo.to(tl.float32))
    tl.store(side_ptr + 2 * row + 1, mean_hi.to(tl.float32))
    tl.store(par_ptr + row, b0)
    tl.store(health_ptr + row, span + (mean_lo + mean_hi).to(tl.float32) * 0.0)


@triton.jit
def _pb_estimate(counts, b, inv_count, bins, F64: tl.constexpr):
    """``bingrad_pb.pb_level_grid``'s estimate (t units, float32): f(e) = e - sum_{t >= e} t / n at every
    edge, e the first edge where f >= 0, the root interpolated in the bin before it."""
    w = counts * (2 * b + 1)
    m2 = tl.cumsum(w, axis=0) - w                      # twice the moments below each edge: integers
    last = _fcast(tl.sum(w, axis=0), F64) * 0.5
    d = _fcast(m2, F64) * 0.5 - last
    if F64:
        f = d * inv_count.to(tl.float64) + b.to(tl.float64)
    else:      # the product rounded alone, as torch's mul_ then add_ (no fused multiply-add)
        f = (d.to(tl.float64) * inv_count.to(tl.float64)).to(tl.float32) + b.to(tl.float32)
    e = tl.minimum(tl.maximum(tl.sum(((f < 0) & (b < bins)).to(tl.int32), axis=0), 1), bins)
    f0 = pick(f, b, e - 1)
    f1 = tl.where(e >= bins, _fcast(bins, F64), pick(f, b, e))     # f(bins) = bins
    q = _fdiv(-f0, tl.where(f1 > f0, f1 - f0, 1.0), F64)
    return (_fcast(e - 1, F64) + tl.minimum(tl.maximum(q, 0.0), 1.0)).to(tl.float32)


@triton.jit
def bingrad_pb_fit(x_ptr, side_ptr, par_ptr, health_ptr, numel, bucket, bins, scale, rounds,
                   MEAN: tl.constexpr, PADDED: tl.constexpr, F64: tl.constexpr, BLOCK: tl.constexpr,
                   BINS_P: tl.constexpr):
    """One program per bucket: b1 (Eq. 15) into the side float, 0.5 / b1 into ``par`` for the encode,
    ``health`` NaN/Inf where an input is (the launch is BinGrad-b's: ``rounds``, ``MEAN`` and ``PADDED``
    unused).  The exact step (``bingrad_pb.pb_refine``): the sum of |v| at or above the estimate, in
    t units r = sum * sc / n, capped at the first t at or above it."""
    row = tl.program_id(0)
    a, real, _, top, sc, idx, span = bucket_grid(x_ptr, row, numel, bucket, bins, scale, True, BLOCK)
    inv_count = tl.div_rn(1.0, tl.sum(real.to(tl.int32), axis=0).to(tl.float32))
    bt = _pb_estimate(tl.histogram(idx, BINS_P, mask=real), tl.arange(0, BINS_P), inv_count, bins, F64)
    t = a * sc
    below = t < bt
    first_above = tl.min(tl.where(real, t + tl.where(below, 1073741824.0, 0.0), float("inf")), axis=0)
    s = tl.sum(a, axis=0) - tl.sum(tl.where(below, a, 0.0), axis=0)
    b1 = tl.minimum((s * sc) * inv_count, first_above)
    b1 = tl.where(sc > 0, tl.div_rn(b1, tl.where(sc > 0, sc, 1.0)), top)
    tl.store(side_ptr + row, b1)
    # torch's python float / tensor: the reciprocal, times 0.5
    tl.store(par_ptr + row, tl.where(b1 > 0, tl.div_rn(1.0, tl.where(b1 > 0, b1, 1.0)) * 0.5, 0.0))
    tl.store(health_ptr + row, span)


@triton.jit
def bin_encode_words(x_ptr, par_ptr, u_ptr, out_ptr, numel, bucket, n_words, radix, seed, offset,
                     PB: tl.constexpr, HAS_U: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
                     WB: tl.constexpr, WBP: tl.constexpr, BLOCK_W: tl.constexpr):
    """A block of wire words of a binary quantizer: BinGrad-b's code v >= b0; ``PB`` BinGrad-pb's
    clip(v * 0.5 / b1, +-0.5) rounded at random, ``floor(u + 0.5 + y)`` capped at 1 (Eq. 14), ``u``
    from Philox at (seed, offset + value index) unless ``HAS_U`` (a test's uniforms)."""
    w = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)[:, None]
    j = tl.arange(0, KP)[None, :]
    idx = w * K + j
    real = (j < K) & (idx < numel)
    v = tl.load(x_ptr + idx, mask=real, other=0.0)
    p = tl.load(par_ptr + idx // bucket, mask=real, other=0.0)
    if PB:
        y = tl.clamp(v * p, -0.5, 0.5, propagate_nan=tl.PropagateNan.ALL)
        if HAS_U:
            u = tl.load(u_ptr + idx, mask=real, other=0.0)
        else:
            u = tl.rand(seed, offset + idx.to(tl.int64))
        y = (u + 0.5) + y
        code = tl.where(y < 1.0, y, 1.0).to(tl.int32).to(tl.int64)    # fmin: a NaN is the top code
    else:
        code = (v >= p).to(tl.int64)
    code = tl.where(real, code, 0)
    store_bytes(out_ptr, w, tl.sum(code * radix_powers(j, radix, KP), axis=1), n_words, WB, WBP)
