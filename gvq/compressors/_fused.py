"""Fused host kernels (numba) for the scalar quantizers: each makes in one compiled pass what eager torch
ops make in several full memory passes.  They are the ``host`` path of :mod:`._kernels` (chosen there, by
``compressor.kernels``: ``auto`` takes them on host tensors, ``torch`` does not).

See docs/design.md#gvqcompressors_fusedpy for how it works and why.
"""
from __future__ import annotations

import math

import numpy as np

try:                      # imported here, required on first host use (enabled): CUDA-only runs need none
    from numba import njit
    _NUMBA_ERROR: ImportError | None = None
except ImportError as e:
    njit, _NUMBA_ERROR = None, e

F32 = np.float32


def require() -> None:
    """The host path's check (``_kernels.choose_path``): a host tensor without numba is an ImportError saying
    so, not the torch path taken quietly."""
    if njit is None:
        raise ImportError(f"gvq needs numba for its host quantizer kernels: pip install 'numba>=0.60' "
                          f"(or choose the slower torch ops: compressor.kernels=torch, or GVQ_FUSED=0 "
                          f"for every codec): {_NUMBA_ERROR}")


def _jit(fn):
    return njit(cache=True, nogil=True, error_model="numpy")(fn) if njit is not None else fn


@_jit
def _scale(span, bins):
    """The grid's t = (v - lo) * sc, sc = bins (1 - 2^-20) / span: the max lands just below ``bins``;
    0 for an empty or unscalable span (everything in bin 0)."""
    sc = F32(bins * (1.0 - 2.0 ** -20)) / span
    return sc if (span > 0 and math.isfinite(sc)) else F32(0.0)


@_jit
def _histogram(row, lo, sc, absolute, counts, cum, mom2):
    """counts per bin of t = (v - lo) sc (of |v| sc if ``absolute``); cum / mom2: prefix counts and
    twice the prefix sums of bin centres (a leading 0), int64: exact, and integer adds chain faster
    than float ones.  Unsigned indices: numba skips its negative-index wraparound (t >= 0 here)."""
    bins = np.uint32(counts.shape[0] - 1)
    counts[:] = 0
    if absolute:
        for v in row:
            counts[min(np.uint32(abs(v) * sc), bins)] += 1
    else:
        for v in row:
            counts[min(np.uint32((v - lo) * sc), bins)] += 1
    cum[0] = mom2[0] = 0
    for j in range(counts.shape[0]):
        cum[j + 1] = cum[j] + counts[j]
        mom2[j + 1] = mom2[j] + counts[j] * (2 * j + 1)


@_jit
def _rank_edge(cum, counts, rank):
    """Edge (float) of the value of 0-based sorted position ``rank``: its bin plus its place in it."""
    j = min(max(np.searchsorted(cum, math.floor(rank), side="right") - 1, 0), counts.shape[0] - 1)
    c = counts[j] if counts[j] > 0 else 1
    return j + min(max((rank - cum[j] + 0.5) / c, 0.0), 1.0)


@_jit
def _orq_edges(counts, cum, mom2, edges):
    """Algorithm 1 on the histogram (``orq.orq_edges``): halve every interval per round, Eq. (12) on its
    counts (t in bin units), in place in ``edges`` (2^K + 1 of them)."""
    step = edges.shape[0] - 1
    edges[0], edges[step] = 0, counts.shape[0]
    while step > 1:
        for p in range(0, edges.shape[0] - 1, step):
            lo, hi = edges[p], edges[p + step]
            first, end = cum[lo], cum[hi]
            mid = (lo + hi) // 2
            if end > first and hi > lo:
                rhs = (0.5 * (mom2[hi] - mom2[lo]) - lo * (end - first)) / (hi - lo)
                rank = min(max(end - 1 - math.floor(rhs), first), end - 1)
                mid = min(max(int(np.rint(_rank_edge(cum, counts, rank))), lo), hi)
            edges[p + step // 2] = mid
        step //= 2


@_jit
def _quantile_edges(counts, cum, edges):
    """Linear-s: the edges nearest the quantiles j/(s-1) (``linear.quantile_edges``); first 0, last bins."""
    s = edges.shape[0]
    for j in range(s):
        edges[j] = int(np.rint(_rank_edge(cum, counts, (j / (s - 1)) * (cum[-1] - 1))))
    edges[0], edges[s - 1] = 0, counts.shape[0]


@_jit
def _edge_value(e, lo, hi, sc, bins):
    """The value of edge e: lo + e / sc (edge 0 exactly lo, edge ``bins`` exactly hi)."""
    if e <= 0:
        return lo
    if e >= bins:
        return hi
    return lo + F32(e) * (F32(1.0) / sc if sc > 0 else F32(0.0))


@_jit
def _round_row(row, lo, sc, edges, shift, u, codes, tab, t, j):
    """Eq. (7) on the grid: y = A t + C per bin (k + (t - e_k) / (e_k+1 - e_k) + shift), plus the
    dither, floored and clamped to the last level.  Three loops rather than one, so two vectorise: the grid
    coordinates and the dither (vectorised), the table lookups between them (``tab`` (bins, 2): C, A;
    ``t``, ``j``: row-sized scratch)."""
    last = np.uint32(edges.shape[0] - 1)
    for k in range(last):
        w = edges[k + 1] - edges[k]
        a = F32(1.0) / F32(w) if w > 0 else F32(0.0)
        c = F32(k + shift) - F32(edges[k]) * a
        for b in range(edges[k], edges[k + 1]):
            tab[b, 0], tab[b, 1] = c, a
    top = np.uint32(tab.shape[0] - 1)
    for i in range(row.shape[0]):
        t[i] = (row[i] - lo) * sc
        j[i] = min(np.uint32(t[i]), top)
    for i in range(row.shape[0]):
        t[i] = tab[j[i], 1] * t[i] + tab[j[i], 0]
    for i in range(row.shape[0]):
        codes[i] = min(np.uint32(t[i] + F32(u[i]) * F32(2.0 ** -16)), last)


@_jit
def _encode_levels(x, bounds, quantiles, bins, shift, u, codes, side):
    """ORQ-s (``quantiles`` False) or Linear-s (True) on buckets ``x`` (m, n): codes (m, n) and the s
    level values ``side`` (m, s)."""
    m, n = x.shape
    s = side.shape[1]
    counts, cum, mom2 = np.empty(bins, np.int64), np.empty(bins + 1, np.int64), np.empty(bins + 1, np.int64)
    edges, tab = np.empty(s, np.int64), np.empty((bins, 2), F32)
    t, j = np.empty(n, F32), np.empty(n, np.uint32)
    for i in range(m):
        lo, hi = bounds[i, 0], bounds[i, 1]
        sc = _scale(hi - lo, bins)
        _histogram(x[i], lo, sc, False, counts, cum, mom2)
        if quantiles:
            _quantile_edges(counts, cum, edges)
        else:
            _orq_edges(counts, cum, mom2, edges)
        for e in range(s):
            side[i, e] = _edge_value(edges[e], lo, hi, sc, bins)
        _round_row(x[i], lo, sc, edges, shift, u[i * n:(i + 1) * n], codes[i], tab, t, j)


# Entry points, one signature (x, bounds, bins, shift, u, codes, side): x (m, n) float32 buckets, bounds
# (m, 2) their (lo, hi), ``bins`` per bucket, ``shift`` the constant the dither adds, u (m * n,) int16.
@_jit
def encode_orq(x, bounds, bins, shift, u, codes, side):
    _encode_levels(x, bounds, False, bins, shift, u, codes, side)


@_jit
def encode_linear(x, bounds, bins, shift, u, codes, side):
    _encode_levels(x, bounds, True, bins, shift, u, codes, side)


@_jit
def _lloyd_edge(cum, mom2):
    """Lloyd rounds on the histogram (``bingrad_b.lloyd_edge``): the edge splitting two groups, from the
    mean, until it stops moving (at most 1000 rounds, as the torch path)."""
    n, total = cum[-1], 0.5 * mom2[-1]
    edge = int(np.rint(total / max(n, 1)))
    for _ in range(1000):
        below, s_lo = cum[edge], 0.5 * mom2[edge]
        lo = s_lo / below if below > 0 else total / n
        hi = (total - s_lo) / (n - below) if below < n else lo
        again = int(np.rint((lo + hi) / 2))
        if again == edge:
            break
        edge = again
    return edge


@_jit
def encode_bingrad_b(x, bounds, bins, shift, u, codes, side):
    """BinGrad-b, Lloyd threshold on the histogram, then the exact means of both sides (float64 sums):
    codes (m, n) 0/1, ``side`` (m, 2) = (b_-1, b_1) (deterministic: ``shift`` and ``u`` unused)."""
    m, n = x.shape
    counts, cum, mom2 = np.empty(bins, np.int64), np.empty(bins + 1, np.int64), np.empty(bins + 1, np.int64)
    for i in range(m):
        row = x[i]
        lo, hi = bounds[i, 0], bounds[i, 1]
        sc = _scale(hi - lo, bins)
        _histogram(row, lo, sc, False, counts, cum, mom2)
        b0 = _edge_value(_lloyd_edge(cum, mom2), lo, hi, sc, bins)
        n_hi, s_hi, total = 0, 0.0, 0.0
        for k in range(n):
            above = row[k] >= b0
            codes[i, k] = above
            n_hi += above
            s_hi += row[k] if above else 0.0
            total += row[k]
        mean_hi = s_hi / max(n_hi, 1)
        mean_lo = (total - s_hi) / max(n - n_hi, 1) if n_hi < n else mean_hi
        side[i, 0], side[i, 1] = mean_lo, mean_hi if n_hi > 0 else mean_lo


@_jit
def _pb_root(row, sc, counts, mom2):
    """BinGrad-pb's b1 in bin units: the root of f(b) = b - sum_{t >= b} t / n on the histogram of
    t = |v| sc (interpolated in the bin where f turns >= 0), then one exact step on the values
    (``bingrad_pb.pb_refine``: exact for constant and sparse buckets)."""
    n, bins = row.shape[0], counts.shape[0]
    lo, hi = 0, bins                              # f(k) >= 0 <=> mom2[k] - mom2[bins] + 2 n k >= 0
    while lo < hi:                                # (integers, increasing in k): the first such k
        mid = (lo + hi) // 2
        if mom2[mid] - mom2[bins] + 2 * n * mid >= 0:
            hi = mid
        else:
            lo = mid + 1
    e = min(max(lo, 1), bins)
    f0, f1 = 0.5 * (mom2[e - 1] - mom2[bins]) / n + e - 1, 0.5 * (mom2[e] - mom2[bins]) / n + e
    b = F32((e - 1) + min(max(-f0 / (f1 - f0 if f1 > f0 else 1.0), 0.0), 1.0))
    r, first_above = 0.0, F32(np.inf)
    for v in row:                                 # selects, not branches: ~half the values pass
        t = abs(v) * sc
        r += t if t >= b else F32(0.0)
        first_above = min(first_above, t if t >= b else F32(np.inf))
    return min(F32(r / n), first_above)


@_jit
def encode_bingrad_pb(x, bounds, bins, shift, u, codes, side):
    """BinGrad-pb (Eq. 14-15): b1 per bucket into ``side`` (m, 1), codes 1 <=> +b1 with probability
    (v + b1) / 2b1 (values beyond +-b1 clipped)."""
    m, n = x.shape
    counts, cum, mom2 = np.empty(bins, np.int64), np.empty(bins + 1, np.int64), np.empty(bins + 1, np.int64)
    for i in range(m):
        row = x[i]
        top = bounds[i, 1]
        sc = _scale(top, bins)
        _histogram(row, F32(0.0), sc, True, counts, cum, mom2)
        b1 = F32(_pb_root(row, sc, counts, mom2) / sc) if sc > 0 else top
        inv = F32(0.5) / b1 if b1 > 0 else F32(0.0)
        side[i, 0] = b1
        ui = u[i * n:(i + 1) * n]
        for k in range(n):
            y = min(max(row[k] * inv, F32(-0.5)), F32(0.5)) + F32(ui[k]) * F32(2.0 ** -16) + F32(shift)
            codes[i, k] = min(np.uint32(y), np.uint32(1))


@_jit
def lcg_step(state, out):
    """The dither lanes' step (``_dither``), in place: s <- a s + c mod 2^64 on every lane of ``state``
    (uint64), out = s ^ (s >> 32): bit for bit what the torch ops compute, in one pass."""
    a, c = np.uint64(6364136223846793005), np.uint64(1442695040888963407)
    for i in range(state.shape[0]):
        s = state[i] * a + c
        state[i] = s
        out[i] = s ^ (s >> np.uint64(32))


@_jit
def pack_words(codes, radix, per_word, word_bytes, out):
    """Base-``radix`` words of ``per_word`` codes each (first code least significant), their low
    ``word_bytes`` bytes little-endian into ``out`` (``_packing.pack``'s many-digit format, one pass).
    Sum of codes times powers, not Horner: independent multiplies instead of a chain."""
    powers = np.empty(per_word, np.uint64)
    powers[0] = 1
    for j in range(1, per_word):
        powers[j] = powers[j - 1] * np.uint64(radix)
    for w in range(out.shape[0] // word_bytes):
        word = np.uint64(0)
        for j in range(per_word):
            word += np.uint64(codes[w * per_word + j]) * powers[j]
        for b in range(word_bytes):
            out[w * word_bytes + b] = np.uint8((word >> np.uint64(8 * b)) & np.uint64(0xFF))


@_jit
def scale_dither_floor(x, scale, shift, u, codes, last):
    """QSGD's and TernGrad's rounding in one pass: codes = min(floor(x scale + u 2^-16 + shift), last)
    per bucket row of ``x`` (m, n), ``scale`` (m,): the torch ops' float32 steps in their order (the
    product, then the exact dither, then the shift), so the codes are theirs bit for bit."""
    n = x.shape[1]
    for i in range(x.shape[0]):
        s = scale[i]
        for k in range(n):
            y = x[i, k] * s + F32(u[i * n + k]) * F32(2.0 ** -16)
            codes[i, k] = min(np.uint32(y + F32(shift)), np.uint32(last))
