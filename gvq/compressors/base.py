"""The compressor seam: what a gradient compressor must offer the ring engine.

See docs/design.md#gvqcompressorsbasepy for how it works and why.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gvq.compressors._segments import balanced_segments


class Compressor:
    """Base class; subclasses override ``compress`` / ``decompress`` / ``payload_spec``.  Every
    attribute an aggregator, benchmark or tool reads on a codec is declared here with its default; see
    docs/design.md#gvqcompressorsbasepy for the codecs that keep state between calls and the call order the ring
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
