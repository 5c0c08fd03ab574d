"""The sign codecs' Triton kernels (set up and launched by :mod:`._triton_grace`): EF-SignSGD's and 1-bit
SGD's per-group fit (a program per group, ragged groups looped over in blocks), the sign bits packed 8 a
byte (theirs and Signum's bit vote), Signum's int8 vote, and one decoder for all three.  Imported only once a
kernel runs (it imports triton)."""
from __future__ import annotations

import triton
import triton.language as tl

VOTE, SCALE, TWO_MEANS = 0, 1, 2        # what a set bit decodes to: +-1, +-scale, a group's mean of its side


@triton.jit
def group_fit(x_ptr, groups_ptr, side_ptr, G, TWO: tl.constexpr, BLOCK: tl.constexpr):
    """Group g (``groups``: start, length; (2, G) int64) -> its side floats: mean |v| (EF-SignSGD), or
    (TWO) the mean of its values < 0 then of its values >= 0, 0 for an empty side (1-bit SGD)."""
    g = tl.program_id(0)
    start = tl.load(groups_ptr + g)
    length = tl.load(groups_ptr + G + g).to(tl.int32)
    offs = tl.arange(0, BLOCK)
    pos = tl.zeros((), dtype=tl.float32)
    neg = tl.zeros((), dtype=tl.float32)
    n_pos = tl.zeros((), dtype=tl.int32)
    for i in range(0, length, BLOCK):
        m = i + offs < length
        v = tl.load(x_ptr + start + i + offs, mask=m, other=0.0).to(tl.float32)
        up = (v >= 0) & m
        if TWO:
            pos += tl.sum(tl.where(up, v, 0.0), axis=0)
            neg += tl.sum(tl.where(m & ~up, v, 0.0), axis=0)
            n_pos += tl.sum(up.to(tl.int32), axis=0)
        else:
            pos += tl.sum(tl.abs(v), axis=0)
    if TWO:
        n_neg = length - n_pos
        tl.store(side_ptr + 2 * g, tl.div_rn(neg, tl.maximum(n_neg, 1).to(tl.float32)))
        tl.store(side_ptr + 2 * g + 1, tl.div_rn(pos, tl.maximum(n_pos, 1).to(tl.float32)))
    else:
        tl.store(side_ptr + g, tl.div_rn(pos, length.to(tl.float32)))


@triton.jit
def pack_sign_bits(x_ptr, out_ptr, n, nbytes, BLOCK: tl.constexpr):
    """``_signs.pack_signs(x >= 0)``: value i at bit i % 8 of byte i // 8, zero padding."""
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for t in tl.static_range(8):
        at = j.to(tl.int64) * 8 + t
        m = at < n
        v = tl.load(x_ptr + at, mask=m, other=-1.0)
        acc |= ((v >= 0) & m).to(tl.int32) << t
    tl.store(out_ptr + j, acc.to(tl.uint8), mask=j < nbytes)


@triton.jit
def int8_vote(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Signum's int8 vote: +1 where v >= 0, else -1 (NaN votes -1, as ``x >= 0`` says)."""
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = at < n
    v = tl.load(x_ptr + at, mask=m, other=0.0)
    tl.store(out_ptr + at, tl.where(v >= 0, 1, -1).to(tl.int8), mask=m)


@triton.jit
def sign_decode(bits_ptr, side_ptr, gid_ptr, out_ptr, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    """Each value from its bit (value i at bit i % 8 of byte i // 8) and, but for MODE=VOTE, its group's
    side floats (``gid``: each value's group, int32)."""
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = at < n
    up = ((tl.load(bits_ptr + at // 8, mask=m, other=0).to(tl.int32) >> (at % 8)) & 1) != 0
    if MODE == 0:
        v = tl.where(up, 1.0, -1.0)
    elif MODE == 1:
        scale = tl.load(side_ptr + tl.load(gid_ptr + at, mask=m, other=0), mask=m, other=0.0)
        v = tl.where(up, scale, -scale)
    else:
        g = tl.load(gid_ptr + at, mask=m, other=0)
        v = tl.where(up, tl.load(side_ptr + 2 * g + 1, mask=m, other=0.0), tl.load(side_ptr + 2 * g, mask=m, other=0.0))
    tl.store(out_ptr + at, v, mask=m)


@triton.jit
def int8_decode(votes_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """A sum of int8 votes as float32 (exact)."""
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = at < n
    tl.store(out_ptr + at, tl.load(votes_ptr + at, mask=m, other=0).to(tl.float32), mask=m)
