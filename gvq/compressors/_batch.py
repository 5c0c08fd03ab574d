"""The scalar quantizers' device path: every bucket of a segment, the ragged last one included, as ONE
padded (m, bucket) batch, so a call is a fixed few whole-tensor ops with no host read, whatever the number
of buckets (``BucketQuantizer.compress`` takes it off the fused host path for quantizers that declare
``pads``: zeros where the statistics ignore them, a repeated real value with per-value weights for the
fitted quantizers, whose bounds and histograms must not see zeros).  The wire format is the split path's
(``_packing.Layout``).

See docs/design.md#gvqcompressors_bucketingpy for how it works and why.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

from gvq.compressors._packing import Layout, pack_rows, unpack_digits


def batch_shape(lay: Layout) -> tuple[int, int]:
    """(m, width) of the zero-padded batch: m buckets of ``bucket`` values, or one row of all."""
    if lay.bucket == 0 or lay.bucket >= lay.numel:
        return 1, lay.numel
    return lay.n_buckets, lay.bucket


@functools.lru_cache(maxsize=256)
def inv_count(numel: int, bucket: int, device: torch.device) -> Tensor:
    """(m, 1): 1 / real values per row of the padded batch (only the last row is short), made once."""
    lay = Layout(numel, bucket, 1, 2, 1, 1)
    m, width = batch_shape(lay)
    counts = torch.full((m, 1), float(width), device=device)
    counts[-1] = numel - (m - 1) * width
    return counts.reciprocal_()


@functools.lru_cache(maxsize=256)
def repeat_index(numel: int, bucket: int, device: torch.device) -> Tensor:
    """(m * width,) gather index of the padded batch where the padding repeats the last row's first
    value (a bucket's min and max stay its own), made once."""
    m, width = batch_shape(Layout(numel, bucket, 1, 2, 1, 1))
    idx = torch.arange(m * width, device=device)
    idx[numel:] = (m - 1) * width
    return idx


@functools.lru_cache(maxsize=256)
def pad_weights(numel: int, bucket: int, device: torch.device) -> Tensor:
    """(m, width) float32: 1 for a real value of the padded batch, 0 for padding, made once."""
    m, width = batch_shape(Layout(numel, bucket, 1, 2, 1, 1))
    w = torch.ones(m * width, device=device)
    w[numel:] = 0
    return w.view(m, width)


def compress_batch(q, x: Tensor, lay: Layout, clip_rows) -> Tensor:
    """Quantizer ``q``'s payload of ``x``: pad (zeros, or ``q.pad_repeat``: a real value, each value then
    weighted 1 / padding 0), clip (``clip_rows``), encode, note the side info for the iteration's check,
    pack, one ``cat`` with the side bytes."""
    m, width = batch_shape(lay)
    pad, weights = m * width - lay.numel, None
    if not pad:
        rows = x.view(m, width)
    elif q.pad_repeat:
        rows = x[repeat_index(lay.numel, lay.bucket, x.device)].view(m, width)
        weights = pad_weights(lay.numel, lay.bucket, x.device)
    else:
        rows = torch.nn.functional.pad(x, (0, pad)).view(m, width)
    counts = inv_count(lay.numel, lay.bucket, x.device)
    if q.clip:
        rows = clip_rows(rows, q.clip, counts, weights)
    codes, side = q.encode_padded(rows, counts, weights)
    q.health.note(side)
    return torch.cat([side.view(-1).view(torch.uint8), pack_rows(codes, lay)])


def decompress_batch(q, payload: Tensor, lay: Layout) -> Tensor:
    """Inverse of :func:`compress_batch`: the padding decoded and dropped."""
    m, width = batch_shape(lay)
    side = payload[: lay.side_bytes].view(torch.float32).view(m, q.n_side)
    codes = unpack_digits(payload[lay.side_bytes:], lay, m * width).view(m, width)
    out = q.decode_batch(codes, side).view(-1)
    return out[: lay.numel] if out.numel() > lay.numel else out
