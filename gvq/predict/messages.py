"""What a posted message costs on this host: the ``[fixed, per byte]`` CPU seconds the virtual clock counts
per send or receive a ring posts, from virtual-time rings timed here (``calibrate``'s ``msg``: 2 ranks, a rank
a core; ``calibrate-overlap host_ranks=[...]``: N ranks sharing this host's cores, as its benchmarks run them,
on flat rings and, with ``host_ranks_per_node``, on the hierarchical rings of nodes of R).

A hierarchical ring is timed apart from the flat one at the same N: its phases are shorter between waits
(the node's ranks hand the host's clock lock to one another after every step), so a message posted inside it
costs more than one a flat ring posts, which no flat timing carries.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from gvq.predict.curves import cpu_seconds, linear

MSG_SEGMENTS = (32, 65536)               # ring segments of 128 B and 256 KB


def posts(world: int, per: int, seg: int) -> tuple[int, int, list[int]]:
    """One rank's (messages posted, bytes they carry, the values of each add) in one plain all-reduce of
    ``seg x world`` fp32 values on ``world`` ranks, nodes of ``per`` (1: the flat ring): a send and a receive
    a step; the node's reduce-scatter and all-gather move shards of ``seg x M`` values in R - 1 steps each, the
    ring across the M nodes segments of ``seg`` in 2 (M - 1)."""
    nodes = world // per
    intra, inter = 2 * (per - 1), 2 * (nodes - 1)
    n_posts = 2 * intra + 2 * inter
    n_bytes = 4 * (2 * intra * seg * nodes + 2 * inter * seg)
    return n_posts, n_bytes, [seg * nodes] * (per - 1) + [seg] * (nodes - 1)


def fit(world: int, per: int, per_call: list[float], adds: list[float]) -> list[float]:
    """[fixed, per byte] from each :data:`MSG_SEGMENTS` size's seconds a call, less its adds: the call's cost
    over its posts, against the bytes a post carries on average (on the flat ring every post carries one
    segment: the per-post figure at each size)."""
    points = []
    for seg, call, add in zip(MSG_SEGMENTS, per_call, adds):
        n_posts, n_bytes, _ = posts(world, per, seg)
        points.append((n_bytes / n_posts, (call - add) / n_posts))
    return linear(points)


def message_cost(reps: int = 40, world: int = 2, ranks_per_node: int = 1) -> list[float]:
    """[fixed, per byte] seconds a posted message costs, from virtual-time rings of ``world`` ranks on this
    host, nodes of ``ranks_per_node`` (1: the flat ring), everything but the blocked waits and the ring's own
    adds.  ``world`` 2: a rank a core here, the cluster the model projects to; more: ranks sharing this host's
    cores, as its N-rank benchmarks run them (a rank woken after others ran on its core pays more)."""
    from gvq.bench.common import spawn_loopback
    from gvq.comm.links import whole_nodes
    whole_nodes(world, ranks_per_node)
    got = spawn_loopback(_message_rank, world, world, ranks_per_node, reps)
    return fit(world, ranks_per_node, got["per_call"], got["adds"])


def _message_rank(rank: int, world: int, per: int, reps: int, init: str, out: str) -> None:
    import torch.distributed as dist

    from gvq.comm import clock
    from gvq.comm.clock import Stopwatch
    from gvq.comm.links import Cluster
    from gvq.comm.p2p import P2P
    torch.set_num_threads(1)
    clock.configure("virtual", exclusive=True)   # as the benchmarks: the ring timed alone
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        p2p = P2P(rank, world, 600.0, 1e15, cluster=Cluster(per, 1e15) if per > 1 else None)
        per_call, adds = [], []
        for seg in MSG_SEGMENTS:
            x, ring = torch.zeros(seg * world), _plain_ring(seg * world, world, per)
            ring.run_(x, p2p, Stopwatch())
            blocks = []
            for _ in range(5):                  # median of blocks: one hiccup of the host is not a cost
                t0 = clock.sync()
                for _ in range(reps):
                    ring.run_(x, p2p, Stopwatch())
                blocks.append((clock.sync() - t0) / reps)
            per_call.append(statistics.median(blocks))
            adds.append(sum(_add_seconds(v, reps) for v in posts(world, per, seg)[2]))
        if rank == 0:
            Path(out).write_text(json.dumps({"per_call": per_call, "adds": adds}))
    finally:
        dist.destroy_process_group()


def _plain_ring(numel: int, world: int, per: int):
    """The uncompressed all-reduce a benchmark's ``rar`` runs: flat, or hierarchical on nodes of ``per``."""
    from gvq.aggregators.base import equal_segments
    from gvq.comm.ring import Ring
    if per == 1:
        return Ring("plain", equal_segments(numel, world))
    return Ring("hierarchical", numel, inner="plain")


def _add_seconds(values: int, reps: int) -> float:
    """Median CPU seconds of one ring step's add of ``values`` received values."""
    part, buf = torch.zeros(values), torch.zeros(values)
    return statistics.median(cpu_seconds(lambda: part.__iadd__(buf)) for _ in range(reps))
