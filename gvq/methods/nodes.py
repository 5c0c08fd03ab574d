"""``method.workers=node``: the DiLoCo family's workers are the nodes of a two-level net (``net.ranks_per_node``
R consecutive ranks a node, M nodes): data parallel inside a node, the outer step across nodes, the split
DiLoCo's deployments make (DDP inside a site, the pseudo-gradient between sites).

Every inner step the node's ranks average their gradients with the every-step averaging (rar's uncompressed
ring, :meth:`FlatAggregator.aggregate`) on the node's process group: intra-node links only, and the node's
ranks stay bitwise identical (a ring's segment is summed on one rank and copied to the others).  At an outer
step Δ is the same on the node's R ranks, so each rank sends only its share: the parameters cut into R
contiguous blocks of about equal size, rank j of each node averaging block j across the M nodes through the
run's aggregator (set up on the ring of the nodes' j-th ranks, :meth:`NodeWorkers.across`), then the blocks
all-gathered inside the node.  A node thus sends the aggregator's bytes on Δ over M nodes once, split over
its R links, not R times (each rank running the ring on the whole Δ would): the slow links carry 1/R of Δ
per rank, as in the hierarchical all-reduce (gvq/comm/hierarchy.py), without its reduce-scatter (nothing
to sum inside a node).  Every rank then holds the same averaged Δ and takes the same outer step.  The
blocks are cut on parameter boundaries so the aggregator sees whole tensors with their own layout and
per-parameter state.
"""
from __future__ import annotations

import dataclasses

import torch

from gvq.aggregators.base import Aggregator, RunContext
from gvq.aggregators.rar import RingAllReduce
from gvq.comm import clock
from gvq.comm.hierarchy import node_groups
from gvq.comm.ring_plain import allgather_, timed_alone
from gvq.compressors._segments import balanced_segments

#: the counters that add up when one sync is two collectives (the blocks' ring, the all-gather)
ADDED = ("bytes_sent", "bytes_received", "bytes_inter", "wire_s", "stage_s")


class NodeWorkers:
    """A rank's two rings when DiLoCo's workers are nodes: its node's (gradients, the all-gather of Δ) and
    the nodes' at its local index (:attr:`across`, the context the run's aggregator is set up in)."""

    def __init__(self, ctx: RunContext):
        per = ctx.cluster.ranks_per_node
        inside, across = node_groups(ctx.rank, ctx.world_size, per)
        node, self.local = divmod(ctx.rank, per)
        self.per = per
        self.inside_ctx = dataclasses.replace(ctx, rank=self.local, world_size=per, group=inside)
        self.across = dataclasses.replace(ctx, rank=node, world_size=ctx.world_size // per, group=across)
        self.inside = RingAllReduce(topology="ring")

    def setup(self, params: list[torch.nn.Parameter]) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.inside.setup(params, self.inside_ctx)

    def average_gradients(self, iteration: int) -> dict:
        """Every ``param.grad`` replaced by its mean over the node's ranks; the step's columns."""
        self.last = self.inside.aggregate(iteration)
        return self.last

    def plus_gradients(self, row: dict) -> dict:
        """``after_step``'s ``row`` (its columns replace ``before_step``'s) with this step's gradient averaging
        inside the node added where it names the same counter, so a sync's row counts both."""
        return {**row, **{k: row[k] + self.last[k] for k in (*ADDED, "aggregate_s") if k in row}}

    def share(self, params: tuple[int, ...]) -> tuple[list[slice], tuple[int, ...]]:
        """The R blocks of a vector laid out as ``params`` (value ranges on parameter boundaries, some empty
        when there are fewer parameters than ranks), and the parameters of this rank's block: block
        ``(local + 1) % R``, the one the ring's all-gather sends from this rank."""
        cuts = [0]
        for i in params:
            cuts.append(cuts[-1] + self.params[i].numel())
        blocks = balanced_segments(cuts, self.per)
        mine = blocks[(self.local + 1) % self.per]
        return blocks, tuple(i for i, a in zip(params, cuts) if mine.start <= a < mine.stop)

    def average(self, agg: Aggregator, delta: torch.Tensor, iteration: int, params: tuple[int, ...]) -> dict:
        """``delta`` (laid out as ``params``, the same on the node's ranks) replaced by its mean over the
        nodes: this rank's block through ``agg`` across nodes, then every block from the node's ranks.
        Returns the sync's columns, the two collectives' counters added (``aggregate_s``: both)."""
        t0 = clock.now()
        blocks, mine = self.share(params)
        block = blocks[(self.local + 1) % self.per]
        stats = agg.average_vector(delta[block], iteration, mine) if mine else {}
        self.inside.reset_counters()
        gather_(delta, blocks, self.inside)
        inside = self.inside.counters()
        return {**stats, **{k: stats.get(k, 0) + inside[k] for k in ADDED}, "aggregate_s": clock.now() - t0}

    def close(self) -> None:
        self.inside.close()


@timed_alone
def gather_(delta: torch.Tensor, blocks: list[slice], inside: RingAllReduce) -> None:
    """Each rank's averaged block to the node's other ranks (the ring's all-gather on the intra links)."""
    if len(blocks) > 1:
        allgather_(delta, blocks, inside.p2p)
