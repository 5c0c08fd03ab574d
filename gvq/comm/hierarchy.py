"""The hierarchical all-reduce of a two-level net (nodes of fast-linked ranks, slower links between nodes):
``aggregator.topology=hierarchical``, as NCCL's, Horovod's and BytePS's hierarchical all-reduce run it.

Three phases on a vector of N = M nodes x R ranks a node (:class:`gvq.comm.links.Cluster`):
1. a plain reduce-scatter among the R ranks of each node: each rank ends with its node's sum of one shard
   (1/R of the vector, cut on the codec's cuts so a shard holds whole codec units);
2. the aggregator's own ring (``Ring.inner``: plain, summed payloads, decode-add-encode or an all-gather,
   with its hop rules) across the M nodes, among the ranks that hold the same shard: the only phase on the
   slow links, carrying 1/R of the vector per rank;
3. a plain all-gather of the shards among the node's ranks.
Phases 1 and 3 carry ``net.intra_dtype`` (:func:`node_phases`).  Aggregators whose state or codec
belongs to a worker (PowerSGD's error memory, DGC's momentum) run their own flat algorithm among the nodes
inside :func:`node_phases` instead (:mod:`gvq.aggregators.nodes`).
One rank a node is the flat ring exactly (phases 1 and 3 are empty).  The node's ranks are consecutive
positions of the ring (global ranks ``m R ... m R + R - 1`` on the default group).
"""
from __future__ import annotations

import bisect
import dataclasses
from contextlib import contextmanager

import torch
import torch.distributed as dist

from gvq.comm import clock as rank_clock
from gvq.comm.clock import Stopwatch
from gvq.comm.links import whole_nodes
from gvq.comm.p2p import P2P
from gvq.comm.ring_plain import allgather_, reduce_scatter_, timed_alone
from gvq.compressors._segments import balanced_segments


def node_groups(rank: int, world_size: int, ranks_per_node: int) -> tuple:
    """This rank's two process groups on a two-level net: its node's ranks, and one rank of every node (the
    ranks at its own local index).  Collective: every rank makes every group, in the same order."""
    per, nodes = ranks_per_node, whole_nodes(world_size, ranks_per_node)
    node, local = divmod(rank, per)
    inside = [dist.new_group([m * per + j for j in range(per)]) for m in range(nodes)]
    across = [dist.new_group([m * per + j for m in range(nodes)]) for j in range(per)]
    return inside[node], across[local]


def node_shards(cuts, per: int) -> list[slice]:
    """The node's R shards, one a rank, on ``cuts`` (an int: the length, every offset a cut)."""
    return balanced_segments(cuts, per)


def shard_segments(cuts, shard: slice, nodes: int) -> list[slice]:
    """The M segments of the ring across nodes on ``shard``: on the cuts inside it (absolute positions;
    found by bisection, as every call runs it)."""
    if isinstance(cuts, int):
        return [slice(s.start + shard.start, s.stop + shard.start)
                for s in balanced_segments(shard.stop - shard.start, nodes)]
    return balanced_segments(cuts[bisect.bisect_left(cuts, shard.start):bisect.bisect_right(cuts, shard.stop)], nodes)


def compact_cuts(cuts: list[int]) -> list[int] | int:
    """A codec's cuts in the form the hierarchical rings take: the length where every offset is a cut (fp16's,
    the base codec's: a list of N + 1 offsets would be searched on every call), else the list."""
    return cuts[-1] if len(cuts) == cuts[-1] - cuts[0] + 1 else cuts


def inner_ring(ring, shard: slice, nodes: int):
    """``ring``'s ring across nodes on ``shard``: a :class:`gvq.comm.ring.Ring` of kind ``ring.inner``, its M
    segments on the cuts inside the shard (:func:`shard_segments`: absolute positions, so a codec laid out on
    the whole vector, per tensor, sees its own layout)."""
    kind = ring.inner
    if kind in ("allgather", "ps"):
        return dataclasses.replace(ring, kind=kind, segs=[[shard]], inner="")
    segs = shard_segments(ring.segs, shard, nodes)
    return dataclasses.replace(ring, kind=kind, segs=[[s] for s in segs] if kind == "additive" else segs, inner="")


@contextmanager
def node_phases(flat, cuts, p2p: P2P):
    """Phases 1 and 3 around the block: reduce-scatter ``flat`` among the node's ranks on shards cut on
    ``cuts`` (an int: the length, every offset a cut), yield (this rank's shard, the :meth:`P2P.among` view of
    the ranks across nodes holding the same shard, the number of nodes), then all-gather the shards.  The
    block leaves the shard's across-node result in ``flat[shard]``.  The node phases carry
    ``cluster.intra_dtype``: fp16 sends a float16 copy (half the bytes; every rank ends with the same bits,
    its own shard rounded as the others receive it)."""
    per = p2p.cluster.ranks_per_node
    nodes, (node, local) = whole_nodes(p2p.world_size, per), divmod(p2p.rank, per)
    inside = p2p.among([node * per + j for j in range(per)])
    across = p2p.among([m * per + local for m in range(nodes)])
    cut = node_shards(cuts, per)
    half = per > 1 and p2p.cluster.intra_dtype == "fp16" and flat.dtype != torch.float16
    with rank_clock.phase("ring"):
        wire = flat.to(torch.float16) if half else flat
        mine = cut[reduce_scatter_(wire, cut, inside)] if per > 1 else cut[0]
        if half:
            flat[mine] = wire[mine]
    yield mine, across, nodes
    if per > 1:
        with rank_clock.phase("ring"):
            if half:
                wire[mine] = flat[mine]
            allgather_(wire, cut, inside)
            if half:
                flat.copy_(wire)


@timed_alone
def hierarchical_allreduce_(flat, ring, p2p: P2P, stopwatch: Stopwatch) -> None:
    """Overwrite ``flat`` with its sum over every rank, in the three phases above; ``ring.segs`` holds the
    codec's cuts of the vector (an int: its length, every offset a cut), ``ring.inner`` the kind of the
    ring across nodes."""
    with node_phases(flat, ring.segs, p2p) as (shard, across, nodes):
        inner_ring(ring, shard, nodes).run_(flat, across, stopwatch)
