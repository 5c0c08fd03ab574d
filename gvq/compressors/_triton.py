"""The scalar quantizers' and fp16's ``triton`` path (:mod:`._kernels`): fused Triton kernels
(:mod:`._triton_quant`; the fitted quantizers' :mod:`._triton_fit`, Linear-s and ORQ-s, and
:mod:`._triton_bin`, BinGrad-b and -pb; the ring hop's :mod:`._triton_hop`), set up and launched here
(through ``_kernels.launch_kernel``, which counts them).  Triton is optional (``pip install 'gvq[gpu]'``):
nothing here imports it until a kernel runs.

See docs/design.md#gvqcompressors_tritonpy for how it works and why.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from gvq.compressors._dither import DITHER_OFFSET
from gvq.compressors._kernels import launch_kernel, triton_pow2

BLOCK_WORDS = 256           # wire words a program of encode / decode handles
FP16_BLOCK = 4096           # values a program of the fp16 kernels handles
MAX_BUCKET = 1 << 16        # a bucket is one program's block: larger ones keep the torch path
L2, MAX, MEAN = 0, 1, 2     # the per-bucket statistic a quantizer scales by (``TritonSpec.stat``)
FIT_MAX_LEVELS = 16         # a fitted quantizer's levels unrolled in its kernels: more keep the torch path


class TritonSpec(NamedTuple):
    """What a quantizer's kernels compute: ``stat`` (its per-bucket scale: L2 / MAX /
    MEAN), code ``floor(u + base + value * v / side)`` (or ``v >= 0`` where ``sign``), decoded as
    ``code * side * mult - side``."""
    stat: int
    value: float
    base: float
    mult: float
    sign: bool = False


class FitSpec(NamedTuple):
    """A fitted quantizer's kernels: its side floats fitted per bucket on a histogram; ``fit`` the kernel
    that fits them, ``bins`` the bins of a bucket of n values (``_histogram.bins_for``: passed in, as
    _histogram imports this).  ``binary``: BinGrad's two codes (:mod:`._triton_bin`), a threshold or a
    clip level, else s levels rounded between (:mod:`._triton_fit`, ``_histogram.encode_on_grid``);
    ``mean``: BinGrad-b's threshold the mean; ``mult``: decoded as a :class:`TritonSpec`'s
    ``code * side * mult - side`` (BinGrad-pb), else each code's side float looked up."""
    fit: str
    bins: Callable[[int], int]
    binary: bool = False
    mean: bool = False
    mult: float | None = None


def _kernels():
    from gvq.compressors import _triton_quant     # imports triton: only once a kernel runs
    return _triton_quant


def _word_meta(lay) -> dict:
    return {"K": lay.per_word, "KP": triton_pow2(lay.per_word), "WB": lay.word_bytes,
            "WBP": triton_pow2(lay.word_bytes), "BLOCK_W": BLOCK_WORDS}


# ---- the scalar quantizers -------------------------------------------------------------------------
def quant_compress(q, x: Tensor, lay, seed: int, offset: int, uniforms: Tensor | None = None) -> Tensor:
    """Quantizer ``q``'s payload of ``x`` in two launches: the buckets' scales into the payload's side
    floats, then every wire word.  ``uniforms`` (numel,) in [0, 1): a test's, instead of Philox's draws
    at (``seed``, ``offset`` + value index)."""
    k, spec = _kernels(), q.triton_spec()
    if isinstance(spec, FitSpec):
        fit = bin_compress if spec.binary else fit_compress
        return fit(q, spec, x, lay, seed, offset, uniforms)
    m = lay.n_buckets
    out = torch.empty(lay.nbytes, dtype=torch.uint8, device=x.device)   # fresh: may still be in flight
    side = out[: lay.side_bytes].view(torch.float32)
    lim = q.scratch("triton_lim", (m,), torch.float32, x.device) if q.clip else side
    launch_kernel(k.bucket_stats, (m,), x, side, lim, lay.numel, q.bucket, q.clip or 0.0,
           STAT=spec.stat, CLIP=bool(q.clip), BLOCK=triton_pow2(q.bucket))
    q.health.note(side)                 # NaN/Inf inputs make it so: read at the iteration's check
    return _encode(q, spec, x, lim, out, lay, seed, offset, uniforms)


def _encode(q, spec: TritonSpec, x: Tensor, lim: Tensor, out: Tensor, lay, seed: int, offset: int,
            uniforms: Tensor | None) -> Tensor:
    """Every wire word of ``x`` into ``out``, its side floats already there: one launch."""
    launch_kernel(_kernels().encode_words, (-(-lay.n_words // BLOCK_WORDS),), x,
                  out[: lay.side_bytes].view(torch.float32), lim, x if uniforms is None else uniforms,
                  out[lay.side_bytes:], lay.numel, q.bucket, lay.n_words, lay.radix, spec.value, spec.base,
                  float(q.levels - 1), seed, offset, SIGN=spec.sign, CLIP=bool(q.clip),
                  HAS_U=uniforms is not None, **_word_meta(lay))
    return out


def fuses_hop(q) -> bool:
    """Whether ``q``'s ring hop is fused (:func:`quant_reencode_sum`): the scalar quantizers that scale
    by a statistic; the fitted ones hop as decompress + add + compress."""
    return isinstance(q.triton_spec(), TritonSpec)


def quant_reencode_sum(q, payload: Tensor, local: Tensor, lay, seed: int, offset: int,
                       uniforms: Tensor | None = None) -> Tensor:
    """The re-encode ring's hop in two launches: a program per bucket decodes ``payload``, adds
    ``local`` and writes the sum's scales into the new payload's side floats, then every wire word is
    encoded as :func:`quant_compress` encodes them (draws and ``uniforms`` as there)."""
    from gvq.compressors import _triton_hop as k        # imports triton: only once a kernel runs
    spec, dev = q.triton_spec(), payload.device
    out = torch.empty(lay.nbytes, dtype=torch.uint8, device=dev)   # fresh: may still be in flight
    side = out[: lay.side_bytes].view(torch.float32)
    lim = q.scratch("triton_lim", (lay.n_buckets,), torch.float32, dev) if q.clip else side
    total = q.scratch("triton_hop_sum", (lay.numel,), torch.float32, dev)
    words, in_side = payload[lay.side_bytes:], payload[: lay.side_bytes].view(torch.float32)
    launch_kernel(k.hop_stats, (lay.n_buckets,), words, in_side, local, total, side, lim, lay.numel, q.bucket,
                  lay.radix, spec.mult, q.clip or 0.0, STAT=spec.stat, CLIP=bool(q.clip),
                  BLOCK=triton_pow2(q.bucket), K=lay.per_word, WB=lay.word_bytes, WBP=triton_pow2(lay.word_bytes))
    q.health.note(side)                 # NaN/Inf sums make it so: read at the iteration's check
    return _encode(q, spec, total, lim, out, lay, seed, offset, uniforms)


def quant_decompress(q, payload: Tensor, lay) -> Tensor:
    """Inverse of :func:`quant_compress`, one launch."""
    spec = q.triton_spec()
    if isinstance(spec, FitSpec) and spec.mult is None:
        return fit_decompress(q, payload, lay)
    out = torch.empty(lay.numel, dtype=torch.float32, device=payload.device)
    side = payload[: lay.side_bytes].view(torch.float32)
    launch_kernel(_kernels().decode_words, (-(-lay.n_words // BLOCK_WORDS),), payload[lay.side_bytes:], side, out,
           lay.numel, q.bucket, lay.n_words, lay.radix, spec.mult, **_word_meta(lay))
    return out


def supports(q) -> bool:
    """Whether ``q``'s layout fits the kernels: a bucket a program can hold (not one per segment)."""
    return 0 < q.bucket <= MAX_BUCKET and q.triton_spec() is not None


# ---- the fitted quantizers ------------------------------------------------------------------------
def fit_compress(q, spec: FitSpec, x: Tensor, lay, seed: int, offset: int, uniforms: Tensor | None) -> Tensor:
    """A fitted quantizer's payload in two launches: a program per bucket fits its levels into the side
    floats, then every wire word is rounded (Eq. 7) and packed; arguments as :func:`quant_compress`."""
    from gvq.compressors import _triton_fit as k        # imports triton: only once a kernel runs
    m, s, dev = lay.n_buckets, q.levels, x.device
    width = min(q.bucket, lay.numel)                     # the torch path's batch width: its bins
    bins = spec.bins(width)
    out = torch.empty(lay.nbytes, dtype=torch.uint8, device=dev)   # fresh: may still be in flight
    grid = torch.empty(3, m, dtype=torch.float32, device=dev)   # fresh: its spans are noted until the check
    edges = q.scratch("triton_edges", (m, s), torch.int32, dev)
    ca = q.scratch("triton_ca", (m, s - 1, 2), torch.float32, dev)
    launch_kernel(getattr(k, spec.fit), (m,), x, _fractions(s, dev), out[: lay.side_bytes].view(torch.float32),
                  grid, edges, ca, lay.numel, q.bucket, m, bins, bins * (1 - 2.0 ** -20), q.dither_shift,
                  S=s, SP=triton_pow2(s), BLOCK=triton_pow2(width), BINS_P=triton_pow2(bins))
    q.health.note(grid[2])              # NaN/Inf inputs make the spans so: read at the iteration's check
    launch_kernel(k.fit_encode_words, (-(-lay.n_words // BLOCK_WORDS),), x, grid, edges, ca,
                  x if uniforms is None else uniforms, out[lay.side_bytes:], lay.numel, q.bucket, m,
                  lay.n_words, lay.radix, bins, float(s - 1), -DITHER_OFFSET, seed, offset,
                  S=s, HAS_U=uniforms is not None, **_word_meta(lay))
    return out


def bin_compress(q, spec: FitSpec, x: Tensor, lay, seed: int, offset: int, uniforms: Tensor | None) -> Tensor:
    """BinGrad's payload in two launches: a program per bucket fits its side floats and one parameter
    the encode reads (the threshold b0, or 0.5 / b1), then every wire word is coded and packed; arguments
    as :func:`quant_compress`.  Floats as the torch path's (``_histogram.bin_counts``: float64 where
    float32 would round the prefix sums; its padded batch, where a bucket is ragged)."""
    from gvq.compressors import _triton_bin as k        # imports triton: only once a kernel runs
    m, dev = lay.n_buckets, x.device
    width = min(q.bucket, lay.numel)                     # the torch path's batch width: its bins
    bins = spec.bins(width)
    out = torch.empty(lay.nbytes, dtype=torch.uint8, device=dev)   # fresh: may still be in flight
    par = q.scratch("triton_par", (m,), torch.float32, dev)
    health = torch.empty(m, dtype=torch.float32, device=dev)       # fresh: noted until the check
    # a round-off the torch path does not make would move a level: no multiply-add fused on the GPU
    launch_kernel(getattr(k, spec.fit), (m,), x, out[: lay.side_bytes].view(torch.float32), par, health,
                  lay.numel, q.bucket, bins, bins * (1 - 2.0 ** -20), 1 << bins.bit_length(), MEAN=spec.mean,
                  PADDED=m * width > lay.numel, F64=width * bins >= 1 << 23, BLOCK=triton_pow2(width),
                  BINS_P=triton_pow2(bins), enable_fp_fusion=False)
    q.health.note(health)
    launch_kernel(k.bin_encode_words, (-(-lay.n_words // BLOCK_WORDS),), x, par,
                  x if uniforms is None else uniforms, out[lay.side_bytes:], lay.numel, q.bucket, lay.n_words,
                  lay.radix, seed, offset, PB=q.stochastic, HAS_U=uniforms is not None, **_word_meta(lay))
    return out


@functools.lru_cache(maxsize=64)
def _fractions(s: int, device: torch.device) -> Tensor:
    """The quantiles j/(s-1), float64, as the torch path makes them (``linspace``'s own rounding)."""
    return torch.linspace(0, 1, s, dtype=torch.float64, device=device)


def fit_decompress(q, payload: Tensor, lay) -> Tensor:
    """Inverse of :func:`fit_compress`, one launch: each code's level looked up."""
    from gvq.compressors import _triton_fit as k
    out = torch.empty(lay.numel, dtype=torch.float32, device=payload.device)
    launch_kernel(k.fit_decode_words, (-(-lay.n_words // BLOCK_WORDS),), payload[lay.side_bytes:],
                  payload[: lay.side_bytes].view(torch.float32), out, lay.numel, q.bucket, lay.n_words,
                  lay.radix, S=q.levels, **_word_meta(lay))
    return out


# ---- fp16 ------------------------------------------------------------------------------------------
def fp16_compress(x: Tensor, health) -> Tensor:
    """``x`` as float16 bytes, one launch; the blocks' max |value| noted for the range check."""
    n, blocks = x.numel(), -(-x.numel() // FP16_BLOCK)
    out = torch.empty(2 * n, dtype=torch.uint8, device=x.device)
    peaks = torch.empty(blocks, dtype=torch.float32, device=x.device)
    launch_kernel(_kernels().fp16_encode, (blocks,), x, out.view(torch.float16), peaks, n, BLOCK=FP16_BLOCK)
    health.note(peaks)
    return out


def fp16_reencode_sum(payload: Tensor, local: Tensor, health) -> Tensor:
    """The re-encode ring's hop for fp16, one launch: float16 payload + ``local``, sent as float16."""
    from gvq.compressors import _triton_hop as k
    n, blocks = local.numel(), -(-local.numel() // FP16_BLOCK)
    out = torch.empty(2 * n, dtype=torch.uint8, device=local.device)
    peaks = torch.empty(blocks, dtype=torch.float32, device=local.device)
    launch_kernel(k.fp16_hop, (blocks,), payload.view(torch.float16), local, out.view(torch.float16), peaks, n,
                  BLOCK=FP16_BLOCK)
    health.note(peaks)
    return out


def fp16_decompress(payload: Tensor) -> Tensor:
    n = payload.numel() // 2
    out = torch.empty(n, dtype=torch.float32, device=payload.device)
    launch_kernel(_kernels().fp16_decode, (-(-n // FP16_BLOCK),), payload.view(torch.float16), out, n, BLOCK=FP16_BLOCK)
    return out
