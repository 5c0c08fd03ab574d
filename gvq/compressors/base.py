"""The compressor seam: what a gradient compressor must offer the ring engine.

A compressor turns a contiguous piece (a *segment*) of the flat gradient into a payload, the tensor that
really travels on the wire, and back.  The engine never looks inside a payload; it only needs

* ``additive``: whether payloads of the same segment can be summed in the compressed domain
  (``decompress(compress(a, seg) + compress(b, seg), seg) == a + b`` up to the compressor's own loss, as
  for linear maps such as GradiVeQ or a random projection).  The ring engine picks its hop from it:
  additive => sum payloads and decompress once (Algorithm 1 of GradiVeQ); otherwise
  decompress-add-recompress at every hop (the papers' QSGD-RAR).
* ``cuts(numel)``: the offsets where a segment may start or end (whole buckets, whole slices), so that
  every segment is made of whole compression units;
* ``payload_spec(seg)``: dtype and length of the payload of a segment, so that a receiver can post its
  receive before the sender has compressed anything (fixed-size formats only: no size headers travel).

Positions are passed as a ``slice`` of the flat gradient because some compressors (GradiVeQ) hold
position-dependent state (one PCA basis per conv layer); position-free ones (QSGD) ignore it.
Horovod's ``Compressor`` (``compress -> (tensor, ctx)``) is the model: what does not travel stays local.

**State kept between calls.**  Most codecs are pure functions of (input, segment) once built, apart from
their random stream: the stochastic ones (QSGD, TernGrad, Linear-s, ORQ-s, BinGrad-pb) draw dither from
a generator that every ``compress`` advances, seeded per rank by :meth:`Compressor.reseed` (a payload
depends on how many calls came before it); their ``decompress`` keeps nothing.  Two keep state that
joins calls together, and so depend on the order below:

* GradiVeQ, while tracking its Eq. 7 loss (``track(g)`` ... ``tracked_loss()`` ... ``track(None)``):
  each ``compress`` adds its payload's norm to the loss, so between the two ``track`` calls this rank's
  gradient must be compressed piece by piece exactly once -- what the additive ring does (not the
  re-encode ring, which compresses partial sums).
* PowerSGD's two stages (:mod:`gvq.compressors.powersgd`) share one state: pass P's ``decompress``
  stores the orthogonalized P^ (and raw blocks' sums) that pass Q's ``compress`` and ``decompress``
  read; pass Q's ``compress`` keeps this rank's payloads (its compression error); pass Q's
  ``decompress`` replaces Q for the next iteration (warm start).  So the P ring must have decoded every
  piece before the Q ring starts: two sequential ring calls, each after ``PowerSGD.begin()``.

**What the ring guarantees** (:mod:`gvq.comm.ring`, :mod:`gvq.comm.ring_batched`; on every rank, within
one ring call, segments of the same slice on every rank, so a ``payload_spec`` agrees across ranks):

* additive ring (Algorithm 1, both schedules): every rank compresses each piece of its *own* gradient
  exactly once, and decompresses each piece exactly once, from the summed payload -- bitwise the same
  payload on every rank; a piece is always compressed before it is decompressed, and at N >= 2 every
  compress of the call precedes every decompress (the reduce-scatter ends before the all-gather
  decodes; at N = 1 each piece is compressed and decoded in turn).  Payloads are summed in
  ``add_`` into received buffers only: a payload ``compress`` returned is never written.
* re-encode ring: ``compress`` of the own segment, then per hop ``decompress`` of a partial sum and
  ``compress`` of (partial + own raw segment); the owner decodes the full sum it forwards, and the
  all-gather decodes every other segment once.
* allgather / ps: each rank compresses its whole vector once (``slice(0, numel)``) and decodes all N
  payloads in rank order; ``ps``: rank 0 decodes N, compresses the sum once, every rank decodes it.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gvq.compressors._segments import balanced_segments


class Compressor:
    """Base class; subclasses override ``compress`` / ``decompress`` / ``payload_spec``.  Every
    attribute an aggregator, benchmark or tool reads on a codec is declared here with its default; see
    the module docstring for the codecs that keep state between calls and the call order the ring
    guarantees them."""

    #: payloads can be summed elementwise in the compressed domain (linear compressors)
    additive: bool = False
    #: payloads are random (stochastic rounding): the engine seeds per rank and iteration
    stochastic: bool = False
    #: short name used in logs
    name: str = "identity"
    #: the largest magnitude the wire format carries (fp16: 65504); the runner checks, before a ring
    #: starts, that world_size x max|g| stays below it, so a partial sum cannot overflow mid-ring
    max_abs: float = float("inf")
    #: compression ratio of the format alone on a long vector (bits per value, side information
    #: amortised); NaN where it depends on a fit (GradiVeQ) or a layout (PowerSGD)
    ideal_ratio: float = float("nan")

    def reseed(self, seed: int) -> None:
        """Restart the codec's random stream from ``seed`` (the aggregator passes one per rank at
        setup).  Default: nothing to seed (deterministic codecs)."""

    def cuts(self, numel: int) -> list[int]:
        """Allowed segment boundaries in ``[0, numel]``, sorted, including both ends."""
        return list(range(numel + 1))

    def payload_spec(self, seg: slice) -> tuple[torch.dtype, int]:
        """(dtype, number of elements) of the payload of ``seg``."""
        return torch.float32, seg.stop - seg.start

    def compress(self, x: Tensor, seg: slice) -> Tensor:
        return x.clone()

    def decompress(self, payload: Tensor, seg: slice) -> Tensor:
        return payload.clone()

    # -- helpers the engine uses; rarely overridden ---------------------------------------------
    def empty_payload(self, seg: slice, device) -> Tensor:
        """A receive buffer for ``seg``'s payload, on ``device`` (the gradient's: never the host by
        default, or a CUDA ring would receive into host memory)."""
        dtype, n = self.payload_spec(seg)
        return torch.empty(n, dtype=dtype, device=device)

    def payload_nbytes(self, seg: slice) -> int:
        dtype, n = self.payload_spec(seg)
        return n * dtype.itemsize

    def state_dict(self) -> dict:
        """What a checkpoint keeps (tensors, numbers, strings only: loaded without unpickling objects);
        stateless codecs keep nothing."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def ratio(self, numel: int) -> float:
        """Achieved compression ratio on a whole vector of ``numel`` fp32 values (bytes in / bytes out)."""
        whole = slice(0, numel)
        return 4.0 * numel / max(1, self.payload_nbytes(whole))


def split_on_cuts(cuts: list[int], n: int) -> list[slice]:
    """Split ``[0, cuts[-1]]`` into ``n`` contiguous segments whose ends lie on ``cuts``, as equal in
    size as the cuts allow.  Segments may be empty (fewer units than ranks)."""
    return balanced_segments(cuts, n)


def check_int(key: str, value, lo: int, hi: int | None = None, hint: str = "") -> int:
    """The one integer-argument check of the package (codecs and aggregators): returns ``value`` or
    raises ``ValueError`` in one line naming the key as the user writes it (``L_t``,
    ``aggregator.pieces``, ``bits``) and what is allowed."""
    ok = isinstance(value, int) and not isinstance(value, bool) and lo <= value and (hi is None or value <= hi)
    if not ok:
        allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{key}={value!r}: must be an integer {allowed}{hint}")
    return value
