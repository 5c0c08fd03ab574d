"""qgZ (``aggregator=qgz``) priced: its stored round (:func:`gvq.predict.structure.bucket_rounds`: the codec's
units, the spans between its cuts, with their payload bytes) laid out on M nodes x R ranks as
:func:`gvq.comm.alltoall_quant.shard_pieces` cuts it, each call priced from the calibration, the phases
replayed by :func:`gvq.predict.alltoall.qgz_allreduce` on the two link classes.

Costs: the codec's compress / decompress curves of the round's key (timed by calibrate on the flat
all-to-all's pieces at N = 2 .. 1024, whose sizes are those of any M x R = N's pieces) at each call's values
x ``codec_scale``; the adds of decoded values into the vector, and a plain wire's casts (fp16) and the fp32
gather's writes, as vector passes at scale 1 (outside the codec's stopwatch, as in the code: an add, or a
pass like the division's).  The calibration times decompress with its write into the vector, which phases 1
and 2 add instead: a pass over-priced per received payload.
"""
from __future__ import annotations

import numpy as np

from gvq.comm.alltoall_quant import shard_pieces
from gvq.predict import alltoall as A
from gvq.predict import schedule as S


def units(cuts: list[int], nbytes: list[int]) -> list[list[int]]:
    """The codec's units as stored: runs of [count, values, payload bytes] of the spans between consecutive
    ``cuts`` (``nbytes`` each one's), equal neighbours merged (a bucketed codec's are all one but the last)."""
    out: list[list[int]] = []
    for a, b, nb in zip(cuts, cuts[1:], nbytes):
        if out and out[-1][1:] == [b - a, nb]:
            out[-1][0] += 1
        else:
            out.append([1, b - a, nb])
    return out


def layout(rnd: dict, per: int, nodes: int) -> A.Layout:
    """The stored round's pieces on ``nodes`` x ``per``: values and payload bytes (the units' sum: the
    codec's payload is additive over its units, which :func:`gvq.predict.structure.bucket_rounds` checks),
    times the round's ``fraction`` (a fragment's)."""
    counts, vals, nbytes = (np.asarray(c) for c in zip(*rnd["units"]))
    cuts = np.concatenate([[0], np.cumsum(np.repeat(vals, counts))]).astype(int)
    cum = np.concatenate([[0.0], np.cumsum(np.repeat(nbytes, counts).astype(float))])
    parts = shard_pieces(cuts.tolist(), per, nodes)
    start = np.array([[q.start for q in shard] for shard in parts])
    stop = np.array([[q.stop for q in shard] for shard in parts])
    share = rnd.get("fraction", 1.0)
    at = lambda x: np.searchsorted(cuts, x)             # noqa: E731 -- a cut's index
    return A.Layout((stop - start) * share, (cum[at(stop)] - cum[at(start)]) * share)


def costs(rnd: dict, cal: dict, lay: A.Layout, codec_scale: float, op_cost) -> A.Costs:
    """Each call of the phases priced (the module's note) by ``op_cost`` (:func:`gvq.predict.cost_model.op_cost`,
    passed in: that module imports this one)."""
    codec, vec = cal["codecs"][rnd["key"]], cal["vector"]
    shard = lay.vals.sum(axis=1)

    def op(name: str, v):
        return op_cost(codec[name], v, codec_scale)

    def plain(v):                                       # a cast or a write: one pass over the values
        return op_cost(vec["div"], v, 1.0)

    none = lambda v: 0.0 * np.asarray(v, float)         # noqa: E731 -- fp32 wires: the values themselves
    enc1 = {"compressed": lambda v: op("compress", v), "fp16": plain, "fp32": none}[rnd["intra"]]
    dec1 = {"compressed": lambda v: op("decompress", v), "fp16": plain, "fp32": none}[rnd["intra"]]
    compressed = rnd["gather"] == "compressed"
    return A.Costs(encode1=enc1(shard), decode1=dec1(shard) + op_cost(vec["add"], shard, 1.0),
                   compress=op("compress", lay.vals), decompress=op("decompress", lay.vals),
                   add=op_cost(vec["add"], lay.vals, 1.0),
                   encode3=op("compress", lay.vals) if compressed else none(lay.vals),
                   decode3=op("decompress", lay.vals) if compressed else plain(lay.vals))


def replay_qgz(rnd: dict, cal: dict, link: S.Link, intra: S.Link | None, per: int, codec_scale: float,
               start, op_cost) -> np.ndarray:
    """The round on ``len(start) // per`` nodes of ``per`` ranks (one: the flat all-to-all on ``link``):
    each rank's clock at its end; ``op_cost``: :func:`costs`'."""
    nodes = len(start) // per
    lay = layout(rnd, per, nodes)
    return A.qgz_allreduce(lay, costs(rnd, cal, lay, codec_scale, op_cost), rnd["intra"], rnd["gather"], intra,
                           link, start)


def round_traffic(rnd: dict, per: int, nodes: int) -> dict[str, float]:
    """:func:`gvq.predict.alltoall.qgz_traffic` of the round on ``nodes`` x ``per``, averaged over the ranks."""
    got = A.qgz_traffic(layout(rnd, per, nodes), rnd["intra"], rnd["gather"])
    return {k: float(np.mean(v)) for k, v in got.items()}
