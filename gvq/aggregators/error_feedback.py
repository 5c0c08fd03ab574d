"""Error feedback (Seide et al. 2014; Karimireddy et al. 2019) for any compressor on any topology:
``python cli.py aggregator=signsgd aggregator._target_=gvq.aggregators.error_feedback.ErrorFeedbackAggregator``.

See docs/design.md#gvqaggregatorserror_feedbackpy for how it works and why.
"""
from __future__ import annotations

import torch

from gvq.aggregators.compressed import CompressedAggregator
from gvq.aggregators.dtypes import widest_dtype


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


def fed_back_error(error: torch.Tensor, transmitted: torch.Tensor) -> float:
    """||g' - Q(g')||^2 / ||g'||^2 of the last vector fed back, with g' = t + e (untimed)."""
    lost = float(error.pow(2).sum())
    whole = float((transmitted + error).pow(2).sum())
    return lost / whole if whole > 0 else 0.0


class ErrorFeedbackAggregator(CompressedAggregator):
    """:class:`CompressedAggregator` whose ranks feed back what their compressor lost."""

    extra_fields = ("compression_error",)

    def __init__(self, compressor, topology: str = "ring", hop: str = "auto"):
        super().__init__(compressor, topology, hop)
        self.name = f"{self.name}+ef"

    def bind(self, params, ctx):
        super().bind(params, ctx)
        device = self.params[0].device if self.params else torch.device("cpu")
        # one flat memory laid out as the whole gradient (a checkpoint keeps it as it is); a DDP bucket
        # reads and writes its parameters' share of it, so any bucketing sees the same memory.  In the
        # widest parameter dtype, float32 at least: no parameter's share is rounded below its precision
        dtype = widest_dtype((p.dtype for p in self.params), at_least=torch.float32)
        self.error = torch.zeros(self.offsets[-1], dtype=dtype, device=device)
        self.transmitted = torch.zeros_like(self.error)      # this rank's last t = Q(g')

    #: error memory and this rank's last transmitted Q(g'), per parameter: a bucket feeds back its share
    per_parameter = ("error", "transmitted")

    def measure(self, bucket):
        return {}          # the error of g' falls out of feed_back for free (see measure_after)

    def average(self, bucket):
        n, flat = self.ctx.world_size, bucket.flat
        segs = self.segments(flat.numel(), n) if self.topology == "ring" else [slice(0, flat.numel())]
        feed_back(self.compressor, flat, bucket.state["error"], bucket.state["transmitted"], segs,
                  self.stopwatch)
        return super().average(bucket)

    def measure_after(self, bucket):
        return {"compression_error": fed_back_error(bucket.state["error"], bucket.state["transmitted"])}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "error": self.error.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.error.copy_(state["error"])
