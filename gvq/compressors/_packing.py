"""Wire layout and bit packing of the scalar quantizers' codes (split out of :mod:`bucketing`).

Every size is a function of ``(numel, config)`` only, so a receiver can post its receive before the
sender has quantized anything.  Codes of ``levels`` values are packed in b-bit fields
(``dense=False``) or base-``levels`` digits (``dense=True``: e.g. five ternary digits a byte).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from gvq.compressors import _fused as fused

MAX_WORD_BYTES = 6            # words < 2**48: exact in int64 and float64 arithmetic
MAX_LEVELS = 1 << 16           # codes must fit 16 bits (the ``bits <= 16`` limit)
BIT_GATHER = 0x0102040810204080  # sum of 2**(56 - 7j), j < 8: gathers eight byte-aligned bits

# ---- layout: every size is a function of (numel, config) only ----------------------------------
@functools.lru_cache(maxsize=None)
def word_format(levels: int, dense: bool) -> tuple[int, int, int]:
    """(radix, per_word, word_bytes) for codes in [0, levels): fewest bits per value, ties to the
    smaller word (cheaper kernels)."""
    radix = levels if dense else 1 << max(1, (levels - 1).bit_length())
    best = None
    for nbytes in range(1, MAX_WORD_BYTES + 1):
        k = 0
        while radix ** (k + 1) <= 1 << (8 * nbytes):
            k += 1
        if k and (best is None or nbytes * best[1] < best[2] * k):
            best = (radix, k, nbytes)
    return best


@dataclass(frozen=True)
class Layout:
    numel: int
    bucket: int          # 0 => one bucket for the whole segment
    n_side: int          # float32 side values per bucket
    radix: int
    per_word: int
    word_bytes: int

    @property
    def n_buckets(self) -> int:
        if self.numel == 0:
            return 0
        return 1 if self.bucket == 0 else -(-self.numel // self.bucket)

    @property
    def side_bytes(self) -> int:
        return 4 * self.n_buckets * self.n_side

    @property
    def n_words(self) -> int:
        return -(-self.numel // self.per_word)

    @property
    def nbytes(self) -> int:
        return self.side_bytes + self.n_words * self.word_bytes


def split_rows(x: Tensor, bucket: int) -> list[Tensor]:
    """Zero-copy 2-D views of ``x``: full buckets (m, bucket), then the ragged tail (1, t)."""
    n = x.numel()
    if n == 0:
        return []
    if bucket == 0 or bucket >= n:
        return [x.view(1, n)]
    m = n // bucket
    parts = [x[: m * bucket].view(m, bucket)]
    if n > m * bucket:
        parts.append(x[m * bucket:].view(1, n - m * bucket))
    return parts


# ---- packing -------------------------------------------------------------------------------
def pack(codes: Tensor, lay: Layout, out: Tensor, work: Tensor | None = None, host: bool = False) -> None:
    """Codes (n_words * per_word,) in [0, radix), zero-padded -> ``out``, uint8 (n_words * word_bytes,).
    ``work``: a reusable float64 buffer of the codes' size for the many-digit path (a fresh one
    costs its page faults on every call); ``host``: the codec is on the host path (``kernels.HOST``),
    whose numba kernel packs many-digit words."""
    k, radix, nw = lay.per_word, lay.radix, lay.n_words
    assert codes.numel() == nw * k, "pad codes to whole words (BucketQuantizer._code_stream)"
    if lay.word_bytes == 1 and k == 8 and radix == 2 and codes.element_size() == 1:
        # 1 bit a value: eight 0/1 bytes read as one int64; a multiply moves byte j's bit to bit 56 + j
        # with no two partial products on one bit (no carries), the top byte is the packed word
        word = codes.view(torch.uint8).view(nw, 8).view(torch.int64).view(nw) * BIT_GATHER
        out.copy_(word.bitwise_right_shift_(56).bitwise_and_(0xFF))
        return
    if lay.word_bytes == 1:
        c = codes.view(nw, k).to(torch.uint8)
        if k == 2 and radix == 16:                    # hot path (4-bit QSGD): c0 | c1 << 4 via int16
            v = c.view(torch.int16).view(nw)
            out.copy_(v.bitwise_or(v >> 4))           # int16 -> uint8 keeps the low byte
            return
        word = c[:, k - 1].clone()                    # radix**k <= 256: uint8 Horner is exact
        for j in range(k - 2, -1, -1):
            word.mul_(radix).add_(c[:, j])
        out.copy_(word)
        return
    if host and codes.is_contiguous():                # one compiled pass (the torch ops below
        fused.pack_words(codes.numpy(), radix, k, lay.word_bytes, out.numpy())   # make 3-5 passes)
        return
    c = codes.view(nw, k)                             # < 2**48: exact in int64 (and in float64)
    if k > 8:     # one float64 matrix-vector product, exact below 2**53: faster than 16 strided
        # Horner steps at 17 base-5 digits a word (few digits: Horner is as fast)
        cf = c.to(torch.float64) if work is None else work.view(nw, k).copy_(c)
        word = torch.mv(cf, _powers(radix, k, c.device)).to(torch.int64)
    else:
        word = torch.empty(nw, dtype=torch.int64, device=c.device).copy_(c[:, k - 1])   # dense, even if nw == 1
        for j in range(k - 2, -1, -1):
            word.mul_(radix).add_(c[:, j])
    if lay.word_bytes in (2, 4):      # low bytes by an integer cast: contiguous (the strided byte copy
        out.view({2: torch.int16, 4: torch.int32}[lay.word_bytes]).copy_(word)   # below is far slower)
    else:
        out.view(nw, lay.word_bytes).copy_(word.view(torch.uint8).view(nw, 8)[:, : lay.word_bytes])


@functools.lru_cache(maxsize=None)
def _powers(radix: int, k: int, device: torch.device, dtype: torch.dtype = torch.float64) -> Tensor:
    """radix**j for j < k, float64 (exact: words < 2**48) unless asked, on ``device``."""
    return torch.tensor([float(radix ** j) for j in range(k)], dtype=dtype, device=device)


def digit_dtype(radix: int) -> torch.dtype:
    return torch.uint8 if radix <= 256 else torch.int32


def _chunk(radix: int) -> int:
    """Digits decoded per table lookup: radix**c <= 2**16 table rows, c digits packed in <= 8 bytes."""
    dsize = digit_dtype(radix).itemsize
    c = 1
    while radix ** (c + 1) <= 1 << 16 and (c + 1) * dsize <= 8:
        c += 1
    return c


@functools.lru_cache(maxsize=None)
def _digit_table(radix: int, c: int, device: torch.device = torch.device("cpu")) -> Tensor:
    """Every value in [0, radix**c) -> its c digits, side by side in one integer of a 1-D table, so that
    decoding is one ``index_select`` (much faster than gathering 2-D rows).  Built once per device, on
    ``device`` (the payload's)."""
    dtype = digit_dtype(radix)
    dsize = dtype.itemsize
    width = next(w for w in (1, 2, 4, 8) if w >= c * dsize)
    values = torch.arange(radix ** c, dtype=torch.int64, device=device)
    table = torch.zeros(len(values), width // dsize, dtype=dtype, device=device)
    for j in range(c):
        table[:, j] = ((values // radix ** j) % radix).to(dtype)
    return table.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]).view(-1)


def unpack(data: Tensor, lay: Layout) -> Tensor:
    """Inverse of :func:`pack`: codes (numel,), uint8 if radix <= 256 else int32.  Words are split
    into chunks of digits by exact float64 division (words < 2**48), each chunk decoded by a table."""
    k, radix, nw, wb = lay.per_word, lay.radix, lay.n_words, lay.word_bytes
    dtype, c = digit_dtype(radix), _chunk(radix)
    if wb == 1:
        word = data.to(torch.int64)
    else:
        buf = torch.zeros(nw, 8, dtype=torch.uint8, device=data.device)   # zero-extend words to 64 bits
        buf[:, :wb] = data.view(nw, wb)
        word = buf.view(torch.int64).view(nw)
    out = torch.empty(nw, k, dtype=dtype, device=data.device)
    for start in range(0, k, c):
        cc = min(c, k - start)
        if start + cc < k:                            # floor(x / r) is exact for integers < 2**53
            x = word.double()
            word = torch.div(x, radix ** cc).floor_()
            piece = x.sub_(word * radix ** cc).to(torch.int64)
            word = word.to(torch.int64)
        else:
            piece = word
        table = _digit_table(radix, cc, data.device)
        digits = torch.index_select(table, 0, piece).view(dtype)
        out[:, start: start + cc] = digits.view(nw, table.element_size() // out.element_size())[:, :cc]
    return out.view(-1)[: lay.numel]


# ---- whole-batch packing (the device path: a fixed few ops, any number of buckets) ----------------
def pack_rows(codes: Tensor, lay: Layout) -> Tensor:
    """Integer codes (m, width), in value order (any beyond ``numel`` are padding) -> the packed words,
    uint8 (n_words * word_bytes,), the format :func:`pack` writes except that padding codes need not be
    zero (decoders drop them).  Words as one product with the radix's powers and one sum, in uint8 where
    a word is one byte (exact: a word < 256), in int64 beyond; whole rows at once where words divide them."""
    k, nw, wb = lay.per_word, lay.n_words, lay.word_bytes
    if codes.shape[-1] % k == 0:
        c = codes.view(-1, k)
    else:                                             # the batch's own padding fills the last word, or zeros
        c = _to_length(codes.view(-1), nw * k).view(nw, k)
    dtype = torch.uint8 if wb == 1 else torch.int64
    if c.dtype != dtype:
        c = c.to(dtype)
    word = c.view(-1) if k == 1 else torch.mul(c, _int_powers(lay.radix, k, c.device, dtype)).sum(1, dtype=dtype)
    if word.numel() > nw:                              # whole padding words past the last real one
        word = word[:nw]
    if wb == 1:
        return word
    return word.view(torch.uint8).view(nw, 8)[:, :wb].reshape(-1)


def unpack_digits(data: Tensor, lay: Layout, count: int) -> Tensor:
    """Inverse of :func:`pack_rows`: ``count`` codes (the padded batch's, ``count`` >= numel; zeros past
    the words), integer digits by floor division and remainder on whole words: no table, so any byte
    decodes in range."""
    k, nw, wb, radix = lay.per_word, lay.n_words, lay.word_bytes, lay.radix
    if wb == 1:
        word = data
    else:                                              # zero-extend to int64 words
        buf = torch.zeros(nw, 8, dtype=torch.uint8, device=data.device)
        buf[:, :wb] = data.view(nw, wb)
        word = buf.view(torch.int64).view(nw)
    if count % k == 0 and count // k > nw:             # pad whole words: cheaper than padding digits
        word = torch.nn.functional.pad(word, (0, count // k - nw))
    if k == 1:
        return word
    digits = torch.remainder(torch.floor_divide(word.view(-1, 1), _int_powers(radix, k, word.device, word.dtype)),
                             radix).view(-1)
    return _to_length(digits, count)


def _to_length(flat: Tensor, count: int) -> Tensor:
    """``flat`` cut or zero-padded to ``count`` values (itself if it has as many)."""
    have = flat.numel()
    if have > count:
        return flat[:count]
    return torch.nn.functional.pad(flat, (0, count - have)) if have < count else flat


@functools.lru_cache(maxsize=None)
def _int_powers(radix: int, k: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """radix**j for j < k in the words' integer dtype, on ``device``."""
    return torch.tensor([radix ** j for j in range(k)], dtype=dtype, device=device)


# ---- fixed-width bit fields (a sparsifier's indices): exactly ceil(count * bits / 8) bytes -------------
def pack_bits(codes: Tensor, bits: int) -> Tensor:
    """Non-negative integer codes < 2**bits -> uint8 (ceil(count * bits / 8),), each code's ``bits`` bits
    least significant first, back to back with no word padding.  A fixed few whole-tensor ops: every
    code's bits as a 0/1 matrix, then eight bits a byte by one product with their place values."""
    count = codes.numel()
    if bits == 1:               # codes are 0 or 1 already: no int64 copy to shift (signs: 5x a gradient's bytes)
        flat = codes.reshape(-1).to(torch.uint8)
    else:
        shifts = torch.arange(bits, dtype=torch.int64, device=codes.device)
        flat = (codes.reshape(-1, 1).to(torch.int64) >> shifts).bitwise_and_(1).to(torch.uint8).view(-1)
    flat = _to_length(flat, -(-count * bits // 8) * 8)
    return (flat.view(-1, 8) * _BYTE_PLACES.to(codes.device)).sum(1, dtype=torch.uint8)


def unpack_flags(data: Tensor, count: int) -> Tensor:
    """:func:`unpack_bits` at one bit a code, as ``count`` bools (no int64 products to sum)."""
    return (data.reshape(-1, 1) >> _BYTE_SHIFTS.to(data.device)).bitwise_and_(1).view(-1)[:count].bool()


def unpack_bits(data: Tensor, bits: int, count: int) -> Tensor:
    """Inverse of :func:`pack_bits`: ``count`` int64 codes."""
    flat = (data.reshape(-1, 1) >> _BYTE_SHIFTS.to(data.device)).bitwise_and_(1).view(-1)[: count * bits]
    places = torch.ones(bits, dtype=torch.int64, device=data.device) << torch.arange(bits, device=data.device)
    return (flat.view(count, bits).to(torch.int64) * places).sum(1)


_BYTE_PLACES = torch.tensor([1 << j for j in range(8)], dtype=torch.uint8)
_BYTE_SHIFTS = torch.arange(8, dtype=torch.uint8)
