"""The one bucketing + packing layer under every scalar quantizer (QSGD, TernGrad, SignSGD, Linear, ORQ,
BinGrad-pb/-b): a quantizer only maps a batch of buckets to integer codes + a few floats per bucket
(``_encode``) and back (``_decode``); splitting, checks, clipping, dither and the wire format live here.

See docs/design.md#gvqcompressors_bucketingpy for how it works and why.
"""
from __future__ import annotations

import math
import sys

import torch
from torch import Tensor

from gvq.compressors import _batch, _triton
from gvq.compressors import _kernels as kernels_
from gvq.compressors._dither import DitherLanes, Dithering, draws_as_bytes, draws_from_bytes
from gvq.compressors._packing import Layout, pack, split_rows, unpack, word_format
from gvq.compressors.base import Compressor, Health, check_bucket, check_clip, untimed
from gvq.compressors._kernels import HOST, TRITON, Op

if sys.byteorder != "little":  # the wire format is little-endian; we read it through tensor views
    raise ImportError("gvq.compressors._bucketing assumes a little-endian host")


def has_data(x: Tensor) -> bool:
    """False on ``meta`` tensors (shapes only): checks that read values are skipped there."""
    return x.device.type != "meta"


def check_finite(x: Tensor, who: str) -> None:
    """NaN/Inf raise.  One cheap reduction: the sum is NaN/Inf iff some value is (or it overflows)."""
    if x.numel() and has_data(x) and not math.isfinite(float(x.sum(dtype=torch.float32))):
        nan, inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
        raise ValueError(f"{who}: input gradient has {nan} NaN and {inf} Inf values "
                         f"(or sums past float32 range); refusing to quantize garbage")


def max_abs_rows(rows: Tensor) -> Tensor:
    """max|v| of each row, (m, 1), exactly, as max(max, -min): two vectorised reductions, several times
    faster than ``abs().amax()`` or the inf-norm; NaN/Inf propagate."""
    return torch.maximum(rows.amax(dim=1, keepdim=True), rows.amin(dim=1, keepdim=True).neg_())


def clip_rows(rows: Tensor, c: float, inv_count: Tensor | None = None, weights: Tensor | None = None) -> Tensor:
    """TernGrad clipping, per bucket: clamp to +-c * RMS(bucket).  Returns a new tensor.  ``inv_count``
    (m, 1): 1 / values per row where rows are padded (zeros add nothing to the squares; ``weights``, 0 on
    padding that repeats a value, take it out)."""
    if inv_count is None:
        lim = c * rows.pow(2).mean(dim=1, keepdim=True).sqrt_()
    else:
        real = rows if weights is None else rows * weights
        lim = torch.linalg.vector_norm(real, dim=1, keepdim=True).mul_(inv_count.sqrt() * c)
    return torch.clamp(rows, -lim, lim)


# ---- shared quantizer plumbing ---------------------------------------------------------------
class BucketQuantizer(Dithering, Compressor):
    """Base of every scalar quantizer.  Subclasses set ``name``, ``stochastic``, ``levels`` (s, the code
    alphabet), ``n_side``, ``dense`` and implement ``_encode(rows) -> (codes, side)`` and
    ``_decode(codes, side, out)`` on a 2-D batch of buckets (one row per bucket)."""

    additive = False           # decode-add-encode in a ring: codes of different ranks do not add up
    levels: int = 2
    n_side: int = 1
    dense: bool = True
    dither_base: float = 0.0   # constant every dithered y is shifted by
    #: True where a NaN/Inf input always makes the side info NaN/Inf (norms, means, maxima): the input
    #: check then runs only when the side info is bad (saves a pass over the data)
    side_flags_nonfinite: bool = False
    #: off the fused host path every bucket, the ragged last one included, is one padded (m, bucket)
    #: batch (``encode_padded``): a fixed few whole-tensor ops a call.  Zero padding where the encoder's
    #: statistics ignore it (norms, maxima; means through ``inv_count``); ``pad_repeat``: a real value
    #: repeated, weighted 0 (the fitted quantizers: zeros would move their bounds and histograms)
    pads: bool = False
    pad_repeat: bool = False

    def __init__(self, bucket: int | None = 2048, clip: float | None = None, kernels: str = "auto"):
        self.bucket = check_bucket(bucket)
        self.clip = check_clip(clip)
        self.kernels, self._paths = kernels_.check_kernels(kernels), {}
        self.health = Health("sum")    # side info (or inputs) since the last check: NaN/Inf stay so
        self.reseed(0)

    def check_health(self) -> None:
        bad = self.health.read()
        if bad is not None and not math.isfinite(bad):
            raise ValueError(f"{self.name}: input gradient has NaN or Inf values, or bucket statistics "
                             "overflow float32 (|values| too large); refusing to quantize garbage")

    def __getstate__(self):       # scratch buffers are not state (the dither lanes are: checkpoints resume bitwise)
        return {**self.__dict__, "_ws": {}, "_dgen": None, "_paths": {}, **draws_as_bytes(self.gen, self.lanes)}

    def __setstate__(self, state):
        self.__dict__.update(state, **draws_from_bytes(state))

    def state_dict(self) -> dict:
        """The dither generators and lanes (a bitwise resume draws the same uniforms next)."""
        device = {} if self._dgen is None else {"device_gen": self._dgen.get_state()}
        return {"gen": self.gen.get_state(), **self.lanes.state_dict(), **device,
                "triton_seed": self.triton_seed, "triton_offset": self.triton_offset}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["gen"])
        self.triton_seed = state.get("triton_seed", self.triton_seed)
        self.triton_offset = state.get("triton_offset", self.triton_offset)
        self._dgen, self._dgen_state = None, state.get("device_gen")
        self._ws = {}
        self.lanes = DitherLanes()
        if "lanes" in state:
            self.lanes.load_state_dict(state)

    def scratch(self, tag: str, shape, dtype: torch.dtype, device) -> Tensor:
        """A reused work buffer on ``device`` (the data's): fresh multi-MB tensors cost page faults, more
        than QSGD's kernel itself."""
        device = torch.device(device)
        key = (tag, tuple(shape), dtype, device)
        if key not in self._ws:
            self._ws[key] = torch.empty(shape, dtype=dtype, device=device)
        return self._ws[key]

    def scratch_like(self, tag: str, t: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """A reused work buffer of ``t``'s shape, on its device (``dtype``: its own unless given)."""
        return self.scratch(tag, t.shape, t.dtype if dtype is None else dtype, t.device)

    def reseed(self, seed: int) -> None:
        """Seed the dither (the engine calls this per rank); deterministic methods ignore it."""
        self.gen = torch.Generator().manual_seed(int(seed))
        self._dgen = self._dgen_state = None          # a device's generator is seeded from gen anew
        self._ws = {}                                 # and new lanes: same seed, same draws
        self.lanes = DitherLanes()
        # the Triton path's Philox key and the count of values drawn: each call draws at fresh offsets
        self.triton_seed, self.triton_offset = (int(seed) * 0x9E3779B97F4A7C15 + 1) % (1 << 63), 0

    @property
    def ideal_ratio(self) -> float:
        """32 / log2(s): fp32 bits over the information content of one code (side floats ignored)."""
        return 32.0 / math.log2(self.levels)

    def layout(self, numel: int) -> Layout:
        return Layout(numel, self.bucket, self.n_side, *word_format(self.levels, self.dense))

    def cuts(self, numel: int) -> list[int]:
        if self.bucket == 0:
            return list(range(numel + 1))
        return list(range(0, numel, self.bucket)) + [numel]

    def payload_spec(self, seg: slice) -> tuple[torch.dtype, int]:
        return torch.uint8, self.layout(seg.stop - seg.start).nbytes

    def compress(self, x: Tensor, seg: slice) -> Tensor:
        x = (x if x.dim() == 1 else x.reshape(-1)).to(torch.float32)
        lay = self.layout(x.numel())
        return COMPRESS(self.path(x.device) if lay.numel else HOST, self, x, lay)

    def compress_rows(self, x: Tensor, lay: Layout) -> Tensor:
        """The bucket-by-bucket payload (``_encode`` on each run of whole buckets, then packed): the host
        path's, and the torch path's for quantizers that do not pad."""
        if not self.side_flags_nonfinite:
            self.health.note(x.sum(dtype=torch.float32))   # not x: the ring may write it before the check
        out = torch.empty(lay.nbytes, dtype=torch.uint8, device=x.device)   # fresh: may still be in flight
        parts = [self._encode(clip_rows(rows, self.clip) if self.clip else rows)
                 for rows in split_rows(x, self.bucket)]
        if not parts:
            return out
        side = torch.cat([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
        if self.side_flags_nonfinite:
            self.health.note(side)
        out[: lay.side_bytes].view(torch.float32).copy_(side.reshape(-1))
        stream = self._code_stream(parts, lay)
        work = self.scratch("pack", stream.shape, torch.float64, x.device) if lay.per_word > 8 else None
        pack(stream, lay, out[lay.side_bytes:], work, host=self.path(x.device) == HOST)
        return out

    def path(self, device: torch.device) -> str:
        """The path calls on ``device`` take (``_kernels.choose_path``): chosen on the first call there, never
        again (``compressor.kernels``; quantizers without Triton kernels, ``triton_spec`` None or a
        layout they do not fit, keep the host's or torch's)."""
        got = self._paths.get(device)           # asked every call: the cache first, the spec only once
        return got or kernels_.path_for(self._paths, self.kernels, device, triton=_triton.supports(self))

    def triton_spec(self) -> _triton.TritonSpec | None:
        """What the Triton kernels compute for this quantizer; None: it has none (the torch path)."""
        return None

    def triton_compress(self, x: Tensor, lay: Layout, uniforms: Tensor | None = None) -> Tensor:
        """The Triton path's payload; ``uniforms`` (numel,) in [0, 1): a test's, the draws' offset then
        advancing all the same."""
        offset, self.triton_offset = self.triton_offset, self.triton_offset + lay.numel
        return _triton.quant_compress(self, x.contiguous(), lay, self.triton_seed, offset, uniforms)

    def _code_stream(self, parts, lay: Layout) -> Tensor:
        """All codes in value order, zero-padded to whole words (one copy, none if already so)."""
        total = lay.n_words * lay.per_word
        if len(parts) == 1 and total == lay.numel:
            return parts[0][0].reshape(-1)
        flat = self.scratch("stream", (total,), parts[0][0].dtype, parts[0][0].device)
        at = 0
        for codes, _ in parts:
            flat[at: at + codes.numel()] = codes.reshape(-1)
            at += codes.numel()
        flat[at:] = 0
        return flat

    def checked_payload(self, payload: Tensor, lay: Layout) -> Tensor:
        """``payload`` if it is ``lay``'s (else ValueError), copied where its side floats are unaligned."""
        if payload.numel() != lay.nbytes or payload.dtype != torch.uint8:
            raise ValueError(f"{self.name}: payload of {payload.numel()} {payload.dtype} for a segment "
                             f"of {lay.numel} values; expected {lay.nbytes} uint8")
        return payload.clone() if payload.storage_offset() % 4 else payload   # float32 views: 4-byte aligned

    def reencode_sum(self, payload: Tensor, local: Tensor, seg: slice, stopwatch=untimed) -> Tensor:
        """The ring hop fused on the Triton path (``_triton.quant_reencode_sum``, two launches, timed as
        ``compress``) for the quantizers that scale by a statistic; otherwise the base's three calls."""
        lay = self.layout(seg.stop - seg.start)
        if not (lay.numel and self.path(payload.device) == TRITON and _triton.fuses_hop(self)):
            return super().reencode_sum(payload, local, seg, stopwatch)
        with stopwatch("compress"):
            return self.triton_reencode_sum(self.checked_payload(payload, lay), local, lay)

    def triton_reencode_sum(self, payload: Tensor, local: Tensor, lay: Layout, uniforms: Tensor | None = None):
        """The Triton path's fused hop; draws (and a test's ``uniforms``) as :meth:`triton_compress`'s."""
        offset, self.triton_offset = self.triton_offset, self.triton_offset + lay.numel
        local = local.reshape(-1).to(torch.float32).contiguous()
        return _triton.quant_reencode_sum(self, payload, local, lay, self.triton_seed, offset, uniforms)

    def decompress(self, payload: Tensor, seg: slice) -> Tensor:
        lay = self.layout(seg.stop - seg.start)
        payload = self.checked_payload(payload, lay)
        return DECOMPRESS(self.path(payload.device) if lay.numel else HOST, self, payload, lay)

    def decompress_rows(self, payload: Tensor, lay: Layout) -> Tensor:
        """Inverse of :meth:`compress_rows`: ``_decode`` on each run of whole buckets."""
        out = torch.empty(lay.numel, dtype=torch.float32, device=payload.device)
        side = payload[: lay.side_bytes].view(torch.float32).view(-1, self.n_side)
        codes = unpack(payload[lay.side_bytes:], lay)
        first = 0
        for rows in split_rows(out, self.bucket):
            m, n = rows.shape
            at = rows.storage_offset()                    # rows are views of ``out``
            self._decode(codes[at: at + m * n].view(m, n), side[first: first + m], rows)
            first += m
        return out

    # -- the device path's hooks (gvq.compressors._batch) ----------------------------------------------
    def encode_padded(self, rows: Tensor, inv_count: Tensor, weights: Tensor | None = None):
        """``_encode`` on padded rows; ``inv_count`` (m, 1): 1 / real values per row; ``weights`` (m,
        width): 0 on padding (``pad_repeat`` only; None where no row is padded).  A quantizer whose
        statistics count values (a mean) overrides it."""
        return self._encode(rows)

    def decode_batch(self, codes: Tensor, side: Tensor) -> Tensor:
        """``_decode`` into a fresh (m, width) tensor; quantizers with a one-op formula override it."""
        out = torch.empty(codes.shape, dtype=torch.float32, device=codes.device)
        self._decode(codes, side, out)
        return out

    def round_to_levels(self, rows: Tensor, levels: Tensor) -> Tensor:
        """Eq. (7): random rounding of each value to one of its two neighbouring levels, unbiased.
        ``levels`` (m, s) nondecreasing per row and spanning each row's [min, max]."""
        k = interval_index(rows, levels)
        width = levels[:, 1:] - levels[:, :-1]
        inv = torch.where(width > 0, 1.0 / width, 0.0)          # empty interval: t = 0, its level
        y = torch.sub(rows, levels.gather(1, k), out=self.scratch_like("y", rows))
        return self.dither_floor_(y.mul_(inv.gather(1, k)).add_(k))   # y = k + (v - b_k) / width


# every scalar quantizer's calls, per path (``_kernels.Op``): the torch reference a padded batch where the
# quantizer pads (``_batch``: a fixed few ops a call), bucket by bucket otherwise; the host the same
# bucket-by-bucket code, its numba kernels inside (packing, dither, the fits); Triton's fused kernels
COMPRESS = Op(torch=lambda q, x, lay: (_batch.compress_batch(q, x, lay, clip_rows) if q.pads
                                       else q.compress_rows(x, lay)),
              triton=lambda q, x, lay: q.triton_compress(x, lay),
              host=BucketQuantizer.compress_rows)
DECOMPRESS = Op(torch=lambda q, p, lay: _batch.decompress_batch(q, p, lay) if q.pads else q.decompress_rows(p, lay),
                triton=lambda q, p, lay: _triton.quant_decompress(q, p, lay),
                host=BucketQuantizer.decompress_rows)


def prefix_sums(srt: Tensor) -> Tensor:
    """(m, n+1) float64 prefix sums of each row, a leading 0: sums over index ranges without round-off
    trouble (a float32 cumsum of 2048 values may lose 3-4 of its 7 digits)."""
    csum = torch.zeros(srt.shape[0], srt.shape[1] + 1, dtype=torch.float64, device=srt.device)
    torch.cumsum(srt, dim=1, dtype=torch.float64, out=csum[:, 1:])
    return csum


def interval_index(rows: Tensor, levels: Tensor) -> Tensor:
    """Index k in [0, s-2] of the level interval [b_k, b_k+1] holding each value (the last one
    whose lower level is <= v).  s-2 comparisons for few levels, binary search for many."""
    s = levels.shape[1]
    if s <= 17:
        k = torch.zeros(rows.shape, dtype=torch.uint8, device=rows.device)
        for j in range(1, s - 1):
            k.add_(rows >= levels[:, j: j + 1])
        return k.long()
    k = torch.searchsorted(levels.contiguous(), rows.contiguous(), right=True) - 1
    return k.clamp_(0, s - 2)
