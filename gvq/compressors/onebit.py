"""1-bit SGD with two means (Seide et al., Interspeech 2014; CNTK's ``ColumnQuantizer`` with
``ZeroThresholdFor1Bit``): per group, the mean of its non-negative values and the mean of its negative
ones, each value sent as 1 bit choosing one; error feedback on by default (``python cli.py
aggregator=onebit``).

Groups: ``tensor`` (GRACE's scope) or ``column``, one per row of a weight seen as (out, -1): the unit
that lies contiguous in memory, as a column does in CNTK's column-major matrices (1-D tensors: one
group).  An empty side decodes to 0 (CNTK counts it as 1), so a group's decoded sum equals its sum: the
means times their counts.  Wire: two float32 per group + 1 bit a value.
"""
from __future__ import annotations

import torch

from gvq.compressors._signs import GroupedSign


class OneBit(GroupedSign):
    name = "onebit"
    n_side = 2
    scopes = ("tensor", "column")

    def __init__(self, scope: str = "tensor",   # tensor | column (more groups => more side floats, less error)
                 kernels: str = "auto"):     # auto | triton | torch (gvq/compressors/_kernels.py)
        super().__init__(scope, kernels=kernels)

    def fit(self, x, bits, gid, counts, k):
        # each side's values by their float bits: x AND all-ones where bits (else +0.0, as where(bits, x, 0)),
        # and x XOR that for the rest: the same summands as two bool selects, at a fraction of their time
        word = x.view(torch.int32)
        ones = bits.to(torch.int32)
        kept = ones.neg().bitwise_and_(word)
        pos = self.group_sum(kept.view(torch.float32), gid, k)
        n_pos = self.group_sum(ones.to(torch.float32), gid, k)
        n_neg = counts - n_pos
        neg = self.group_sum(kept.bitwise_xor_(word).view(torch.float32), gid, k)
        # clamp: an empty side's sum is 0, so its mean is 0 whatever the divisor
        return torch.stack([neg / n_neg.clamp_min(1), pos / n_pos.clamp_min(1)], dim=1)

    def decode(self, bits, side):
        return torch.where(bits, side[:, 1], side[:, 0])
