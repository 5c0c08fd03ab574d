"""Natural compression's Triton kernels (set up and launched by :mod:`._triton_grace`): encode (exponent
bytes, packed signs, each program's largest code for the health check) and decode, one launch each.
Imported only once a kernel runs (it imports triton)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def natural_encode(x_ptr, u_ptr, codes_ptr, signs_ptr, peaks_ptr, n, n_signs, seed, offset,
                   HAS_U: tl.constexpr, BLOCK: tl.constexpr):
    """``Natural.compress``'s rule: |bits| + a uniform 23-bit integer carries into the exponent with
    probability m; the uniforms Philox's at (seed, offset + index), or a test's (``HAS_U``, int32)."""
    pid = tl.program_id(0)
    at = pid * BLOCK + tl.arange(0, BLOCK)
    m = at < n
    bits = tl.load(x_ptr + at, mask=m, other=0.0).to(tl.float32).to(tl.int32, bitcast=True)
    if HAS_U:
        u = tl.load(u_ptr + at, mask=m, other=0)
    else:
        u = tl.randint(seed, offset + at.to(tl.int64)).to(tl.int32, bitcast=True)
    mag = (bits & 0x7FFFFFFF) + (u & 0x7FFFFF)       # Inf/NaN may wrap past 2^31, as on the torch path
    code = tl.minimum((mag >> 23) & 0x1FF, 255)
    tl.store(codes_ptr + at, code.to(tl.uint8), mask=m)
    tl.store(peaks_ptr + pid, tl.max(tl.where(m, code, 0), axis=0).to(tl.float32))
    neg = tl.reshape(((bits < 0) & m).to(tl.int32), (BLOCK // 8, 8))
    byte = tl.sum(neg << tl.arange(0, 8)[None, :], axis=1)       # least significant first (_packing)
    j = pid * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
    tl.store(signs_ptr + j, byte.to(tl.uint8), mask=j < n_signs)


@triton.jit
def natural_decode(codes_ptr, signs_ptr, out_ptr, n, BLOCK: tl.constexpr):
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = at < n
    code = tl.load(codes_ptr + at, mask=m, other=0).to(tl.int32)
    sign = (tl.load(signs_ptr + at // 8, mask=m, other=0).to(tl.int32) >> (at % 8)) & 1
    tl.store(out_ptr + at, ((code << 23) | (sign << 31)).to(tl.float32, bitcast=True), mask=m)
