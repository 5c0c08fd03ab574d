"""What each aggregator's ring sends at N ranks, read off the rings the aggregator itself declares
(``Aggregator.rings``, the ones its ``average`` runs): its rounds (PowerSGD has two), the kind of ring
(:mod:`gvq.comm.ring`'s plain, re-encode, additive, allgather, ps) and, per segment, its pieces' gradient
values and payload bytes (``payload_spec``).  Built once per model by ``calibrate`` (GradiVeQ needs a
fitted basis).  An aggregator that declares no rings is refused in one line, never priced as plain."""
from __future__ import annotations

import torch

from gvq.aggregators.base import RunContext
from gvq.comm.ring_sparse import PAIR_BYTES
from gvq.schema.compose import load_grid
from gvq.schema.setting import Setting

#: what calibrate prices and the overrides its settings start from: conf/grid/calibration.yaml
AGGREGATORS = tuple(load_grid("calibration").settings)
SETTINGS = load_grid("calibration").set
#: the format calibrate writes (``version`` in calibration.json); a file without one is 1, read by
#: :func:`calibrated_entries` and :func:`calibrated_shape`
CALIBRATION_VERSION = 2


def structure_ns() -> list[int]:
    """World sizes stored (the calibration grid's): every N to 16, then doubling to 1024."""
    return load_grid("calibration").world_sizes


def build_on_one_rank(entry: str, model: str, num_classes: int, settings=SETTINGS, in_channels: int | None = None):
    """The calibrated ``entry`` (an option, or a setting ``OPTION:KEY=VALUE[,KEY=VALUE]`` as ``gvq.bench
    overlap grid.settings=[...]`` takes it; its own keys win over ``settings``, make bench's by default) set up
    on one rank of ``model``'s gradient (``in_channels``: its input's, default that of the input the model's
    config declares), GradiVeQ fitted as ``gvq.bench`` fits it; (aggregator, numel)."""
    from gvq.bench.common import build_model, make_aggregator, model_workload
    s = Setting.parse(entry, settings)
    option, overrides = s.option, s.overrides
    net = build_model(model, num_classes, in_channels or model_workload(model, num_classes).in_channels)
    params = [p for p in net.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    agg = make_aggregator(option, list(overrides))
    agg.setup(params, RunContext(rank=0, world_size=1))
    agg.prepare_benchmark([p.grad.clone() for p in params])
    return agg, sum(p.numel() for p in params)


def entries(names, settings=SETTINGS) -> dict[str, str]:
    """Calibrated entries keyed by their names (:attr:`Setting.canonical` of the entry with ``settings``
    applied, as :func:`build_on_one_rank` builds it: ``qsgd bits=2`` for ``qsgd:compressor.bits=2``,
    ``powersgd rank=6`` for ``powersgd`` under the calibration grid's ``set``), the keys of every cost the
    calibration stores; a ValueError for a malformed entry or two entries of one name."""
    out: dict[str, str] = {}
    for entry in names:
        label = Setting.parse(entry, settings).canonical
        if label in out:
            raise ValueError(f"aggregators {entry}: the same setting as {out[label]} ({label!r})")
        out[label] = entry
    return out


def calibrated_entries(cal: dict, struct: dict) -> dict[str, str]:
    """name -> entry of a calibration; one written before settings were calibrated (no ``version``) keyed
    option names, each read as the setting of its option."""
    return cal.get("entries") or {name: name for name in struct["aggregators"]}


def stale_names(cal: dict, struct: dict) -> list[str]:
    """The names of a calibration that hide a value it priced (written before names carried every value
    that differs from the option's defaults: ``powersgd`` for rank 6), each as ``'old' (priced as 'new')``;
    empty for a calibration whose names are :func:`entries`'."""
    named = calibrated_entries(cal, struct)
    now = [Setting.parse(entry, cal.get("settings", ())).canonical for entry in named.values()]
    return [f"{old!r} (priced as {new!r})" for old, new in zip(named, now) if old != new]


def calibrated_workload(cal: dict):
    """The workload a calibration timed: its ``input_shape``; one written before that key timed the input
    its model's config declares."""
    from gvq.bench.common import model_workload
    return model_workload(cal["model"], cal["num_classes"], cal.get("input_shape"))


def calibrated_shape(cal: dict) -> tuple[int, ...]:
    """One input's shape a calibration timed (:func:`calibrated_workload`'s)."""
    return calibrated_workload(cal).sample_shape


def _nbytes(comp, q: slice) -> int:
    dtype, n = comp.payload_spec(q)
    return n * torch.empty(0, dtype=dtype).element_size()


def _round(name: str, ring) -> dict:
    segs = [[s] if isinstance(s, slice) else list(s) for s in ring.segs]
    comp = ring.codec
    return {"kind": ring.kind, "key": f"{name}-{ring.label}" if ring.label else name, "codec": comp,
            "segs": segs, "vals": [[q.stop - q.start for q in seg] for seg in segs],
            "bytes": [[_seg_bytes(ring, q, segs) for q in seg] for seg in segs]}


def _seg_bytes(ring, q: slice, segs: list) -> float:
    """A piece's payload bytes; the sparse ring's: one rank's entries of the segment as 8-byte pairs, the
    whole vector's ``kept`` spread over the segments in proportion to their length (where they land is
    the data's)."""
    if ring.codec is None:
        return (q.stop - q.start) * 4
    if ring.kind != "sparse":
        return _nbytes(ring.codec, q)
    numel = segs[-1][-1].stop
    return PAIR_BYTES * ring.codec.kept(slice(0, numel)) * (q.stop - q.start) / max(numel, 1)


def stored(rnds: list[dict]) -> list[dict]:
    """Rounds as ``structure.json`` and ``overlap.json`` keep them: without the codec and the slices."""
    return [{k: v for k, v in r.items() if k not in ("codec", "segs")} for r in rnds]


def bucket_rounds(name: str, agg, params, n: int) -> list[dict]:
    """The rings option ``name``'s aggregator runs on a vector of ``params`` (positions in model order;
    the hook averages a bucket's parameters sorted) at ``n`` ranks, in order; each round's ``key``
    names its codec's costs in the calibration.  A ValueError (one line) for an aggregator that
    declares none."""
    rings = agg.rings(tuple(sorted(params)), n)
    if rings is None:
        raise ValueError(f"gvq.predict: aggregator {name!r} ({type(agg).__name__}) declares no rings "
                         "(Aggregator.rings): the cost model cannot price it")
    return [_qgz_round(name, r, n) if r.kind == "qgz" else {**_round(name, across_nodes(r, n)), **node_units(r)}
            for r in rings]


def _qgz_round(name: str, ring, n: int) -> dict:
    """qgZ's all-to-alls (:mod:`gvq.comm.alltoall_quant`) as stored: its pieces on ``n`` nodes of one rank (the
    flat all-to-all's, one a segment: what calibrate times; any M x R = N's are of their sizes), its wires, and
    the codec's ``units`` (:func:`gvq.predict.qgz.units`), from which the cost model lays out any M x R
    (:func:`gvq.predict.qgz.layout`).  A ValueError (one line) for a codec whose payload is not the sum of its
    units' at ``n`` (the layout's bytes would not be the wire's)."""
    from gvq.comm.alltoall_quant import shard_pieces
    from gvq.predict.qgz import layout, units
    cuts = list(range(ring.segs + 1)) if isinstance(ring.segs, int) else list(ring.segs)
    size = ring.codec.payload_nbytes
    unit = units(cuts, [size(slice(a, b)) for a, b in zip(cuts, cuts[1:])])
    pieces = shard_pieces(cuts, 1, n)[0]
    rnd = {"kind": "qgz", "key": f"{name}-{ring.label}" if ring.label else name, "codec": ring.codec,
           "segs": [[q] for q in pieces], "vals": [[q.stop - q.start] for q in pieces],
           "bytes": [[size(q)] for q in pieces], "units": unit, "intra": ring.inner, "gather": ring.gather}
    if layout(rnd, 1, n).nbytes[0].tolist() != [b for (b,) in rnd["bytes"]]:
        raise ValueError(f"gvq.predict: {name!r}: its codec's payloads are not the sums of its units' (the spans "
                         "between its cuts): the cost model cannot lay out qgZ's pieces")
    return rnd


def across_nodes(ring, n: int):
    """A ring as stored: a hierarchical one (``aggregator.topology=hierarchical``) as its ring across ``n``
    nodes of one rank on the whole vector (:func:`gvq.comm.hierarchy.inner_ring`: what it runs on a flat
    net), which the cost model prices on nodes of several ranks (``cost_model.replay_two_level``); any
    other as it is."""
    if ring.kind != "hierarchical":
        return ring
    from gvq.comm.hierarchy import inner_ring
    numel = ring.segs if isinstance(ring.segs, int) else ring.segs[-1]
    return inner_ring(ring, slice(0, numel), n)


def node_units(ring) -> dict:
    """``{"units": ...}``: the codec's units (:func:`gvq.predict.qgz.units`, the spans between the cuts
    :func:`gvq.comm.hierarchy.node_shards` cuts a node's shards on: a hierarchical ring's ``segs``, else its
    codec's cuts; every value one for plain values) with their payload bytes, from which the cost model lays
    out the shards and segments of any M x R (:func:`gvq.predict.two_level.shard_rounds`); empty for the
    rings with no hierarchical form priced (sparse, gathers)."""
    if ring.kind not in ("plain", "additive", "reencode", "hierarchical"):
        return {}
    last = ring.segs[-1]
    numel = ring.segs if isinstance(ring.segs, int) else last if isinstance(last, int) else (
        last.stop if isinstance(last, slice) else last[-1].stop)
    cuts = ring.segs if ring.kind == "hierarchical" else numel if ring.codec is None else ring.codec.cuts(numel)
    if isinstance(cuts, int) or ring.codec is None:
        return {"units": [[numel, 1, 4]]} if isinstance(cuts, int) else _units(cuts, lambda q: 4 * (q.stop - q.start))
    return _units(cuts, ring.codec.payload_nbytes)


def _units(cuts: list[int], size) -> dict:
    from gvq.predict.qgz import units
    return {"units": units(list(cuts), [size(slice(a, b)) for a, b in zip(cuts, cuts[1:])])}


def rounds(name: str, agg, n: int) -> list[dict]:
    """:func:`bucket_rounds` of the whole gradient (post-backward aggregation's one vector)."""
    return bucket_rounds(name, agg, agg.everything, n)


def stale_rings(folder) -> tuple[int, list[str]]:
    """The rings stored in a calibration (``structure.json``; ``overlap.json``'s per-bucket rounds where
    present) against the ones the aggregators declare now: (structures compared, those that differ).
    Equal rings price equally, so an empty list says a change of code left the cost model's
    predictions as they were; a difference says to calibrate again."""
    import json
    from pathlib import Path
    folder = Path(folder)
    struct = json.loads((folder / "structure.json").read_text())
    cal = json.loads((folder / "calibration.json").read_text())
    over = json.loads((folder / "overlap.json").read_text()) if (folder / "overlap.json").exists() else None
    total, stale = 0, []
    named = calibrated_entries(cal, struct)
    for name, by_n in struct["aggregators"].items():
        agg, _ = build_on_one_rank(named[name], cal["model"], cal["num_classes"], cal["settings"],
                                   calibrated_workload(cal).in_channels)
        for n, rnds in by_n.items():
            total += 1
            if stored(rounds(name, agg, int(n))) != rnds:
                stale.append(f"{name} at N={n}")
        for cap, entries in (over["buckets"].get(name, {}) if over else {}).items():
            for e in entries:
                for n, rnds in e["rounds"].items():
                    total += 1
                    if stored(bucket_rounds(name, agg, e["params"], int(n))) != rnds:
                        stale.append(f"{name}, {cap} buckets, bucket {e['params'][:3]}..., N={n}")
        if "passes" in struct:
            total += 1
            if struct["passes"][name] != agg.extra_passes():
                stale.append(f"{name}: passes outside its rings")
        agg.close()
    return total, stale


def predict_rings(cfg, paths) -> int:
    """``python -m gvq.predict rings [model=M | --calibration DIR]``: :func:`stale_rings`, printed; exits 1
    when any stored ring differs from the declared one."""
    from pathlib import Path
    args = paths
    torch.set_num_threads(1)
    total, stale = stale_rings(args.calibration or Path("runs/predict") / cfg.model)
    print(f"{total - len(stale)} of {total} stored ring structures equal the rings the aggregators declare")
    for line in stale:
        print(f"  differs: {line}")
    if stale:
        raise SystemExit(1)
    return total
