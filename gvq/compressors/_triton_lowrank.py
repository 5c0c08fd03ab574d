"""The Triton kernels of the low-rank codecs' steps between their GEMMs (imported only once a kernel runs:
the launches go through :func:`._kernels.launch_kernel`, which counts them).  GradiVeQ's device path
(``gradiveq.batched``): the payload, or the gradient, laid out from the GEMMs' results and the raw values
in one gather.  PowerSGD (``_lowrank``, ``powersgd``): pass P's payload unpacked where its decompress reads
it, the Gram matrix's shifted diagonal of each orthogonalisation round, the warm start's kept Q; and its
aggregator's error memory, fed before the rings and left with the residual after.  The GEMMs, Cholesky
factorisations and triangular solves stay torch's (cuBLAS, cuSOLVER); each kernel replaces a chain of
three or more torch ops, whose arithmetic it repeats in the same order.

See docs/design.md#gvqcompressors_tritonpy for how it works and why.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def lay_out(res_ptr, mu_ptr, raw_ptr, idx_ptr, out_ptr, n, n_res, beta, ADD_MU: tl.constexpr,
            BLOCK: tl.constexpr):
    """``out[i]``: the GEMMs' result at ``idx[i]`` (float32; with ``ADD_MU`` plus ``beta`` times the mean
    term there: the bf16 bases' mean, added after their GEMMs) where ``idx[i] < n_res``, else the raw
    value ``raw[idx[i] - n_res]``.  The torch path copies both into one source and gathers from it."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    real = offs < n
    at = tl.load(idx_ptr + offs, mask=real, other=0)
    coded = at < n_res
    v = tl.load(res_ptr + at, mask=real & coded, other=0.0).to(tl.float32)
    if ADD_MU:
        v = v + beta * tl.load(mu_ptr + at, mask=real & coded, other=0.0)
    raw = tl.load(raw_ptr + (at - n_res), mask=real & (at >= n_res), other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, tl.where(coded, v, raw), mask=real)


@triton.jit
def unpack_p(payload_ptr, pos_ptr, a_ptr, raw_pos_ptr, raw_ptr, n, n_low, BLOCK: tl.constexpr):
    """Pass P's summed payload where its decompress reads it: each low-rank value into the zero-padded
    orthogonalisation input at ``pos``, each raw sum into the store's raw values at ``raw_pos``.  The
    torch path copies the payload, scatters the low-rank part and copies each raw run."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    real = offs < n
    v = tl.load(payload_ptr + offs, mask=real, other=0.0)
    low = real & (offs < n_low)
    raw = real & (offs >= n_low)
    tl.store(a_ptr + tl.load(pos_ptr + offs, mask=low, other=0), v, mask=low)
    tl.store(raw_ptr + tl.load(raw_pos_ptr + (offs - n_low), mask=raw, other=0), v, mask=raw)


@triton.jit
def shift_gram(g_ptr, consts_ptr, R: tl.constexpr, RP: tl.constexpr):
    """One program per block: its r x r Gram matrix's diagonal plus ``shift`` times its trace, the trace
    at least ``floor`` (``consts``: [floor, shift] in the matrix's dtype, so a float64 floor below float32's
    range survives).  The torch path: a sum of the diagonal, a clamp and an add."""
    k = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, RP)
    diag = g_ptr + k * R * R + i * (R + 1)
    d = tl.load(diag, mask=i < R, other=0.0)
    trace = tl.sum(d, axis=0)
    floor = tl.load(consts_ptr)
    trace = tl.where(trace < floor, floor, trace)       # as clamp_min: a NaN trace stays NaN
    tl.store(diag, d + tl.load(consts_ptr + 1) * trace, mask=i < R)


@triton.jit
def keep_q(q_ptr, u_ptr, unused_ptr, at_ptr, q_all_ptr, size, R: tl.constexpr, RP: tl.constexpr,
           HAS_UNUSED: tl.constexpr, BLOCK: tl.constexpr):
    """Program (j, c): block j's next Q, chunk c of its ``size`` values, into the store's row ``at[j]``,
    unless a pivot of its last Cholesky round (the diagonal of ``u``, r x r; padding columns' pivots
    raised by ``unused``) is under 1/2: a rank-deficient block keeps its Q.  The torch path: a gather of
    the old Q, the pivots' minimum, a comparison, a select and a scatter."""
    j = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, RP)
    pivots = tl.load(u_ptr + j * R * R + i * (R + 1), mask=i < R, other=1.0)
    if HAS_UNUSED:
        pivots = pivots + tl.load(unused_ptr + j * R + i, mask=i < R, other=0.0)
    short = tl.sum((pivots < 0.5).to(tl.int32), axis=0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    real = (offs < size) & (short == 0)
    v = tl.load(q_ptr + j * size + offs, mask=real, other=0.0)
    tl.store(q_all_ptr + tl.load(at_ptr + j) * size + offs, v, mask=real)


@triton.jit
def feed_memory(e_ptr, g_ptr, flat_ptr, scratch_ptr, n, BLOCK: tl.constexpr):
    """PowerSGD's M = e + g, in the memory's dtype, kept in the memory and copied to both passes' inputs
    (``flat``, rounded to its dtype, and ``scratch``).  The torch path: an add and two copies."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    real = offs < n
    e = tl.load(e_ptr + offs, mask=real, other=0.0)
    m = e + tl.load(g_ptr + offs, mask=real, other=0.0).to(e.dtype)
    tl.store(e_ptr + offs, m, mask=real)
    tl.store(flat_ptr + offs, m, mask=real)
    tl.store(scratch_ptr + offs, m, mask=real)


@triton.jit
def keep_residual(e_ptr, flat_ptr, raw_ptr, n, ranks, F64: tl.constexpr, BLOCK: tl.constexpr):
    """After both rings: the mean ``flat / ranks`` (correctly rounded, as torch's division) back into
    ``flat``, and the memory e = M - that mean, 0 where ``raw`` marks a block sent exact.  The torch
    path: a subtraction, a fill per raw block and a division."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    real = offs < n
    e = tl.load(e_ptr + offs, mask=real, other=0.0)
    f = tl.load(flat_ptr + offs, mask=real, other=0.0)
    if F64:
        fv = f.to(tl.float64)
        mean = fv / (tl.zeros_like(fv) + ranks)
    else:
        fv = f.to(tl.float32)
        mean = tl.div_rn(fv, tl.zeros_like(fv) + ranks)
    raw = tl.load(raw_ptr + offs, mask=real, other=0) != 0
    tl.store(e_ptr + offs, tl.where(raw, 0.0, e - mean.to(e.dtype)), mask=real)
    tl.store(flat_ptr + offs, mean, mask=real)
