"""The hierarchical all-reduce of a two-level net (:mod:`gvq.comm.hierarchy`, ``aggregator.topology=
hierarchical``) replayed on the cost model, every rank at once, as :mod:`gvq.predict.schedule` replays the
flat rings: clocks as an M x R array (nodes x ranks a node; global rank m R + j), two link classes per rank,
each its own FIFO (:class:`gvq.comm.p2p.P2P`'s ``intra_link`` and ``link``).

1. :func:`gvq.predict.schedule.reduce_scatter` of the R shards inside every node, on the intra links;
2. per local rank j, the ring across the M nodes on the shard j holds (``inner``: the flat-ring schedule of
   the aggregator's own ring on that shard, on the inter-node links, which phases 1 and 3 never use);
3. :func:`gvq.predict.schedule.allgather` of the shards inside every node, on the intra links (their FIFOs
   as phase 1 left them).
One rank a node is the flat ring exactly: phases 1 and 3 are empty and ``inner`` runs on the whole vector.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from gvq.predict import schedule as S


def hierarchical_ring(shard_bytes: np.ndarray, add: np.ndarray, intra: S.Link, nodes: int,
                      inner: Callable[[int, np.ndarray], np.ndarray], start=None) -> np.ndarray:
    """Each rank's clock (length M R, global rank order) at the end of a hierarchical all-reduce whose
    node cuts its vector into R shards of ``shard_bytes`` (fp32, plain adds costing ``add`` each);
    ``inner(shard, start)``: the M clocks at the end of the ring across nodes on ``shard``, started at
    the M ``start`` clocks (the ranks holding it, node order)."""
    per = len(shard_bytes)
    t0 = np.zeros(nodes * per) if start is None else np.asarray(start, dtype=float)
    R = S.Ranks(per, intra, t0.reshape(nodes, per))
    if per > 1:
        S.reduce_scatter(R, np.asarray(shard_bytes, float), np.asarray(add, float))
    held = (np.arange(per) + 1) % per if per > 1 else np.zeros(1, int)   # reduce_scatter_'s return
    t = R.t.copy()
    for j in range(per):
        t[:, j] = inner(int(held[j]), t[:, j])
    R.t = t
    if per > 1:
        S.allgather(R, np.asarray(shard_bytes, float))
    return R.t.reshape(-1)


def shard_rounds(rnd: dict, per: int, nodes: int) -> tuple[np.ndarray, list[dict]]:
    """The shards a node's ``per`` ranks hold and the ring across ``nodes`` on each, as
    :func:`gvq.comm.hierarchy.node_shards` and :func:`~gvq.comm.hierarchy.shard_segments` cut them on the
    round's stored units (:func:`gvq.predict.structure.node_units`): (each shard's values, per shard the
    round with its M segments' values and payload bytes, one piece a segment), times the round's
    ``fraction`` (a fragment's).  The pieces' timings are not the shard's: its codec curves price it."""
    from gvq.comm.hierarchy import node_shards, shard_segments
    counts, vals, nbytes = (np.asarray(c) for c in zip(*rnd["units"]))
    numel = int((counts * vals).sum())
    every = len(counts) == 1 and int(vals[0]) == 1          # every offset a cut: the code's int form
    cuts = numel if every else np.concatenate([[0], np.cumsum(np.repeat(vals, counts))]).astype(int).tolist()
    cum = np.concatenate([[0.0], np.cumsum(np.repeat(nbytes, counts).astype(float))])
    share = rnd.get("fraction", 1.0)
    at = (lambda x: x) if every else (lambda x: int(np.searchsorted(cuts, x)))
    shards, out = node_shards(cuts, per), []
    for shard in shards:
        segs = shard_segments(cuts, shard, nodes)
        out.append({**rnd, "fraction": share * (shard.stop - shard.start) / max(numel, 1),
                    "vals": [[(q.stop - q.start) * share] for q in segs],
                    "bytes": [[(cum[at(q.stop)] - cum[at(q.start)]) * share] for q in segs]})
    return np.array([(q.stop - q.start) * share for q in shards], float), out


def fragment_rounds(rounds: list[dict], fraction: float) -> list[dict]:
    """``rounds`` of the whole vector as a fragment ``fraction`` of its size runs them: each piece's values
    and bytes scaled (a payload's fixed header with them, a small error), its message count kept."""
    if fraction == 1.0:
        return rounds
    return [{**r, "fraction": fraction, "vals": [[v * fraction for v in seg] for seg in r["vals"]],
             "bytes": [[b * fraction for b in seg] for seg in r["bytes"]]} for r in rounds]


def shard_round(rnd: dict, share: float) -> dict:
    """``rnd`` on a shard ``share`` of its vector, as :func:`gvq.comm.hierarchy.inner_ring` cuts it: the same
    M segments, each of the shard's values (one piece a segment: the pieces joined), their bytes scaled
    (:func:`fragment_rounds`; the node's shards are equal, to a codec unit)."""
    joined = {**rnd, "vals": [[sum(v)] for v in rnd["vals"]], "bytes": [[sum(b)] for b in rnd["bytes"]]}
    return fragment_rounds([joined], share)[0]
