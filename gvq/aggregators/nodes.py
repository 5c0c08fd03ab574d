"""Aggregators whose state or codec belongs to one worker (PowerSGD's low-rank factors and error memory,
DGC's momentum and accumulation) under ``aggregator.topology=hierarchical``: the node is the worker.

Inside the node the ranks' gradients are summed densely onto shards of whole tensors
(:func:`gvq.comm.hierarchy.node_phases`: a tensor is never split, so a matrix's factors and its per-tensor
selection stay the flat algorithm's); each shard, divided by the node's ranks, is that node's gradient of
those tensors, and the aggregator's own flat algorithm runs on it among the nodes holding the same shard,
with its state for those tensors; then the shards are gathered inside the node.  So the result equals the
flat algorithm at M workers, each fed its node's mean gradient, and the state each rank keeps is its
shard's (the rest of its memory stays unused).
"""
from __future__ import annotations

from typing import Callable

from gvq.aggregators.base import Bucket
from gvq.comm.hierarchy import node_phases


def tensor_cuts(agg, params: tuple[int, ...]) -> list[int]:
    """The offsets where ``params``' tensors start and end in their concatenated vector."""
    def build():
        cuts = [0]
        for i in params:
            cuts.append(cuts[-1] + agg.offsets[i + 1] - agg.offsets[i])
        return cuts
    return agg.memo(("tensor cuts", params), build)


def average_on_nodes(agg, bucket: Bucket, step: Callable) -> dict | None:
    """``bucket.flat`` replaced by its mean over every rank, the node being the worker: ``step(shard_bucket,
    across, nodes)`` is the aggregator's flat mean over ``nodes`` ranks on the :class:`P2P` view ``across``,
    of a :class:`Bucket` of the shard's tensors (its state views of ``bucket.state``, so a DDP bucket's
    share is written back as the flat path's is; ``bucket.notes`` shared, ``"shard"`` naming where).
    Returns the step's columns (None on an empty shard)."""
    cuts, out = tensor_cuts(agg, bucket.params), None
    with node_phases(bucket.flat, cuts, agg.p2p) as (shard, across, nodes):
        first, last = cuts.index(shard.start), cuts.index(shard.stop)
        bucket.notes["shard"] = shard                      # where the step's notes lie in the vector
        if last > first:
            sub = Bucket(bucket.flat[shard], bucket.params[first:last], bucket.iteration,
                         {k: v[shard] for k, v in bucket.state.items()}, bucket.notes)
            sub.flat.div_(agg.ctx.world_size // nodes)      # the node's mean gradient: its worker's
            out = step(sub, across, nodes)
    return out
