"""ZeRO++'s qgZ (Wang et al. 2023, §4.3): the gradient reduced by two all-to-alls of quantized shards, one
inside the node and one across, instead of a ring that re-quantizes a partial sum at every hop.
``python cli.py aggregator=qgz`` (:class:`gvq.aggregators.qgz.QgZAggregator`).

On N = M nodes x R ranks a node (:class:`gvq.comm.links.Cluster`), the vector cut into R shards on the codec's
cuts and shard j into M pieces (:func:`shard_pieces`):
1. inside the node: each rank encodes the R - 1 shards it does not hold and sends shard k to node-mate k, which
   adds what it decodes to its own raw values (fp32): node-mate j ends with its node's sum of shard j.  The
   wire is ``intra``: the codec's payloads, or plain fp16 / fp32 values (the fast links may afford them);
2. across nodes, among the ranks that hold the same shard: each encodes the M - 1 pieces of its node sum it does
   not hold and sends piece m to node m's rank: rank (m, j) ends with the sum over every rank of piece (j, m).
   The only reduce on the slow links: each rank sends (M - 1) / (MR) of the vector, encoded once;
3. the all-gather, across nodes first (each rank sends only its own summed piece over the slow links), then the
   shard's M pieces to the node-mates, as ZeRO++'s hpZ keeps the node's copy on the fast links.  ``gather``:
   the codec's payload of the summed piece (as qwZ gathers its weights quantized: plain fp32 would put 8x the
   reduce's bytes on the slow links at 4 bits), or fp32.  Every rank, the owner too, decodes the same
   payloads, so all end with the same bits.
One rank a node: a flat all-to-all reduce and all-gather (phase 1 and phase 3's node step are empty).  Each
all-to-all runs as pairwise steps (step s: to the member s after, from the one s before), every pair's messages
posted together, so no order of sends and receives deadlocks under NCCL either.
"""
from __future__ import annotations

import torch

from gvq.comm.clock import Stopwatch
from gvq.comm.hierarchy import node_shards, shard_segments
from gvq.comm.links import whole_nodes
from gvq.comm.p2p import P2P
from gvq.comm.ring_plain import timed_alone
from gvq.compressors.base import Compressor

PLAIN = {"fp16": torch.float16, "fp32": torch.float32}     # a phase's wire other than the codec's payloads


def shard_pieces(cuts, ranks_per_node: int, nodes: int) -> list[list[slice]]:
    """``[j][m]``: piece m of shard j, every boundary on the codec's ``cuts`` (an int: the vector's length,
    every offset a cut); absolute positions, so a codec laid out per tensor sees its own layout."""
    return [shard_segments(cuts, s, nodes) for s in node_shards(cuts, ranks_per_node)]


class Wire:
    """How a phase's spans travel: the codec's payloads (``dtype`` None) or plain values of ``dtype``."""

    def __init__(self, codec: Compressor, dtype: torch.dtype | None, stopwatch: Stopwatch):
        self.codec, self.dtype, self.stopwatch = codec, dtype, stopwatch

    def encode(self, flat: torch.Tensor, q: slice) -> torch.Tensor:
        if self.dtype is not None:
            return flat[q].to(self.dtype)          # fp32: the view itself (sent before flat[q] changes)
        with self.stopwatch("compress"):
            return self.codec.compress(flat[q], q)

    def empty(self, q: slice, device) -> torch.Tensor:
        if self.dtype is not None:
            return torch.empty(q.stop - q.start, dtype=self.dtype, device=device)
        return self.codec.empty_payload(q, device)

    def decode(self, payload: torch.Tensor, q: slice) -> torch.Tensor:
        if self.dtype is not None:
            return payload.float()
        with self.stopwatch("decompress"):
            return self.codec.decompress(payload, q)


def all_to_all(p2p: P2P, sends: dict[int, list], recvs: dict[int, list]) -> None:
    """``sends[k]`` to member k and ``recvs[k]`` from member k, for every other member k of ``p2p``'s ring:
    N - 1 pairwise steps, all posted before any is waited for (the links serialise them)."""
    n, r = p2p.world_size, p2p.rank
    posted = []
    for s in range(1, n):
        dst, src = (r + s) % n, (r - s) % n
        posted.append((src, dst, *p2p.exchange_all(sends[dst], dst, recvs[src], src)))
    for src, _, rh, _ in posted:
        for h in rh:
            p2p.wait(h, src)
    for _, dst, _, sh in posted:
        for h in sh:
            p2p.wait(h, dst)


def _reduce(flat: torch.Tensor, spans: list[slice], p2p: P2P, wire: Wire) -> None:
    """One all-to-all reduce among ``p2p``'s members: member k sends its ``spans[j]`` to member j and adds
    the decoded spans it receives to its own ``spans[k]`` (in member order: the same sum on any rank)."""
    n, r, mine = p2p.world_size, p2p.rank, spans[p2p.rank]
    others = [k for k in range(n) if k != r]
    recvs = {k: [wire.empty(mine, flat.device)] for k in others}
    all_to_all(p2p, {k: [wire.encode(flat, spans[k])] for k in others}, recvs)
    for k in others:
        flat[mine] += wire.decode(recvs[k][0], mine)


def _gather(flat: torch.Tensor, parts: list[list[slice]], inside: P2P, across: P2P, wire: Wire) -> None:
    """Phase 3: this rank's summed piece to the same shard's ranks of every node, then its shard's M pieces
    to its node-mates; every piece decoded from the one encoding its owner sent."""
    j, m = inside.rank, across.rank
    shard = parts[j]
    got = {m: wire.encode(flat, shard[m])}
    recvs = {k: [wire.empty(shard[k], flat.device)] for k in range(across.world_size) if k != m}
    all_to_all(across, {k: [got[m]] for k in recvs}, recvs)
    got.update({k: b[0] for k, b in recvs.items()})
    payloads = [got[k] for k in range(across.world_size)]
    mates = [k for k in range(inside.world_size) if k != j]
    inbox = {k: [wire.empty(q, flat.device) for q in parts[k]] for k in mates}
    all_to_all(inside, {k: payloads for k in mates}, inbox)
    for k, received in [(j, payloads)] + [(k, inbox[k]) for k in mates]:
        for q, payload in zip(parts[k], received):
            flat[q] = wire.decode(payload, q)


@timed_alone
def qgz_allreduce_(flat: torch.Tensor, ring, p2p: P2P, stopwatch: Stopwatch) -> None:
    """Overwrite ``flat`` with its sum over every rank in the three phases above; ``ring.segs`` holds the
    codec's cuts (an int: the vector's length), ``ring.inner`` the intra-node reduce's wire (``compressed``,
    ``fp16`` or ``fp32``), ``ring.gather`` the all-gather's (``compressed`` or ``fp32``)."""
    per = p2p.cluster.ranks_per_node
    nodes, (node, local) = whole_nodes(p2p.world_size, per), divmod(p2p.rank, per)
    inside = p2p.among([node * per + k for k in range(per)])
    across = p2p.among([k * per + local for k in range(nodes)])
    parts = shard_pieces(ring.segs, per, nodes)
    codec = Wire(ring.codec, None, stopwatch)
    if p2p.world_size == 1:                      # one rank: the codec's round trip, as every ring's
        for q in parts[0]:
            flat[q] = codec.decode(codec.encode(flat, q), q)
        return
    shards = [slice(s[0].start, s[-1].stop) for s in parts]
    _reduce(flat, shards, inside, Wire(ring.codec, PLAIN.get(ring.inner), stopwatch))
    _reduce(flat, parts[local], across, codec)
    _gather(flat, parts, inside, across, Wire(ring.codec, PLAIN.get(ring.gather), stopwatch))
