"""Signum's vote codec (Bernstein et al., signSGD with majority vote, ICML 2018 / ICLR 2019): each rank's
sign(momentum) as +-1, sign(0) := +1 (the vote of a value >= 0).  The momentum and the vote's own sign
live in :class:`gvq.aggregators.signum.SignumAggregator` (``python cli.py aggregator=signum``); this
codec only carries the votes, one of two ways (``vote``):

* ``int8``: one int8 a value, additive: partial sums of +-1 add in the compressed domain, so gvq's
  summing ring carries them (|sum| <= N, exact in int8 for N <= 127); n bytes a segment.
* ``bits``: 1 bit a value, packed 8 per byte (:mod:`gvq.compressors._signs`); not additive (bits do not
  sum), so it travels by allgather, each rank decoding and summing every rank's +-1.

Both decode to the same +-1 per rank, so both sums, and the votes, are equal.  ``kernels``: the torch ops
here are the reference; the Triton path (:mod:`gvq.compressors._triton_grace`) is one launch each way, the
same bytes.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gvq.compressors import _triton_grace
from gvq.compressors._kernels import TORCH, DeviceKernels, Op
from gvq.compressors._signs import pack_signs, unpack_signs
from gvq.compressors.base import Compressor, check_choice

#: the largest |sum of N votes| int8 holds: N = 127 ranks
INT8_MAX_RANKS = 127


class SignVote(DeviceKernels, Compressor):
    name = "signum"

    def __init__(self, vote: str = "int8",    # int8 (ring, n B; N <= 127) | bits (allgather, n/8 B, x (N-1) in)
                 kernels: str = "auto"):   # auto | triton | torch (gvq/compressors/_kernels.py)
        self.vote = check_choice("vote", vote, ("int8", "bits"), "the vote's wire format")
        self.additive = vote == "int8"
        self.init_kernels(kernels)

    @property
    def ideal_ratio(self) -> float:
        return 4.0 if self.vote == "int8" else 32.0

    def payload_spec(self, seg: slice) -> tuple[torch.dtype, int]:
        n = seg.stop - seg.start
        return (torch.int8, n) if self.vote == "int8" else (torch.uint8, math.ceil(n / 8))

    def compress(self, x: Tensor, seg: slice) -> Tensor:
        x = x.reshape(-1)
        return COMPRESS(self.path(x.device) if x.numel() else TORCH, self, x, seg)

    def torch_compress(self, x: Tensor, seg: slice) -> Tensor:
        up = x >= 0
        if self.vote == "bits":
            return pack_signs(up)
        return up.to(torch.int8).mul_(2).sub_(1)            # +-1

    def decompress(self, payload: Tensor, seg: slice) -> Tensor:
        return DECOMPRESS(self.path(payload.device) if seg.stop > seg.start else TORCH, self, payload, seg)

    def torch_decompress(self, payload: Tensor, seg: slice) -> Tensor:
        if self.vote == "int8":
            return payload.to(torch.float32)                # a sum of votes, exact
        up = unpack_signs(payload, seg.stop - seg.start)
        return up.to(torch.float32).mul_(2).sub_(1)


# the vote's calls per path (``_kernels.Op``): the torch reference above, and its Triton kernels
COMPRESS = Op(torch=SignVote.torch_compress,
              triton=lambda q, x, seg: _triton_grace.vote_compress(q, x.contiguous(), seg))
DECOMPRESS = Op(torch=SignVote.torch_decompress, triton=_triton_grace.vote_decompress)
