"""How the hook cuts a DDP bucket into the vectors the aggregator averages.

A bucket's vector is summed with its parameters in the aggregator's order (DDP fills buckets in the
order backward produces gradients): a bucket holding the whole model is then the very vector
post-backward aggregation sums, and codecs with random draws make the same draws on it.

A fresh DDP puts every parameter in one bucket for its first iteration and rebuilds its buckets after
it.  A run resumed from a checkpoint would therefore average its first iteration in another layout
than the uninterrupted run (other vectors, other random draws); given the layout the checkpoint
recorded, :func:`reduce_bucket` cuts that one bucket into the recorded groups, so the resumed
iteration averages exactly the vectors the uninterrupted one did.
"""
from __future__ import annotations

import torch

from gvq.aggregators.flat import FlatAggregator


def groups(params: list[int], layout: list[list[int]] | None) -> list[list[int]]:
    """The recorded buckets ``params`` is made of, in recorded order; ``[params]`` when the layout is
    absent or does not cover the bucket exactly."""
    if not layout:
        return [params]
    inside = set(params)
    parts = [list(g) for g in layout if set(g) <= inside]
    return parts if sorted(i for g in parts for i in g) == sorted(params) else [params]


def reduce_bucket(agg: FlatAggregator, flat: torch.Tensor, params: list[int], iteration: int,
                  layout: list[list[int]] | None = None) -> list[tuple[list[int], int, dict]]:
    """Average the bucket ``flat`` (the gradients of ``params``, concatenated in that order) in place;
    one ``(group, numel, measurements)`` per vector averaged."""
    parts = groups(params, layout)
    if len(parts) == 1 and params == sorted(params):
        return [(params, flat.numel(), agg.average_bucket_(flat, params, iteration))]
    views = dict(zip(params, flat.split([agg.params[i].numel() for i in params])))
    out = []
    for group in parts:
        ordered = sorted(group)
        vec = torch.cat([views[i] for i in ordered])
        stats = agg.average_bucket_(vec, ordered, iteration)
        for i, piece in zip(ordered, vec.split([views[i].numel() for i in ordered])):
            views[i].copy_(piece)
        out.append((group, vec.numel(), stats))
    return out

