"""GRACE's codecs' ``triton`` path (:mod:`._kernels`): top-k's kernels (:mod:`._triton_topk`) and natural
compression's (:mod:`._triton_natural`) set up and launched here, through ``_kernels.launch_kernel`` (which
counts them); no host reads, and a program per scope or block whatever the depth.  Top-k: compress is 1
launch (int32 indices) or 2 (packed: the select writes int32 indices to a scratch buffer, then a pack),
decompress 2 (zero-fill, scatter); its scope table is a constant of the plan, made once per segment and
device.  Natural: one launch each way.  Triton is optional: nothing here imports it until a kernel runs."""
from __future__ import annotations

import torch
from torch import Tensor

from gvq.compressors._kernels import launch_kernel, triton_pow2

MAX_BLOCK = 2048            # values a select program loads at once (its scope is looped over in blocks)
BYTE_BLOCK = 1024           # packed index bytes a pack program writes
FILL_BLOCK = 4096           # values a zero-fill program writes
SLOT_BLOCK = 256            # kept values a scatter program writes at once


def _topk_kernels():
    from gvq.compressors import _triton_topk     # imports triton: only once a kernel runs
    return _triton_topk


def scope_table(plan, device) -> Tensor:
    """(4, S) int64: each scope's start, length, k and first slot (the plan's constants, on ``device``)."""
    lengths = [b - a for a, b in zip(plan.starts, plan.starts[1:] + [plan.n])]
    firsts = [sum(plan.ks[:i]) for i in range(len(plan.ks))]
    return torch.tensor([plan.starts, lengths, plan.ks, firsts], dtype=torch.int64, device=device)


def _program_block(plan) -> int:
    """Values a topk_select program loads at once: the longest scope's power of two, capped (a program
    loops over a longer scope in blocks of this)."""
    longest = max(b - a for a, b in zip(plan.starts, plan.starts[1:] + [plan.n]))
    return min(MAX_BLOCK, triton_pow2(longest))


def topk_compress(codec, x: Tensor, seg: slice) -> Tensor:
    """``codec``'s payload of ``x`` (the segment's values, flat) in its layout: int32 indices then the
    values, or the values then the indices packed (``TopK.compress``'s bytes, slots in index order)."""
    plan, table = codec.plan(seg), codec.triton_table(seg, x.device)
    k, dev, scopes = plan.k, x.device, len(plan.ks)
    out = torch.empty(codec.payload_spec(seg)[1], dtype=torch.uint8, device=dev)  # fresh: may be in flight
    vbytes = k * codec.vdtype.itemsize
    if codec.indices == "int32":
        idx, vals = out[: 4 * k].view(torch.int32), out[4 * k:].view(codec.vdtype)
    else:
        idx, vals = torch.empty(k, dtype=torch.int32, device=dev), out[:vbytes].view(codec.vdtype)
    launch_kernel(_topk_kernels().topk_select, (scopes,), x, table, idx, vals, scopes, BLOCK=_program_block(plan))
    if codec.indices == "packed":
        nbytes = out.numel() - vbytes
        launch_kernel(_topk_kernels().pack_indices, (-(-nbytes // BYTE_BLOCK),), idx, out[vbytes:], k, nbytes,
                      BITS=plan.bits, BLOCK=BYTE_BLOCK)
    return out


def topk_decompress(codec, payload: Tensor, seg: slice) -> Tensor:
    """Inverse of :func:`topk_compress` (and of the torch path's payloads, any slot order): 2 launches."""
    plan, payload = codec.plan(seg), codec.checked(payload, seg)
    table, k, dev = codec.triton_table(seg, payload.device), plan.k, payload.device
    out = torch.empty(plan.n, dtype=torch.float32, device=dev)
    launch_kernel(_topk_kernels().zero_fill, (-(-plan.n // FILL_BLOCK),), out, plan.n, BLOCK=FILL_BLOCK)
    vbytes = k * codec.vdtype.itemsize
    if codec.indices == "int32":
        idx, vals = payload[: 4 * k].view(torch.int32), payload[4 * k:].view(codec.vdtype)
    else:
        idx, vals = payload[vbytes:], payload[:vbytes].view(codec.vdtype)
    launch_kernel(_topk_kernels().topk_scatter, (len(plan.ks),), idx, vals, table, out, len(plan.ks), BITS=plan.bits,
                  PACKED=codec.indices == "packed", BLOCK=SLOT_BLOCK)
    return out


# ---- natural compression ---------------------------------------------------------------------------
NATURAL_BLOCK = 2048        # values a natural program codes (a multiple of 8: whole sign bytes)


def natural_compress(codec, x: Tensor, uniforms: Tensor | None = None) -> Tensor:
    """``codec``'s payload of ``x`` in one launch: n exponent bytes, then the signs packed 8 a byte; the
    draws at fresh Philox offsets each call (``uniforms``: a test's int32, instead)."""
    from gvq.compressors import _triton_natural as k      # imports triton: only once a kernel runs
    n, blocks = x.numel(), -(-x.numel() // NATURAL_BLOCK)
    out = torch.empty(n + -(-n // 8), dtype=torch.uint8, device=x.device)   # fresh: may be in flight
    peaks = torch.empty(blocks, dtype=torch.float32, device=x.device)      # fresh: noted until the check
    offset, codec.triton_offset = codec.triton_offset, codec.triton_offset + n
    launch_kernel(k.natural_encode, (blocks,), x, x if uniforms is None else uniforms, out[:n], out[n:], peaks,
                  n, out.numel() - n, codec.triton_seed, offset, HAS_U=uniforms is not None, BLOCK=NATURAL_BLOCK)
    codec.health.note(peaks)
    return out


def natural_decompress(payload: Tensor, n: int) -> Tensor:
    from gvq.compressors import _triton_natural as k
    out = torch.empty(n, dtype=torch.float32, device=payload.device)
    launch_kernel(k.natural_decode, (-(-n // NATURAL_BLOCK),), payload[:n], payload[n:], out, n, BLOCK=NATURAL_BLOCK)
    return out
