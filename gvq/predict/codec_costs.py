"""Codec costs measured elsewhere (a GPU): the cost model's codec calls priced from ``gvq.bench codecs --out``
JSON files instead of this host's calibration (``python -m gvq.predict ... --codec-costs FILE_OR_DIR``).

A file gives, per codec label, one call's compress / decompress / payload-add milliseconds on a whole
gradient of ``numel`` values, and the floor of the call on that machine (bytes or GEMM work at its
measured ceilings).  A call on a piece of ``v`` values is priced as a line: the part of the measured time
above the floor is fixed per call (on a GPU: launches and dispatch, the same for a piece as for the whole
gradient), the floor scales with the piece (``fixed + floor x v / numel``).  ``implied_rows`` turns op
counts into the same rows (``ops x seconds per op + floor``): what a codec with that many launches would
cost on the machine that measured the seconds per op.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from gvq.predict.cost_model import Calibrated, PredictError
from gvq.schema.tool import Arg

#: the calibration's codec keys (its settings' names, conf/grid/calibration.yaml's) -> gvq.bench codecs
#: labels, where they differ (GradiVeQ bf16 pooled K/d = 8; PowerSGD's two passes are timed as its pass P)
DEFAULT_MAP = {"gradiveq_bf16 pool=true target_ratio=8": "gradiveq_pooled_bf16", "powersgd rank=6-P": "powersgd",
               "powersgd rank=6-Q": "powersgd"}
OPS = ("compress", "decompress", "add")


def load_rows(paths: list[Path], numel: int | None = None) -> dict[str, dict]:
    """label -> {numel, compress_ms, decompress_ms, add_ms, floor_ms, source} from gvq.bench codecs JSON
    files (or folders of them); ``numel``: the gradient size for files that do not record it."""
    files = [f for p in paths for f in (sorted(Path(p).glob("*.json")) if Path(p).is_dir() else [Path(p)])
             if f.exists()]
    if not files:
        raise PredictError(f"--codec-costs {' '.join(map(str, paths))}: no gvq.bench codecs JSON there")
    rows: dict[str, dict] = {}
    for f in files:
        try:
            data = json.loads(f.read_text(), parse_constant=lambda c: float(c))
            found = data["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PredictError(f"--codec-costs {f}: not a gvq.bench codecs --out file ({e})") from None
        for r in found:
            n = r.get("numel", numel)
            if n is None:
                raise PredictError(f"--codec-costs {f}: {r['codec']} does not record its gradient size; give "
                                   "codec_costs_numel=N (ResNet-32, 100 classes: 470004)")
            rows[r["codec"]] = {**{k: float(r.get(k, math.nan)) for k in
                                   ("compress_ms", "decompress_ms", "add_ms", "floor_ms")},
                                "numel": int(n), "source": str(f)}
    return rows


def line(row: dict, op: str) -> list[float] | None:
    """[fixed s, s per value] of ``op`` from a row (None where the row has no figure: add on a
    non-additive codec)."""
    ms = row[f"{op}_ms"]
    if not math.isfinite(ms):
        return None
    floor = row["floor_ms"] if math.isfinite(row["floor_ms"]) else 0.0
    floor = min(floor, ms)
    return [(ms - floor) / 1e3, floor / 1e3 / max(row["numel"], 1)]


def priced_model(m: Calibrated, rows: dict[str, dict], names: list[str], mapping: dict[str, str] | None = None
           ) -> tuple[Calibrated, dict[str, str]]:
    """A copy of ``m`` whose codec calls for aggregators ``names`` cost what ``rows`` say; returns it and
    {calibration key: label} of what was priced.  Every codec those aggregators run must have a row:
    a cost model half on this host, half on another machine would answer for neither."""
    keys = sorted({r["key"] for name in names for rounds in m.struct["aggregators"].get(name, {}).values()
                   for r in rounds if r["kind"] != "plain"})
    mapping = {**DEFAULT_MAP, **(mapping or {})}
    out, used = copy.copy(m), {}
    out.cal = {**m.cal, "codecs": dict(m.cal["codecs"])}
    out.cache = {}
    for key in keys:
        label = mapping.get(key, key)
        if label not in rows:
            raise PredictError(f"--codec-costs: no measurement for codec {key!r} (label {label!r}); measured: "
                               f"{', '.join(sorted(rows))}; map it with codec_map=[{key}=LABEL] or leave its "
                               "aggregator out (aggregators=[...])")
        own = {op: line(rows[label], op) for op in OPS}
        out.cal["codecs"][key] = {op: c for op, c in own.items() if c is not None}
        if "add" not in out.cal["codecs"][key] and "add" in m.cal["codecs"][key]:
            out.cal["codecs"][key]["add"] = m.cal["codecs"][key]["add"]      # a payload sum: one kernel
        if "hop" in m.cal["codecs"][key]:                # decode + add + encode, priced as the two calls
            c, d = own["compress"], own["decompress"]
            out.cal["codecs"][key]["hop"] = [c[0] + d[0], c[1] + d[1]]
        used[key] = label
    out.struct = {**m.struct, "aggregators": {n: m.struct["aggregators"][n] for n in names}}
    out.cal["measure"] = dict(m.cal["measure"])
    for name in names:                 # a compressor's error metric is one whole-gradient round trip
        if used.get(name) is not None and m.cal["measure"].get(name, 0) > 0:
            c, d = (line(rows[used[name]], op) for op in ("compress", "decompress"))
            out.cal["measure"][name] = c[0] + d[0] + (c[1] + d[1]) * m.struct["numel"]
    return out, used


def parse_map(pairs: list[str]) -> dict[str, str]:
    """``KEY=LABEL`` pairs (``codec_map``; KEY a calibration's codec key, ``powersgd rank=6-P``), refused in
    one line where malformed."""
    out = {}
    for pair in pairs:
        key, sep, label = pair.rpartition("=")        # a key is a setting's name: '=' in it
        if not sep or not key or not label:
            raise PredictError(f"codec_map {pair!r}: expected KEY=LABEL (e.g. gradiveq_bf16=gradiveq_pooled)")
        out[key] = label
    return out


def implied_rows(measured: dict[str, dict], counts: dict[str, tuple[int, int]], us_per_op: float) -> dict:
    """Rows a codec making ``counts[label]`` = (compress ops, decompress ops) launches a call would have
    on the machine of ``measured`` (its floors and payload adds kept): ops x ``us_per_op`` + floor."""
    out = {}
    for label, (c_ops, d_ops) in counts.items():
        if label not in measured:
            continue
        r = measured[label]
        floor = r["floor_ms"] if math.isfinite(r["floor_ms"]) else 0.0
        out[label] = {**r, "compress_ms": c_ops * us_per_op / 1e3 + floor,
                      "decompress_ms": d_ops * us_per_op / 1e3 + floor,
                      "source": f"{c_ops} + {d_ops} ops x {us_per_op:g} us + floor, from {r['source']}"}
    return out


def seconds_per_op(measured: dict[str, dict], counts: dict[str, tuple[int, int]]) -> float:
    """The median microseconds per op over codecs measured with ``counts`` ops (launch-bound calls:
    time above the floor / ops)."""
    per = sorted((r["compress_ms"] + r["decompress_ms"] - 2 * (r["floor_ms"] if math.isfinite(r["floor_ms"]) else 0))
                 * 1e3 / sum(counts[k]) for k, r in measured.items() if k in counts and sum(counts[k]))
    if not per:
        raise PredictError("--codec-costs: no codec has both a measurement and an op count")
    return per[len(per) // 2]


@dataclass
class CodecCostKeys:
    """The keys of every ``gvq.predict`` command that prices codecs (the files: ``--codec-costs``)."""
    # --codec-costs: gradient size of files that do not record it
    codec_costs_numel: Optional[int] = None
    # --codec-costs: calibration codec -> measured label, KEY=LABEL (defaults: DEFAULT_MAP)
    codec_map: List[str] = field(default_factory=list)
    # --codec-costs: price each codec at its device-path op count (counted here) x this many microseconds +
    # the measured floor, instead of the measured time; higher => dearer codecs
    codec_ops_us: Optional[float] = None


#: the files ``--codec-costs`` reads: `gvq.bench codecs --out` files (e.g. measured on a GPU), instead of this
#: host's calibration
CODEC_COSTS = Arg("--codec-costs", "gvq.bench codecs --out files (JSON or a folder) pricing the codec calls "
                  "instead of this host's calibration", nargs="+")


def apply(m: Calibrated, args, names: list[str] | None = None) -> tuple[Calibrated, str]:
    """``m`` priced as the flags ask (itself where no --codec-costs), and one line saying how."""
    if not args.codec_costs:
        return m, "codecs: this host's calibration"
    names = list(names or m.aggregators)
    rows = load_rows(args.codec_costs, args.codec_costs_numel)
    how = "measured"
    if args.codec_ops_us is not None:
        from gvq.bench.codecs import codec_ops
        from gvq.bench.common import model_shapes
        shapes = model_shapes(m.cal["model"], m.cal["num_classes"])
        rows = implied_rows(rows, {label: codec_ops(label, shapes) for label in rows}, args.codec_ops_us)
        how = f"implied: device-path ops x {args.codec_ops_us:g} us + floor"
    out, used = priced_model(m, rows, names, parse_map(args.codec_map))
    sources = sorted({rows[label]["source"] for label in used.values()})
    return out, (f"codecs priced from --codec-costs ({how}): "
                 + ", ".join(f"{k}={v}" for k, v in sorted(used.items())) + f" [{'; '.join(sources)[:300]}]")
