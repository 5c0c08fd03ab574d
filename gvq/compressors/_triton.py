"""The codecs' third path: fused Triton kernels (:mod:`._triton_quant`; the fitted quantizers'
:mod:`._triton_fit`) for the scalar quantizers and fp16, chosen once per device (:func:`use_triton`),
launched and counted here.  Triton is optional (``pip install 'gvq[gpu]'``): nothing here imports it
until a kernel runs.

See docs/design.md#gvqcompressors_tritonpy for how it works and why.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import Tensor

from gvq.compressors._dither import DITHER_OFFSET

KERNELS = ("auto", "triton", "torch")
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
    """A fitted quantizer's kernels (:mod:`._triton_fit`): its levels fitted per bucket on a histogram
    (``_histogram.encode_on_grid``), sent as its side floats; ``fit`` the kernel that fits them, ``bins``
    the bins of a bucket of n values (``_histogram.bins_for``: passed in, as _histogram imports this)."""
    fit: str
    bins: Callable[[int], int]


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def check_kernels(kernels: str) -> str:
    """``compressor.kernels``: refused in one line when ``triton`` is asked for and not installed."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels={kernels!r}: must be one of {', '.join(KERNELS)}")
    if kernels == "triton" and not triton_available():
        raise ValueError("kernels=triton: Triton is not installed (pip install 'gvq[gpu]'), or choose "
                         "kernels=auto (Triton on CUDA where installed) or kernels=torch")
    return kernels


def use_triton(kernels: str, device: torch.device) -> bool:
    """The path of a codec on ``device``, asked once per device (the codec keeps the answer): Triton on
    CUDA where importable (``auto``, ``triton``); on host tensors only where asked and the interpreter
    runs (``TRITON_INTERPRET=1``: the CPU tests), otherwise the host keeps its numba kernels."""
    if kernels == "torch" or not triton_available():
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and kernels == "triton" and os.environ.get("TRITON_INTERPRET") == "1"


# ---- launches: the one place a kernel is started, so a test can count them ------------------------
class LaunchCount:
    """Kernel launches since :func:`count_launches` began, by kernel name."""

    def __init__(self):
        self.launches, self.by_name = 0, {}


_COUNTERS: list[LaunchCount] = []


@contextmanager
def count_launches():
    """``with count_launches() as c: codec.compress(x, seg)``; then ``c.launches`` (a
    ``TorchDispatchMode`` does not see Triton launches)."""
    tally = LaunchCount()
    _COUNTERS.append(tally)
    try:
        yield tally
    finally:
        _COUNTERS.remove(tally)


def launch_kernel(kernel, grid: tuple, *args, **meta) -> None:
    for tally in _COUNTERS:
        tally.launches += 1
        tally.by_name[kernel.__name__] = tally.by_name.get(kernel.__name__, 0) + 1
    kernel[grid](*args, **meta)


def _kernels():
    from gvq.compressors import _triton_quant     # imports triton: only once a kernel runs
    return _triton_quant


def _word_meta(lay) -> dict:
    return {"K": lay.per_word, "KP": triton_pow2(lay.per_word), "WB": lay.word_bytes,
            "WBP": triton_pow2(lay.word_bytes), "BLOCK_W": BLOCK_WORDS}


def triton_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# ---- the scalar quantizers -------------------------------------------------------------------------
def quant_compress(q, x: Tensor, lay, seed: int, offset: int, uniforms: Tensor | None = None) -> Tensor:
    """Quantizer ``q``'s payload of ``x`` in two launches: the buckets' scales into the payload's side
    floats, then every wire word.  ``uniforms`` (numel,) in [0, 1): a test's, instead of Philox's draws
    at (``seed``, ``offset`` + value index)."""
    k, spec = _kernels(), q.triton_spec()
    if isinstance(spec, FitSpec):
        return fit_compress(q, spec, x, lay, seed, offset, uniforms)
    m = lay.n_buckets
    out = torch.empty(lay.nbytes, dtype=torch.uint8, device=x.device)   # fresh: may still be in flight
    side = out[: lay.side_bytes].view(torch.float32)
    lim = q.scratch("triton_lim", (m,), torch.float32, x.device) if q.clip else side
    launch_kernel(k.bucket_stats, (m,), x, side, lim, lay.numel, q.bucket, q.clip or 0.0,
           STAT=spec.stat, CLIP=bool(q.clip), BLOCK=triton_pow2(q.bucket))
    q.health.note(side)                 # NaN/Inf inputs make it so: read at the iteration's check
    launch_kernel(k.encode_words, (-(-lay.n_words // BLOCK_WORDS),), x, side, lim,
           x if uniforms is None else uniforms, out[lay.side_bytes:], lay.numel, q.bucket, lay.n_words,
           lay.radix, spec.value, spec.base, float(q.levels - 1), seed, offset,
           SIGN=spec.sign, CLIP=bool(q.clip), HAS_U=uniforms is not None, **_word_meta(lay))
    return out


def quant_decompress(q, payload: Tensor, lay) -> Tensor:
    """Inverse of :func:`quant_compress`, one launch."""
    if isinstance(q.triton_spec(), FitSpec):
        return fit_decompress(q, payload, lay)
    out = torch.empty(lay.numel, dtype=torch.float32, device=payload.device)
    side = payload[: lay.side_bytes].view(torch.float32)
    launch_kernel(_kernels().decode_words, (-(-lay.n_words // BLOCK_WORDS),), payload[lay.side_bytes:], side, out,
           lay.numel, q.bucket, lay.n_words, lay.radix, q.triton_spec().mult, **_word_meta(lay))
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
    grid = q.scratch("triton_grid", (3, m), torch.float32, dev)
    edges = q.scratch("triton_edges", (m, s), torch.int32, dev)
    ca = q.scratch("triton_ca", (m, s - 1, 2), torch.float32, dev)
    launch_kernel(getattr(k, spec.fit), (m,), x, _fractions(s, dev), out[: lay.side_bytes].view(torch.float32),
                  grid, edges, ca, lay.numel, q.bucket, m, bins, bins * (1 - 2.0 ** -20), q.dither_shift,
                  S=s, BLOCK=triton_pow2(width), BINS_P=triton_pow2(bins))
    q.health.note(grid[2])              # NaN/Inf inputs make the spans so: read at the iteration's check
    launch_kernel(k.fit_encode_words, (-(-lay.n_words // BLOCK_WORDS),), x, grid, edges, ca,
                  x if uniforms is None else uniforms, out[lay.side_bytes:], lay.numel, q.bucket, m,
                  lay.n_words, lay.radix, bins, float(s - 1), -DITHER_OFFSET, seed, offset,
                  S=s, HAS_U=uniforms is not None, **_word_meta(lay))
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


def fp16_decompress(payload: Tensor) -> Tensor:
    n = payload.numel() // 2
    out = torch.empty(n, dtype=torch.float32, device=payload.device)
    launch_kernel(_kernels().fp16_decode, (-(-n // FP16_BLOCK),), payload.view(torch.float16), out, n, BLOCK=FP16_BLOCK)
    return out
