"""The codecs' third path: fused Triton kernels (:mod:`._triton_quant`) for the scalar quantizers and
fp16, chosen once per device (:func:`use_triton`), launched and counted here.  Triton is optional
(``pip install 'gvq[gpu]'``): nothing here imports it until a kernel runs.

See docs/design.md#gvqcompressors_tritonpy for how it works and why.
"""
from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import Tensor

KERNELS = ("auto", "triton", "torch")
BLOCK_WORDS = 256           # wire words a program of encode / decode handles
FP16_BLOCK = 4096           # values a program of the fp16 kernels handles
MAX_BUCKET = 1 << 16        # a bucket is one program's block: larger ones keep the torch path
L2, MAX, MEAN = 0, 1, 2     # the per-bucket statistic a quantizer scales by (``TritonSpec.stat``)


class TritonSpec(NamedTuple):
    """What a quantizer's kernels compute: ``stat`` (its per-bucket scale: L2 / MAX /
    MEAN), code ``floor(u + base + value * v / side)`` (or ``v >= 0`` where ``sign``), decoded as
    ``code * side * mult - side``."""
    stat: int
    value: float
    base: float
    mult: float
    sign: bool = False


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
    out = torch.empty(lay.numel, dtype=torch.float32, device=payload.device)
    side = payload[: lay.side_bytes].view(torch.float32)
    launch_kernel(_kernels().decode_words, (-(-lay.n_words // BLOCK_WORDS),), payload[lay.side_bytes:], side, out,
           lay.numel, q.bucket, lay.n_words, lay.radix, q.triton_spec().mult, **_word_meta(lay))
    return out


def supports(q) -> bool:
    """Whether ``q``'s layout fits the kernels: a bucket a program can hold (not one per segment)."""
    return 0 < q.bucket <= MAX_BUCKET and q.triton_spec() is not None


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
