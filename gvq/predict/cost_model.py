"""The cost model: an aggregator's time at N ranks on a link of B bit/s (latency alpha), from the
measured costs (``calibration.json``) and the ring structure (``structure.json``), replayed by
:mod:`gvq.predict.schedule`; plus compute, for whole iterations.

Scales as in virtual time: codec work (compress, decompress, payload adds, the passes an aggregator
declares outside its rings: ``Aggregator.extra_passes``) x ``codec_scale``; forward / backward / step x
``compute_scale``; the uncompressed ring's adds, the division by N and message posting at 1.  An iteration =
compute + aggregation (every rank starts aggregating at once, as after the runner's per-iteration clock sync,
and waits for the slowest rank's gradient: see ``slowest``); aggregation = the slowest rank's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gvq.comm.links import Cluster, whole_nodes
from gvq.comm.ring_sparse import PAIR_BYTES
from gvq.predict import schedule as S
from gvq.predict.qgz import replay_qgz
from gvq.predict.two_level import fragment_rounds, hierarchical_ring, shard_round, shard_rounds

FLAT = Cluster()             # one rank a node: the flat ring at one link


class PredictError(Exception):
    """What the cost model cannot answer as asked (no calibration, an aggregator or N it was not
    calibrated for): one line, which ``python -m gvq.predict`` exits with."""


@dataclass
class Calibrated:
    cal: dict
    struct: dict
    cache: dict = field(default_factory=dict)        # aggregation times already simulated

    @classmethod
    def load(cls, folder: Path) -> Calibrated:
        try:
            cal = json.loads((folder / "calibration.json").read_text())
            struct = json.loads((folder / "structure.json").read_text())
        except FileNotFoundError as e:
            raise PredictError(f"gvq.predict: {e.filename} missing: run `python -m gvq.predict calibrate` "
                             f"first (--calibration {folder})") from None
        from gvq.predict.structure import stale_names
        hidden = stale_names(cal, struct)
        if hidden:                 # its costs would be matched to the setting the name says, not the one priced
            raise PredictError(f"gvq.predict: {folder}: calibrated before names carried their values: "
                               f"{', '.join(hidden)}; run `python -m gvq.predict calibrate` again")
        struct["passes"] = declared_passes(cal, struct)
        return cls(cal, struct)

    def passes(self, name: str) -> int:
        """Whole-vector passes aggregator ``name``'s ``average`` makes outside its rings
        (``Aggregator.extra_passes``), each priced as a vector add at the codec scale."""
        return int(self.struct["passes"][name])

    @property
    def aggregators(self) -> list[str]:
        return list(self.struct["aggregators"])

    @property
    def world_sizes(self) -> list[int]:
        return sorted(int(n) for n in next(iter(self.struct["aggregators"].values())))


def calibration_folder(root: Path, model: str) -> Path:
    """``model``'s calibration under ``--calibration root``: ``root/model`` where that holds one (the
    default ``runs/predict/`` keeps one folder per model), else ``root`` itself where it is a calibration
    of ``model`` (the folder ``calibrate --out`` wrote); a calibration of another model there is refused
    in one line.  Else ``root/model`` (loading it says to calibrate)."""
    own = root / model
    if (own / "calibration.json").is_file() or not (root / "calibration.json").is_file():
        return own
    try:
        got = json.loads((root / "calibration.json").read_text()).get("model")
    except ValueError as e:
        raise PredictError(f"--calibration {root}: calibration.json unreadable ({e})") from None
    if got != model:
        raise PredictError(f"--calibration {root}: a calibration of {got}, not {model}: give models=[{got}], "
                           f"or the folder holding {model}'s calibration")
    return root


def declared_passes(cal: dict, struct: dict) -> dict[str, int]:
    """``structure.json``'s passes outside the rings, per aggregator; a file written before calibrate
    stored them gets them from its aggregators, built as calibrate built them (nothing timed)."""
    if "passes" in struct:
        return struct["passes"]
    from gvq.predict.structure import build_on_one_rank, calibrated_entries, calibrated_workload
    out = {}
    for name, entry in calibrated_entries(cal, struct).items():
        agg, _ = build_on_one_rank(entry, cal["model"], cal["num_classes"], cal["settings"],
                                   calibrated_workload(cal).in_channels)
        out[name] = agg.extra_passes()
        agg.close()
    return out


def op_cost(fit, values, scale: float) -> np.ndarray:
    """Seconds of an operation on ``values``: a [fixed, per value] line, or a measured curve
    ({values, seconds}; linear between points, the end slopes beyond them)."""
    v = np.asarray(values, dtype=float)
    if isinstance(fit, dict):
        xs, ys = np.asarray(fit["values"], float), np.asarray(fit["seconds"], float)
        if len(xs) == 1:
            return ys[0] * v / max(xs[0], 1.0) * scale
        out = np.interp(v, xs, ys)
        hi = ys[-1] + (v - xs[-1]) * max(ys[-1] - ys[-2], 0.0) / (xs[-1] - xs[-2])
        lo = ys[0] + (v - xs[0]) * max(ys[1] - ys[0], 0.0) / (xs[1] - xs[0])
        return np.maximum(np.where(v > xs[-1], hi, np.where(v < xs[0], lo, out)), 0.0) * scale
    return (fit[0] + fit[1] * v) * scale


def _pieces(rnd: dict, costs: dict, scale: float) -> S.Pieces:
    n, P = len(rnd["vals"]), max(1, max(len(s) for s in rnd["vals"]))
    vals, nbytes, present = np.zeros((n, P)), np.zeros((n, P)), np.zeros((n, P), bool)
    for s, (v, b) in enumerate(zip(rnd["vals"], rnd["bytes"])):
        vals[s, :len(v)], nbytes[s, :len(b)], present[s, :len(v)] = v, b, True
    elems = nbytes / 4.0                            # the payload adds run on float32 payloads
    cost = _piece_costs(rnd, costs, scale, present)
    return S.Pieces(cost("compress", vals), cost("decompress", vals),
                    cost("add", elems) if "add" in costs else 0.0 * vals, nbytes, present)


def _piece_costs(rnd: dict, costs: dict, scale: float, present: np.ndarray):
    """``cost(op, sizes)`` -> seconds per (segment, piece): each piece's own timing where calibration
    timed every piece at this N (``pieces``, seg-major), else the op's curve at the piece's size."""
    exact = costs.get("pieces", {}).get(str(len(rnd["vals"])), {})

    def cost(op: str, sizes: np.ndarray) -> np.ndarray:
        own = exact.get(op)
        if own is not None and len(own) == int(present.sum()):
            out = np.zeros(present.shape)
            out[present] = np.asarray(own, float) * scale
            return out
        return op_cost(costs[op], sizes, scale) * present
    return cost


def replay_ring(rnd: dict, cal: dict, link: S.Link, codec_scale: float, start) -> np.ndarray:
    """One round of :func:`gvq.predict.structure.rounds` replayed from every rank's ``start``: each
    rank's clock at its end."""
    kind = rnd["kind"]
    if kind == "qgz":                               # its all-to-alls on the flat net
        return replay_qgz(rnd, cal, link, None, 1, codec_scale, start, op_cost)
    if kind == "plain":
        vals = np.array([sum(v) for v in rnd["vals"]], float)
        return S.plain_ring(4.0 * vals, op_cost(cal["vector"]["add"], vals, 1.0), link, start)
    costs = cal["codecs"][rnd["key"]]
    if rnd.get("fraction", 1.0) != 1.0:           # a fragment's pieces were never timed: their curves price them
        costs = {op: c for op, c in costs.items() if op != "pieces"}
    if kind == "sparse":
        return _replay_sparse(rnd, cal, costs, link, codec_scale, start)
    p = _pieces(rnd, costs, codec_scale)
    if kind == "additive":
        return S.additive_ring(p, link, start)
    if kind == "reencode":                          # decode, partial += flat[seg], encode: one statement
        seg_vals = np.array([[sum(v)] for v in rnd["vals"]], float)      # one piece per segment
        hop = _piece_costs(rnd, costs, codec_scale, p.present)("hop", seg_vals)[:, 0]
        return S.reencode_ring(p.nbytes[:, 0], p.compress[:, 0], p.decompress[:, 0], hop, link, start)
    gather = S.gather_ring if kind == "allgather" else S.through_server
    numel = float(rnd["vals"][0][0])             # one whole-vector round: its ranks are the clocks it starts from
    return gather(float(p.nbytes[0, 0]), float(p.compress[0, 0]), float(p.decompress[0, 0]),
                  float(op_cost(cal["vector"]["add"], numel, codec_scale)), link, len(start), start)


def replay_two_level(rnd: dict, cal: dict, link: S.Link, intra: S.Link, per: int, codec_scale: float,
                     start) -> np.ndarray:
    """One round (the ring across M nodes, stored at N = M) as :func:`gvq.comm.hierarchy.hierarchical_allreduce_`
    runs it on nodes of ``per`` ranks: fp32 shards of the round's vector, cut as the code cuts them on the
    stored units (:func:`gvq.predict.two_level.shard_rounds`; a round stored without units: equal 1/per
    slices, :func:`shard_round`), reduce-scattered and all-gathered on the ``intra`` links (adds at scale 1,
    as the plain ring's), the round's own ring on each shard across nodes on ``link``; qgZ's round as its
    all-to-alls run on the nodes."""
    if rnd["kind"] == "qgz":                        # not a ring: its own phases on the two classes
        return replay_qgz(rnd, cal, link, intra, per, codec_scale, start, op_cost)
    if rnd["kind"] == "sparse":
        raise PredictError("gvq.predict: the sparse ring (topology=sparse_ring) has no hierarchical form to price")
    nodes = len(start) // per
    if "units" in rnd:                              # the code's shards and segments, on the codec's units
        vals, inner = shard_rounds(rnd, per, nodes)
    else:                                           # stored before units were: R equal shards
        vals, inner = np.full(per, sum(sum(v) for v in rnd["vals"]) / per), [shard_round(rnd, 1.0 / per)] * per
    return hierarchical_ring(4.0 * vals, op_cost(cal["vector"]["add"], vals, 1.0), intra, nodes,
                             lambda j, s: replay_ring(inner[j], cal, link, codec_scale, s), start)


def _replay_sparse(rnd: dict, cal: dict, costs: dict, link: S.Link, codec_scale: float, start) -> np.ndarray:
    """The sparse ring (``topology=sparse_ring``): the codec's compress and decode of the whole vector
    (its curves at the vector's size), a merge per reduce-scatter hop priced as a vector add over the
    segment (a bound: a union's adds never exceed the segment's values) and the write-back as one over
    the vector; bytes as :func:`gvq.predict.schedule.sparse_message_bytes` (disjoint supports)."""
    lengths = np.array([sum(v) for v in rnd["vals"]], float)
    numel = float(lengths.sum())
    codec = float(op_cost(costs["compress"], numel, codec_scale) + op_cost(costs["decompress"], numel, codec_scale))
    add = cal["vector"]["add"]
    return S.sparse_ring(sparse_kept(rnd), lengths, codec, op_cost(add, lengths, codec_scale),
                         float(op_cost(add, numel, codec_scale)), link, start)


def sparse_kept(rnd: dict) -> np.ndarray:
    """A sparse round's entries per segment, from its stored bytes (8 a pair: ``structure._round``)."""
    return np.array([sum(b) for b in rnd["bytes"]], float) / PAIR_BYTES


def aggregation(m: Calibrated, name: str, n: int, bps: float, alpha: float = 0.0,
                codec_scale: float = 1.0, msg: tuple[float, float] | None = None, fraction: float = 1.0,
                cluster: Cluster = FLAT) -> float:
    """Seconds of one aggregation (the slowest rank), as the virtual clock would time it.  ``msg``: the
    [fixed, per byte] cost of posting a message, if not the calibration's (a rank a core).  ``fraction``:
    of a fragment that size of the vector (Streaming DiLoCo's 1/P): the same rings and messages, every
    piece's values and bytes, and the passes beside the rings, times it (:func:`fragment_rounds`).
    ``cluster``: nodes of ``ranks_per_node`` ranks on its intra links, ``bps`` / ``alpha`` between nodes;
    more than one a node prices every ring as ``aggregator.topology=hierarchical`` runs it
    (:func:`replay_two_level`)."""
    key = (name, n, bps, alpha, codec_scale, msg) + ((fraction,) if fraction != 1.0 else ())
    key += () if cluster.flat else (cluster,)
    if key not in m.cache:
        m.cache[key] = _simulate_aggregation(m, name, n, bps, alpha, codec_scale, msg or tuple(m.cal["msg"]),
                                             fraction, cluster)
    return m.cache[key]


def nodes_of(n: int, cluster: Cluster) -> int:
    """M, the nodes N ranks fill on ``cluster``; a one-line refusal unless they fill whole nodes."""
    try:
        return whole_nodes(n, cluster.ranks_per_node)
    except ValueError as e:
        raise PredictError(f"gvq.predict: {e}") from None


def _simulate_aggregation(m: Calibrated, name: str, n: int, bps: float, alpha: float, codec_scale: float,
                          msg: tuple[float, float], fraction: float = 1.0, cluster: Cluster = FLAT) -> float:
    per_n = m.struct["aggregators"].get(name)
    if per_n is None:
        raise PredictError(f"gvq.predict: aggregator {name!r} not calibrated (have {', '.join(m.aggregators)})")
    per, nodes = cluster.ranks_per_node, nodes_of(n, cluster)
    if str(nodes) not in per_n:
        what = f"N={n}" if per == 1 else f"{nodes} nodes (N={n} as {nodes} x {per})"
        raise PredictError(f"gvq.predict: {what} not in the calibrated structure (have {m.world_sizes})")
    cal, numel = m.cal, m.struct["numel"] * fraction
    link = S.Link(bps, alpha, *msg)
    intra = None if per == 1 else S.Link(cluster.intra_bandwidth_bps, cluster.intra_latency_s, *msg)
    t = np.zeros(n)
    for rnd in fragment_rounds(per_n[str(nodes)], fraction):
        t = (replay_ring(rnd, cal, link, codec_scale, t) if per == 1
             else replay_two_level(rnd, cal, link, intra, per, codec_scale, t))
    extra = float(op_cost(cal["vector"]["div"], numel, 1.0))            # flat.div_(N)
    extra += m.passes(name) * float(op_cost(cal["vector"]["add"], numel, codec_scale))
    return float(t.max()) + extra


def slowest(samples, n: int) -> float:
    """Median, over iterations, of the slowest of ``n`` ranks' compute: every rank waits for the last
    one's gradient, so an iteration costs the maximum of N draws, whose CDF is F^N; its median is F's
    ``0.5 ** (1 / n)`` quantile (0.71 at N = 2, 0.96 at 16).  Draws are the calibration's one-rank
    samples, as if ranks were independent; beyond the samples' range (N well past their count) it stays
    at their maximum -- a heavier tail (stragglers on a shared cluster) is not in them."""
    return float(np.quantile(np.asarray(samples, float), 0.5 ** (1.0 / max(n, 1))))


def compute_time(m: Calibrated, n: int, compute_s=None) -> float:
    """The compute phase of an N-rank iteration.  ``compute_s``: fresher samples (a list) or a fresher
    median (a number; the calibration's samples rescaled to it), for a host whose speed drifts."""
    samples = m.cal.get("compute_samples") or [m.cal["compute_s"]]
    if isinstance(compute_s, (list, tuple)):
        samples = compute_s
    elif compute_s is not None:
        samples = np.asarray(samples, float) * (compute_s / float(np.median(samples)))
    return slowest(samples, n)


def compute_phase(m: Calibrated, n: int, compute_scale: float = 1.0, compute_s=None) -> float:
    """An N-rank iteration before aggregation: the slowest rank's compute (:func:`compute_time`) and the
    runner's two non-finite checks of the gradient (at scale 1)."""
    return (compute_time(m, n, compute_s) * compute_scale
            + 2 * float(op_cost(m.cal["vector"]["finite"], m.struct["numel"], 1.0)))


def iteration(m: Calibrated, name: str, n: int, bps: float, alpha: float = 0.0, codec_scale: float = 1.0,
              compute_scale: float = 1.0, compute_s=None, fraction: float = 1.0, cluster: Cluster = FLAT,
              msg: tuple[float, float] | None = None) -> dict:
    """{compute_s, aggregate_s, iter_s} of one steady-state iteration: the slowest rank's compute, the
    runner's non-finite checks of the gradient (before aggregation and of the aggregate) and the
    aggregator's untimed measurement (both at scale 1), aggregation.  ``compute_s``: see
    :func:`compute_time`; ``cluster``, ``msg``: :func:`aggregation`'s; ``fraction``: the share of the vector
    aggregated (a fragment's: the measurement and :func:`aggregation` of it; a method's syncs are
    :mod:`gvq.predict.sync`'s)."""
    comp = compute_phase(m, n, compute_scale, compute_s)
    meas = m.cal["measure"].get(name, 0.0) * fraction
    agg = aggregation(m, name, n, bps, alpha, codec_scale, msg=msg, fraction=fraction, cluster=cluster)
    return {"compute_s": comp, "measure_s": meas, "aggregate_s": agg, "iter_s": comp + meas + agg}
