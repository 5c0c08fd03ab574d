"""ZeRO++'s qgZ (:mod:`gvq.comm.alltoall_quant`, ``aggregator=qgz``) replayed on the cost model, every rank at
once, as :mod:`gvq.predict.schedule` replays the rings and :mod:`gvq.predict.two_level` the hierarchical
all-reduce: the clocks an M x R array (nodes x ranks a node; global rank m R + j), one FIFO link per class
(:class:`gvq.predict.schedule.Ranks`: the intra links with the node's ranks along the last axis, the
inter-node links on the transposed clocks, the nodes along it), one clock.

The phases as :func:`gvq.comm.alltoall_quant.qgz_allreduce_` runs them, statement by statement:
1. inside the node: encode the R - 1 shards not held (``intra``'s wire), the all-to-all, then per received
   shard decode and add;
2. across nodes on shard j: encode the M - 1 pieces not held (the codec), the all-to-all, decode and add;
3. the gather: encode the own summed piece (``gather``'s wire), the all-to-all across nodes (that piece to
   every node), the all-to-all inside the node (the shard's M pieces to every node-mate), then decode every
   piece of the vector into it.
An all-to-all is N - 1 steps each posting its receives then its sends (step s: to the member s after, from
the one s before), then every receive and every send waited for; empty payloads send no message.  One rank a
node (the flat net): phase 1 and phase 3's node step are empty -- a flat all-to-all reduce of every rank's
encoded pieces, then an all-gather of the summed pieces, every byte on the one link.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gvq.predict import schedule as S

PLAIN_BYTES = {"fp16": 2, "fp32": 4}     # a plain wire's bytes a value (gvq.comm.alltoall_quant.PLAIN)


@dataclass
class Layout:
    """qgZ's pieces at M nodes x R ranks a node (:func:`gvq.comm.alltoall_quant.shard_pieces`): ``vals[j, m]``
    the values and ``nbytes[j, m]`` the codec's payload bytes of piece m of shard j, shape R x M."""
    vals: np.ndarray
    nbytes: np.ndarray

    def wire(self, kind: str) -> np.ndarray:
        """Per piece, its bytes on a phase's wire: the codec's payload, or plain values."""
        return self.nbytes if kind == "compressed" else PLAIN_BYTES[kind] * self.vals


@dataclass
class Costs:
    """Seconds of each call, per shard (shape R) or per piece (R x M), as the phases make them."""
    encode1: np.ndarray      # shard k on the intra wire (the codec's compress, a cast, or nothing)
    decode1: np.ndarray      # a received payload of shard j decoded, then added into it
    compress: np.ndarray     # piece (j, k) by the codec (phase 2)
    decompress: np.ndarray   # ... and decoded (phase 2's received payloads, the one-rank round trip)
    add: np.ndarray          # a decoded piece (j, m) added into it
    encode3: np.ndarray      # the own summed piece on the gather's wire
    decode3: np.ndarray      # a piece written from its gathered payload


def all_to_all_steps(R: S.Ranks, steps: list[list[np.ndarray]]) -> None:
    """:func:`gvq.comm.alltoall_quant.all_to_all` on ``R`` (members along its clocks' last axis): ``steps[s - 1]``
    the bytes of the messages each member sends in step s (to the member s after), in order; each member
    receives what the one s before sends it.  Every step's receives and sends posted before any wait."""
    posted = []
    for s, msgs in enumerate(steps, 1):
        for b in msgs:
            R.post(np.roll(b, s, axis=-1))           # the receive of what the member s before sends here
        posted.append([R.send(b) for b in msgs])
    for s, sent in enumerate(posted, 1):
        for arrival in sent:
            R.wait(arrival, s)
    for sent in posted:
        for arrival in sent:
            R.wait_sent(arrival)


def _sent_in_step(a: np.ndarray, s: int) -> np.ndarray:
    """Per member r (last axis), the entry of member (r + s) mod n: what r sends in step s."""
    return np.roll(a, -s, axis=-1)


def qgz_allreduce(lay: Layout, costs: Costs, intra_wire: str, gather_wire: str, intra: S.Link,
                  inter: S.Link, start=None) -> np.ndarray:
    """Each rank's clock (length M R, global rank order) at the end of qgZ on ``lay``'s M x R ranks."""
    per, nodes = lay.vals.shape
    t0 = np.zeros(nodes * per) if start is None else np.asarray(start, dtype=float)
    if nodes * per == 1:                     # one rank: the codec's round trip of the whole vector
        return t0 + costs.compress[0, 0] + costs.decompress[0, 0]
    node = S.Ranks(per, intra, t0.reshape(nodes, per))
    shard = lay.wire(intra_wire).sum(axis=1)                                  # (R,)
    node.t = node.t + (costs.encode1.sum() - costs.encode1)
    all_to_all_steps(node, [[_sent_in_step(shard, s)] for s in range(1, per)])
    node.t = node.t + (per - 1) * costs.decode1
    across = S.Ranks(nodes, inter, node.t.T)                                  # (R, M): nodes last
    piece = lay.nbytes
    across.t = across.t + (costs.compress.sum(axis=1, keepdims=True) - costs.compress)
    all_to_all_steps(across, [[_sent_in_step(piece, s)] for s in range(1, nodes)])
    across.t = across.t + (nodes - 1) * (costs.decompress + costs.add) + costs.encode3
    gathered = lay.wire(gather_wire)
    all_to_all_steps(across, [[gathered] for _ in range(1, nodes)])
    node.t = across.t.T
    all_to_all_steps(node, [[gathered[:, m] for m in range(nodes)] for _ in range(1, per)])   # the own shard's
    return (node.t + costs.decode3.sum()).reshape(-1)


def qgz_traffic(lay: Layout, intra_wire: str, gather_wire: str) -> dict[str, np.ndarray]:
    """Per rank (M x R, global order flattened), the bytes it sends (``sent``: ``P2P.bytes_sent``) and those to
    other nodes (``inter``: ``P2P.bytes_inter``; on one rank a node every byte, as the flat net counts it), and
    its messages on each class (``inter_msgs``, ``intra_msgs``): the wire arithmetic of the three phases."""
    per, nodes = lay.vals.shape
    shard, piece, gathered = lay.wire(intra_wire).sum(axis=1), lay.nbytes, lay.wire(gather_wire)
    reduce1 = np.broadcast_to(shard.sum() - shard, (nodes, per))
    across = (piece.sum(axis=1, keepdims=True) - piece + (nodes - 1) * gathered).T          # (M, R)
    gather1 = np.broadcast_to((per - 1) * gathered.sum(axis=1), (nodes, per))
    n_shard, n_piece, n_gath = (shard > 0), (piece > 0), (gathered > 0)
    intra_msgs = np.broadcast_to(n_shard.sum() - n_shard + (per - 1) * n_gath.sum(axis=1), (nodes, per))
    inter_msgs = (n_piece.sum(axis=1, keepdims=True) - n_piece + (nodes - 1) * n_gath).T
    # one rank a node: the node's phases are empty, so every byte sent is the across phases' (the flat net's)
    return {"sent": (reduce1 + across + gather1).reshape(-1), "inter": across.reshape(-1),
            "inter_msgs": inter_msgs.reshape(-1), "intra_msgs": intra_msgs.reshape(-1)}
