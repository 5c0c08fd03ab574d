"""GRACE's codecs' ``triton`` path (:mod:`._kernels`): top-k's kernels (:mod:`._triton_topk`; chunked top-k's,
:mod:`._triton_chunk`), natural compression's (:mod:`._triton_natural`), the sign codecs'
(:mod:`._triton_signs`: EF-SignSGD, 1-bit SGD, Signum's vote) and random-k's (:mod:`._triton_randomk`) set
up and launched here, through ``_kernels.launch_kernel`` (which counts them); no host reads, and a program
per scope, group or block whatever the depth.  Top-k: compress is 1 launch (int32 indices) or 2 (packed:
the select writes int32 indices to a scratch buffer, then a pack), decompress 2 (zero-fill, scatter); its
scope table is a constant of the plan, made once per segment and device.  Chunked top-k: 3 to compress
(the select, each chunk's sigma and cells, both packs), 2 to decompress.  Natural and Signum: one launch
each way.  EF-SignSGD and 1-bit SGD: 2 to compress (the groups' fit, the sign bits), 1 to decompress.
Random-k: its positions one launch per (draw, segment), in whichever call first needs them, then 1 to
compress (gather), 2 to decompress (zero-fill, scatter).  Triton is optional: nothing here imports it
until a kernel runs."""
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


def _chunk_kernels():
    from gvq.compressors import _triton_chunk     # imports triton: only once a kernel runs
    return _triton_chunk


def scope_table(plan, device) -> Tensor:
    """(4, S) int64: each scope's start, length, k and first slot (the plan's constants, on ``device``)."""
    lengths = [b - a for a, b in zip(plan.starts, plan.starts[1:] + [plan.n])]
    return slot_table(plan.starts, lengths, plan.ks, device)


def slot_table(starts: list[int], lengths: list[int], ks: list[int], device) -> Tensor:
    """(4, S) int64: each scope's start, length, k and first slot (its k slots follow the earlier scopes')."""
    firsts = [sum(ks[:i]) for i in range(len(ks))]
    return torch.tensor([starts, lengths, ks, firsts], dtype=torch.int64, device=device).reshape(4, len(ks))


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


# ---- the sign codecs: EF-SignSGD, 1-bit SGD (``_signs.GroupedSign``), Signum's vote ----------------------
SIGN_BLOCK = 2048           # values a fit program loads at once, and a decode program writes
SIGN_BYTES = 512            # packed sign bytes a pack program writes


def _signs_kernels():
    from gvq.compressors import _triton_signs     # imports triton: only once a kernel runs
    return _triton_signs


def group_table(sizes: list[int], device) -> tuple[Tensor, Tensor]:
    """The grouped codecs' constants of a segment: (2, G) int64 each group's start and length, and each
    value's group (int32)."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    groups = torch.tensor([starts, sizes], dtype=torch.int64, device=device).reshape(2, len(sizes))
    gid = torch.repeat_interleave(torch.arange(len(sizes), dtype=torch.int32), torch.tensor(sizes, dtype=torch.int64))
    return groups, gid.to(device)


def _pack_signs(x: Tensor, out: Tensor) -> None:
    launch_kernel(_signs_kernels().pack_sign_bits, (-(-out.numel() // SIGN_BYTES),), x, out, x.numel(), out.numel(),
                  BLOCK=SIGN_BYTES)


def grouped_compress(codec, x: Tensor, seg: slice) -> Tensor:
    """``GroupedSign.compress``'s payload in 2 launches: each group's side floats, then the bits."""
    groups, _ = codec.triton_table(seg, x.device)
    head = 4 * codec.n_side * groups.shape[1]
    out = torch.empty(codec.payload_spec(seg)[1], dtype=torch.uint8, device=x.device)   # fresh: may be in flight
    launch_kernel(_signs_kernels().group_fit, (groups.shape[1],), x, groups, out[:head].view(torch.float32),
                  groups.shape[1], TWO=codec.n_side == 2, BLOCK=SIGN_BLOCK)
    _pack_signs(x, out[head:])
    return out


def grouped_decompress(codec, payload: Tensor, seg: slice) -> Tensor:
    """Inverse of :func:`grouped_compress` (either path's payload), 1 launch."""
    groups, gid = codec.triton_table(seg, payload.device)
    n, head = seg.stop - seg.start, 4 * codec.n_side * groups.shape[1]
    payload = payload.clone() if payload.storage_offset() % 4 else payload      # its floats 4-byte aligned
    out = torch.empty(n, dtype=torch.float32, device=payload.device)
    k = _signs_kernels()
    launch_kernel(k.sign_decode, (-(-n // SIGN_BLOCK),), payload[head:], payload[:head].view(torch.float32), gid,
                  out, n, MODE=k.TWO_MEANS if codec.n_side == 2 else k.SCALE, BLOCK=SIGN_BLOCK)
    return out


def vote_compress(codec, x: Tensor, seg: slice) -> Tensor:
    """Signum's vote of ``x``, 1 launch: int8 +-1, or the bits packed."""
    dtype, size = codec.payload_spec(seg)
    out = torch.empty(size, dtype=dtype, device=x.device)             # fresh: may still be in flight
    if codec.vote == "bits":
        _pack_signs(x, out)
    else:
        launch_kernel(_signs_kernels().int8_vote, (-(-size // SIGN_BLOCK),), x, out, size, BLOCK=SIGN_BLOCK)
    return out


def vote_decompress(codec, payload: Tensor, seg: slice) -> Tensor:
    """A vote payload (or an int8 sum of them) as float32, 1 launch."""
    n, k = seg.stop - seg.start, _signs_kernels()
    out = torch.empty(n, dtype=torch.float32, device=payload.device)
    if codec.vote == "bits":
        launch_kernel(k.sign_decode, (-(-n // SIGN_BLOCK),), payload, out, out, out, n, MODE=k.VOTE, BLOCK=SIGN_BLOCK)
    else:
        launch_kernel(k.int8_decode, (-(-n // SIGN_BLOCK),), payload, out, n, BLOCK=SIGN_BLOCK)
    return out


# ---- random-k ----------------------------------------------------------------------------------------
RANDOMK_BLOCK = 1024        # values a random-k program hashes, gathers or scatters at once


def _randomk_kernels():
    from gvq.compressors import _triton_randomk   # imports triton: only once a kernel runs
    return _triton_randomk


def randomk_positions(codec, seg: slice, device) -> Tensor:
    """The k smallest hashes' positions of each bucket of ``seg`` for the present key (in the segment,
    int64, bucket by bucket in index order: the torch path's), 1 launch."""
    table, _ = codec.triton_table(seg, device)
    out = torch.empty(codec.payload_spec(seg)[1], dtype=torch.int64, device=device)
    launch_kernel(_randomk_kernels().randomk_select, (table.shape[1],), table, out, seg.start, codec.key,
                  table.shape[1], BLOCK=RANDOMK_BLOCK)
    return out


def randomk_compress(codec, x: Tensor, seg: slice) -> Tensor:
    """Each bucket's k values at the shared positions (scaled by its n/k where ``scale``), 1 launch (and
    the positions' own, where this key's are not yet drawn); each bucket's sum noted for the check."""
    pos = codec.positions(seg, x.device)
    table, scales = codec.triton_table(seg, x.device)
    out = torch.empty(pos.numel(), dtype=torch.float32, device=x.device)       # fresh: may be in flight
    sums = torch.empty(table.shape[1], dtype=torch.float32, device=x.device)   # fresh: noted until the check
    launch_kernel(_randomk_kernels().randomk_gather, (table.shape[1],), x, pos, table, scales, out, sums,
                  table.shape[1], SCALE=codec.scale, BLOCK=RANDOMK_BLOCK)
    codec.health.note(sums)
    return out


def randomk_decompress(codec, payload: Tensor, seg: slice) -> Tensor:
    """The values at their positions, zeros elsewhere: 2 launches (zero-fill, scatter)."""
    n, pos = seg.stop - seg.start, codec.positions(seg, payload.device)
    out = torch.empty(n, dtype=torch.float32, device=payload.device)
    launch_kernel(_topk_kernels().zero_fill, (-(-n // FILL_BLOCK),), out, n, BLOCK=FILL_BLOCK)
    launch_kernel(_randomk_kernels().randomk_scatter, (-(-pos.numel() // RANDOMK_BLOCK),), payload, pos, out,
                  pos.numel(), BLOCK=RANDOMK_BLOCK)
    return out


# ---- SparseLoCo's chunked top-k ------------------------------------------------------------------------
def chunk_compress(codec, x: Tensor, seg: slice) -> Tensor:
    """``ChunkTopK.compress``'s layout in 3 launches: the select (offsets and values to scratch, in index
    order), each chunk's sigma and cells, then both code arrays packed."""
    plan, table, dev = codec.plan(seg), codec.triton_table(seg, x.device), x.device
    side, vbytes, ibytes = codec.layout_bytes(plan)
    out = torch.empty(side + vbytes + ibytes, dtype=torch.uint8, device=dev)   # fresh: may be in flight
    idx = torch.empty(plan.k, dtype=torch.int32, device=dev)
    vals = torch.empty(plan.k, dtype=torch.float32, device=dev)
    codes = torch.empty(plan.k, dtype=torch.int32, device=dev)
    k, scopes, cells = _chunk_kernels(), len(plan.ks), 1 << codec.bits
    launch_kernel(_topk_kernels().topk_select, (scopes,), x, table, idx, vals, scopes, BLOCK=_program_block(plan))
    launch_kernel(k.chunk_codes, (scopes,), vals, table, out[:side].view(torch.float32), codes, scopes, codec.clip,
                  cells / (2 * codec.clip), CELLS=cells, BLOCK=triton_pow2(max(plan.ks)))
    launch_kernel(k.pack_two, (-(-max(vbytes, ibytes) // BYTE_BLOCK),), codes, idx, out[side: side + vbytes],
                  out[side + vbytes:], plan.k, vbytes, ibytes, BITS_A=codec.bits, BITS_B=plan.bits, BLOCK=BYTE_BLOCK)
    return out


def chunk_decompress(codec, payload: Tensor, seg: slice) -> Tensor:
    """Inverse of :func:`chunk_compress` (and of the torch path's payloads, any slot order): 2 launches."""
    plan, payload = codec.plan(seg), codec.checked(payload, seg)
    table, dev = codec.triton_table(seg, payload.device), payload.device
    side, vbytes, _ = codec.layout_bytes(plan)
    out = torch.empty(plan.n, dtype=torch.float32, device=dev)
    launch_kernel(_topk_kernels().zero_fill, (-(-plan.n // FILL_BLOCK),), out, plan.n, BLOCK=FILL_BLOCK)
    launch_kernel(_chunk_kernels().chunk_scatter, (len(plan.ks),), payload[:side].view(torch.float32),
                  payload[side: side + vbytes], payload[side + vbytes:], codec.levels(seg, dev), table, out,
                  len(plan.ks), BITS=codec.bits, IDX_BITS=plan.bits, BLOCK=SLOT_BLOCK)
    return out
