"""Error feedback (Seide et al. 2014; Karimireddy et al. 2019) for any compressor on any topology:
``python cli.py aggregator=signsgd aggregator._target_=gvq.aggregators.error_feedback.ErrorFeedbackAggregator``.

See docs/design.md#gvqaggregatorserror_feedbackpy for how it works and why.
"""
from __future__ import annotations

import torch

from gvq.aggregators.compressed import CompressedAggregator


def feed_back(comp, flat: torch.Tensor, error: torch.Tensor, transmitted: torch.Tensor,
              segs: list[slice], clock) -> None:
    """In place: flat <- g' = g + e; transmitted <- Q(g') segment by segment; error <- g' - Q(g')."""
    flat.add_(error)
    for s in segs:
        with clock("compress"):
            payload = comp.compress(flat[s], s)
        with clock("decompress"):
            transmitted[s] = comp.decompress(payload, s)
    torch.sub(flat, transmitted, out=error)


class ErrorFeedbackAggregator(CompressedAggregator):
    """:class:`CompressedAggregator` whose ranks feed back what their compressor lost."""

    extra_fields = ("compression_error",)
    any_bucket = False               # the error memory is laid out on the whole gradient

    def __init__(self, compressor, topology: str = "ring", hop: str = "auto"):
        super().__init__(compressor, topology, hop)
        self.name = f"{self.name}+ef"

    def setup(self, params, ctx):
        super().setup(params, ctx)
        self.error = torch.zeros_like(self.bucket)
        self.transmitted = torch.zeros_like(self.bucket)   # this rank's last t = Q(g')

    def measure(self, flat):
        return {}          # the error of g' falls out of feed_back for free (see aggregate)

    def allreduce_(self, flat, iteration):
        segs = self.segments(flat.numel()) if self.topology == "ring" else [slice(0, flat.numel())]
        feed_back(self.compressor, flat, self.error, self.transmitted, segs, self.clock)
        return super().allreduce_(flat, iteration)

    def measure_after(self, flat):
        return {"compression_error": self.relative_error()}

    def relative_error(self) -> float:
        """||g' - Q(g')||^2 / ||g'||^2 of this rank's last iteration, with g' = t + e (untimed)."""
        lost = float(self.error.pow(2).sum())
        whole = float((self.transmitted + self.error).pow(2).sum())
        return lost / whole if whole > 0 else 0.0

    def state_dict(self) -> dict:
        return {**super().state_dict(), "error": self.error.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.error.copy_(state["error"])
