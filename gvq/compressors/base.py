"""The compressor seam: what a gradient compressor must offer the ring engine.

See docs/design.md#gvqcompressorsbasepy for how it works and why.
"""
from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor

from gvq.compressors._segments import balanced_segments


def untimed(label: str):
    """A stopwatch that times nothing (``Compressor.reencode_sum`` outside a ring)."""
    return contextlib.nullcontext()


class Health:
    """A watch over what a codec was given, read once per iteration (``Compressor.check_health``) instead
    of inside every call: a host read inside a call would make the host wait for the device on every
    bucket.  ``mode="sum"``: the sum of what :meth:`note` was shown (NaN/Inf, or a sum past float32,
    make it non-finite); ``mode="max"``: the largest |value| shown."""

    def __init__(self, mode: str = "sum"):
        self.mode, self.seen = mode, []

    def __getstate__(self):          # what was seen is per process (never shared through spawn)
        return {**self.__dict__, "seen": []}

    def note(self, t: Tensor) -> None:
        """Keep ``t`` (a fresh tensor its codec will not write again: side info, a reduction) for the next
        :meth:`read`: no op on the device, no host read.  Folded into one tensor every ``FOLD`` notes, so
        a caller that never reads keeps a bounded list."""
        self.seen.append(t)
        if len(self.seen) >= self.FOLD:
            self.seen = [self._fold()]

    FOLD = 256

    def _fold(self) -> Tensor:
        both = torch.cat([t.reshape(-1).to(torch.float32) for t in self.seen])
        return (both.sum() if self.mode == "sum" else torch.linalg.vector_norm(both, ord=float("inf"))).reshape(1)

    def read(self) -> float | None:
        """The sum (or max |value|) of everything noted since the last read, None where nothing was (or
        shapes only, on meta); then start again.  The one host read, once per iteration."""
        if not self.seen or self.seen[0].device.type == "meta":
            self.seen = []
            return None
        value, self.seen = self._fold(), []
        return float(value)


class Compressor:
    """Base class; subclasses override ``compress`` / ``decompress`` / ``payload_spec``.  Every
    attribute an aggregator, benchmark or tool reads on a codec is declared here with its default; see
    docs/design.md#gvqcompressorsbasepy for the codecs that keep state between calls and the call order the ring
    guarantees them."""

    #: payloads can be summed elementwise in the compressed domain (linear compressors)
    additive: bool = False
    #: payloads are random (stochastic rounding): the engine seeds per rank and iteration
    stochastic: bool = False
    #: payloads are a set of (position, value) pairs, read by :meth:`entries`: the sparse ring
    #: (``aggregator.topology=sparse_ring``, :mod:`gvq.comm.ring_sparse`) sums them as unions of supports
    sparse: bool = False
    #: short name used in logs
    name: str = "identity"
    #: the largest magnitude the wire format carries (fp16: 65504); the runner checks, before a ring
    #: starts, that world_size x max|g| stays below it, so a partial sum cannot overflow mid-ring
    max_abs: float = float("inf")
    #: compression ratio of the format alone on a long vector (bits per value, side information
    #: amortised); NaN where it depends on a fit (GradiVeQ) or a layout (PowerSGD)
    ideal_ratio: float = float("nan")

    def check_health(self) -> None:
        """Raise ``ValueError`` (one line) if a call since the last check was given values it cannot
        carry (NaN/Inf, statistics past float32, fp16's range).  Aggregators call it once per iteration,
        after the ring; codec calls never read a device value back.  Default: nothing watched."""

    def reseed(self, seed: int) -> None:
        """Restart the codec's random stream from ``seed`` (the aggregator passes one per rank at
        setup).  Default: nothing to seed (deterministic codecs)."""

    def begin_vector(self, seed: int, iteration: int, vector: int) -> None:
        """The calls that follow code one vector, named alike on every rank: the run's ``seed``, the
        ``iteration`` and the ``vector`` (its first parameter's position: a DDP bucket; 0 post-backward).
        The aggregator says it before each vector's first call.  Randomness every rank must share
        (random-k's indices) is keyed by these, never by how many calls came before.  Default: nothing."""

    def grouped(self, shapes: list[tuple[int, ...]]) -> "Compressor":
        """The codec for a vector made of tensors of ``shapes``, in order (each parameter's block of
        the flat gradient): codecs whose side information or scope is per tensor (EF-SignSGD, 1-bit SGD,
        top-k's per-tensor scope) return a copy that knows its groups; the aggregator asks once per vector
        layout.  Default: itself (a codec that never looks at tensor boundaries)."""
        return self

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

    def reencode_sum(self, payload: Tensor, local: Tensor, seg: slice, stopwatch=untimed) -> Tensor:
        """The re-encode ring's hop: the payload of ``payload`` decoded plus ``local`` (``seg``'s raw
        values), each phase timed under its label by ``stopwatch`` (the ring's).  Default:
        decompress, add, compress; a codec whose kernels fuse the three overrides it (the scalar quantizers
        and fp16 on the Triton path, timed as ``compress``)."""
        with stopwatch("decompress"):
            partial = self.decompress(payload, seg)
        with stopwatch("add"):
            partial += local
        with stopwatch("compress"):
            return self.compress(partial, seg)

    def entries(self, payload: Tensor, seg: slice) -> tuple[Tensor, Tensor]:
        """(positions relative to ``seg``, int64, each once; their decoded values, float32) of a
        :attr:`sparse` codec's payload.  Default: refused, the codec is not sparse."""
        raise ValueError(f"{self.name}: not a sparse codec (Compressor.sparse): its payload has no entries")

    def kept(self, seg: slice) -> int:
        """How many entries a :attr:`sparse` codec's payload of ``seg`` carries (what the cost model prices
        the sparse ring by).  Default: 0, the codec is not sparse."""
        return 0

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


def check_bucket(bucket) -> int:
    """Returns the bucket size, 0 standing for "one bucket per segment" (``None``)."""
    if bucket is None:
        return 0
    ok = isinstance(bucket, int) and not isinstance(bucket, bool) and bucket >= 1
    if not ok:
        raise ValueError(f"bucket={bucket!r}: must be a positive int (values per bucket) "
                         "or null (one bucket per segment)")
    return bucket


def check_clip(clip) -> float | None:
    ok = clip is None or (isinstance(clip, (int, float)) and not isinstance(clip, bool)
                          and math.isfinite(clip) and clip > 0)
    if not ok:
        raise ValueError(f"clip={clip!r}: must be null (no clipping) or a factor > 0 "
                         "(values clipped to +-clip*RMS of their bucket; TernGrad uses 2.5)")
    return None if clip is None else float(clip)


def check_choice(key: str, value, choices: tuple[str, ...], why: str) -> str:
    """``value`` if it is one of ``choices``, else a ValueError naming the key, the choices and ``why``."""
    if value not in choices:
        raise ValueError(f"{key}={value!r}: must be one of {', '.join(choices)} ({why})")
    return value
