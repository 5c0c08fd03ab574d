"""``python -m gvq.predict validate``: the model against virtual-time benchmarks, cell by cell.

For every world size and link: ``gvq.bench aggregate net.clock=virtual`` (aggregation, the slowest rank,
median of repetitions) and ``gvq.bench train net.clock=virtual compressed_only=true`` (whole
iterations) with the calibration's model, batch and aggregator settings, run as subprocesses; then the
model's figure for the same cell and the ratio model / measured.  The compute step is re-timed on one
quiet rank just before and after each ``bench train`` (``compute_now_s``: the calibration's own
samples, taken again because this host's speed drifts; the model takes the slowest of N from them);
nothing is adjusted to the outcome.

With ``ranks_per_node`` R > 1 (:class:`gvq.predict.keys.NodeKeys`) every cell is N = M x R ranks on nodes
of R: ``bench aggregate`` runs every aggregator as ``aggregator.topology=hierarchical`` on the same
``net.ranks_per_node`` and intra links, ``link_bps`` the links between nodes, and the model prices it as
two levels (:func:`gvq.predict.cost_model.replay_two_level`); qgZ (``aggregator=qgz``) runs as it is, its
all-to-alls inside, then across nodes (:mod:`gvq.predict.qgz`); ``bench train``'s whole iterations run on the
same nodes and rings.
"""
from __future__ import annotations

import json
import statistics

import pandas as pd

from gvq.bench.common import run_bench
from gvq.comm.links import Cluster
from gvq.predict import cost_model as M
from gvq.predict.project_names import calibrated_name, uncalibrated
from gvq.predict.structure import SETTINGS


def _virtual_bench(sub: str, keys: list[str]) -> list[dict]:
    return run_bench(sub, [*keys, "net.clock=virtual", "timeout=900"])   # 16 ranks on 2 cores: slow fits


def measure(m: M.Calibrated, names: list[str], worlds: list[int], links: list[float], reps: int,
            iters: int, cluster: Cluster = M.FLAT) -> list[dict]:
    """One record per (N, B, aggregator): measured aggregate_s (bench aggregate) and iter_s (bench train),
    each under its calibrated name (the benches time options with the calibration's ``set``: ``powersgd``
    there is the calibrated ``powersgd rank=6``); on nodes of several ranks (``cluster``) both benches run
    the hierarchical rings."""
    from gvq.predict.structure import calibrated_entries
    cal, cells = m.cal, {}
    name_of = {e: n for n, e in calibrated_entries(cal, m.struct).items() if n in names}
    common = [f"model={cal['model']}", f"num_classes={cal['num_classes']}",
              f"grid.set={json.dumps(cal.get('settings', SETTINGS) + node_set(cluster, m, name_of))}",
              f"grid.settings={json.dumps(list(name_of))}", "warmup=2"]
    for n in worlds:
        for r in _virtual_bench("aggregate", [f"grid.world_sizes=[{n}]", f"grid.links_bps={json.dumps(links)}",
                                              f"reps={reps}", *common, *node_keys(cluster)]):
            cells[(n, float(r["bandwidth_bps"]), name_of[r["aggregator"]])] = {"aggregate_s": r["median_s"]}
    _measure_iterations(cal, cells, name_of, worlds, links, iters, [*common, *node_keys(cluster)])
    return [{"N": n, "link_bps": b, "aggregator": a, **v} for (n, b, a), v in sorted(cells.items())]


def _measure_iterations(cal: dict, cells: dict, name_of: dict, worlds, links, iters: int, common) -> None:
    """``bench train``'s whole iterations into ``cells``, with the compute re-timed around each link's run."""
    from gvq.predict.structure import calibrated_shape
    for b in links:
        before = _compute_now(cal)                     # samples before and after: the drift averaged
        recs = _virtual_bench("train", [f"grid.world_sizes={json.dumps(worlds)}", f"grid.links_bps=[{b}]",
                                        f"iters={iters}", "compressed_only=true", f"batch_size={cal['batch_size']}",
                                        f"input_shape={json.dumps(list(calibrated_shape(cal)))}", *common])
        now = sorted(before + _compute_now(cal))
        for r in recs:
            cells.setdefault((int(r["N"]), float(b), name_of[r["aggregator"]]), {}).update(
                iter_s=r["iter_s"], bench_compute_s=r["compute_s"], compute_now_s=statistics.median(now),
                compute_samples=now)


def node_set(cluster: Cluster, m: M.Calibrated, name_of: dict[str, str]) -> list[str]:
    """``grid.set`` entries of a cluster's cells where a node holds several ranks: the rings of every option of
    ``name_of`` (option -> calibrated name) hierarchical, each scoped to its option (qgZ, whose all-to-alls are
    two-level already, has no topology)."""
    if cluster.flat:
        return []
    return [f"{o}:aggregator.topology=hierarchical" for o, name in name_of.items()
            if all(r["kind"] != "qgz" for r in next(iter(m.struct["aggregators"][name].values())))]


def node_keys(cluster: Cluster) -> list[str]:
    """``gvq.bench aggregate``'s ``net`` keys placing its ranks on ``cluster``'s nodes (none on a flat net)."""
    if cluster.flat:
        return []
    return [f"net.ranks_per_node={cluster.ranks_per_node}", f"net.intra_bandwidth_bps={cluster.intra_bandwidth_bps}",
            f"net.intra_latency_s={cluster.intra_latency_s}"]


def _compute_now(cal: dict) -> list[float]:
    """The calibration's compute samples (one quiet rank) taken again now: a shared machine's speed
    drifts over minutes, by more than the model's error."""
    import torch

    from gvq.predict.calibrate import compute
    from gvq.predict.structure import calibrated_shape
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                    # as calibrate and every rank: one intra-op thread
    try:
        return compute(cal["model"], cal["batch_size"], cal["num_classes"], shape=calibrated_shape(cal))
    finally:
        torch.set_num_threads(threads)


def host_msg(folder, ranks_per_node: int = 1) -> dict[int, tuple[float, float]]:
    """N -> [fixed, per byte] seconds a message costs with N ranks sharing this host's cores, as
    ``calibrate-overlap host_ranks=[...]`` timed them (``overlap.json``): on flat rings (``host_msg``), or on
    nodes of ``ranks_per_node`` on the hierarchical rings (``host_msg_nodes``, ``host_ranks_per_node``); a
    flat ring's figure never stands for a hierarchical one's.  Empty without."""
    from pathlib import Path
    path = Path(folder) / "overlap.json"
    got = json.loads(path.read_text()) if path.exists() else {}
    got = got.get("host_msg", {}) if ranks_per_node == 1 else got.get("host_msg_nodes", {}).get(str(ranks_per_node), {})
    return {int(n): tuple(c) for n, c in got.items()}


def compare(m: M.Calibrated, measured: list[dict], cluster: Cluster = M.FLAT,
            msg: dict[int, tuple[float, float]] | None = None) -> pd.DataFrame:
    """One row per cell: the measurements, the model's figures (``model_compute_s``: the slowest of N
    ranks' compute from the freshest samples; ``cluster``: on its nodes, messages at ``msg[N]``'s cost
    where given, else the calibration's) and the ratios model / measured."""
    rows = []
    for r in measured:
        r = dict(r)
        samples = r.pop("compute_samples", None)
        it = M.iteration(m, r["aggregator"], r["N"], r["link_bps"], compute_s=samples or r.get("compute_now_s"),
                         cluster=cluster, msg=(msg or {}).get(r["N"]))
        rows.append({**r, "model_compute_s": it["compute_s"], "model_aggregate_s": it["aggregate_s"],
                     "model_iter_s": it["iter_s"],
                     "agg_ratio": it["aggregate_s"] / r["aggregate_s"] if r.get("aggregate_s") else None,
                     "iter_ratio": it["iter_s"] / r["iter_s"] if r.get("iter_s") else None})
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame) -> str:
    ratios = pd.concat([df["agg_ratio"], df["iter_ratio"]]).dropna()
    off = (ratios - 1).abs()
    return (f"{len(ratios)} cells: {int((off <= 0.10).sum())} within 10% ({(off <= 0.10).mean():.0%}), "
            f"{int((off > 0.25).sum())} beyond 25%; ratio range {ratios.min():.2f}-{ratios.max():.2f}")


def report_validation(m: M.Calibrated, args, host: dict[int, tuple[float, float]] | None = None) -> pd.DataFrame:
    """The table, printed; ``host`` (:func:`host_msg` of the same nodes): on nodes of several ranks, each N's
    messages at what N ranks on this host pay on those hierarchical rings where timed (its benchmarks' ranks
    share the host's cores), else the calibration's one-rank cost."""
    from gvq.predict.keys import cluster_of
    from gvq.predict.structure import calibrated_entries
    names = args.aggregators or m.aggregators
    settings = [n for n, e in calibrated_entries(m.cal, m.struct).items() if n in names and ":" in e]
    if settings:                # gvq.bench aggregate and train take options: a setting would run its default
        raise M.PredictError(f"gvq.predict validate: {', '.join(map(repr, settings))}: settings, which the "
                             "benchmarks it runs do not take; validate them with validate-overlap --bench BENCH_JSON")
    cluster = cluster_of(args)
    for n in args.world_size:       # a shape the model cannot price is refused before any benchmark runs
        M.aggregation(m, names[0], n, args.bandwidth[0], cluster=cluster)
    host = {} if cluster.flat else {n: c for n, c in (host or {}).items() if n in args.world_size}
    df = compare(m, measure(m, names, args.world_size, args.bandwidth, args.reps, args.iters, cluster), cluster, host)
    nodes = "" if cluster.flat else (f"; nodes of {cluster.ranks_per_node} ranks at {cluster.intra_bandwidth_bps:g} "
                                     "bit/s inside, hierarchical rings, link_bps between nodes; "
                                     f"messages as N ranks on this host pay them at N={sorted(host) or 'none'}")
    print(f"# model / virtual-time benchmark ({m.cal['model']}, batch {m.cal['batch_size']}{nodes}; ratio 1 = exact)")
    print(df.to_markdown(index=False, floatfmt=".4g"))
    print(summary(df))
    if args.out:
        df.to_csv(args.out, index=False)
    return df


def bench_phases(rec: dict):
    """A ``gvq.bench overlap`` record's own compute-alone figures (the slowest rank, at the cell's compute
    scale, measured in the same spawn, interleaved with every mode) as the model's phases: the host's
    drift lands on the model and the measurement alike."""
    from gvq.predict.overlap import Phases
    return Phases(rec["compute_s"] - rec["backward_s"], rec["backward_s"], rec["alone_s"] - rec["compute_s"])


def overlap_rows(ov, bench: dict, phases: str = "bench", shared: bool = True, host: bool = True) -> pd.DataFrame:
    """One row per record of a ``gvq.bench overlap --out`` JSON whose setting is calibrated (its
    :func:`calibrated_name` among the calibration's; the others are left out, said in one line): the
    measured and the modelled ``iter_s``, ``aggregate_s``, ``exposed_s`` and the ratio model / measured
    of ``iter_s``.  ``phases``: ``bench`` (the record's compute-alone mode) or ``calibration``;
    ``host``: messages cost what N ranks sharing this host's cores pay (the benchmark's ranks did)."""
    codec, rows, left = bench["setting"].get("codec_scale", 1.0), [], {}
    for r in bench["modes"]:
        name = calibrated_name(r.get("setting") or r["aggregator"])
        if name not in ov.m.aggregators:           # never priced at another setting's costs
            left[name] = uncalibrated(name, ov.m.aggregators)
            continue
        ph = bench_phases(r) if phases == "bench" else None
        args = (name, int(r["N"]), r["link_Mbps"] * 1e6, 0.0, codec, r["compute_scale"])
        if not r["overlapped"]:
            got = ov.post_iteration(*args, phases=ph, host=host)
        else:
            cap = "default" if r["bucket_mb"] is None else f"{r['bucket_mb']:g}"
            got = ov.iteration(*args, cap=cap, shared=shared, phases=ph, host=host)
        rows.append({k: r[k] for k in ("N", "link_Mbps", "compute_scale")} | {"aggregator": name}
                    | {k: r[k] for k in ("variant", "iter_s", "aggregate_s", "exposed_s")}
                    | {f"model_{k}": got[k] for k in ("iter_s", "aggregate_s", "exposed_s")}
                    | {"iter_ratio": got["iter_s"] / r["iter_s"], "in_interval": _inside(got["iter_s"], r)})
    if left:
        print(f"gvq.predict validate-overlap: left out: {'; '.join(left.values())}", flush=True)
    return pd.DataFrame(rows)


def _inside(value: float, rec: dict) -> bool | None:
    """Whether ``value`` lies in the record's 95% interval of its median seconds per iteration (None: the
    record has none, e.g. written before the bench kept intervals)."""
    lo, hi = rec.get("iter_lo_s"), rec.get("iter_hi_s")
    return None if lo is None or hi is None else bool(lo <= value <= hi)


def overlap_summary(df: pd.DataFrame) -> str:
    """The share of (cell, aggregator, mode) whose modelled ``iter_s`` is within 10% of the measured,
    those beyond 25%, and the worst."""
    if df.empty:
        return "0 cells: no calibrated aggregator in the benchmark's records"
    off = (df["iter_ratio"] - 1).abs()
    w = df.loc[off.idxmax()]
    known = df["in_interval"].dropna() if "in_interval" in df else pd.Series(dtype=bool)
    inside = f"; {int(known.sum())} of {len(known)} inside the measured 95% interval" if len(known) else ""
    return (f"{len(df)} (cell, aggregator, mode): {int((off <= 0.10).sum())} within 10% ({(off <= 0.10).mean():.0%}), "
            f"{int((off > 0.25).sum())} beyond 25%; worst: {w['aggregator']} {w['variant']} at N={w['N']}, "
            f"{w['link_Mbps']:g} Mbit/s, compute x{w['compute_scale']:.3g}: ratio {w['iter_ratio']:.2f}{inside}")


def report_overlap_validation(folder, bench_jsons, args) -> pd.DataFrame:
    """``python -m gvq.predict validate-overlap --bench BENCH.json ...``: the table over every file's records,
    the summary, ``--out`` CSV."""
    from gvq.predict.overlap import Overlap
    ov = Overlap.load(folder)
    frames = [_validated_file(ov, path, args) for path in bench_jsons]
    df = pd.concat(frames, ignore_index=True)
    print(df.to_markdown(index=False, floatfmt=".4g"))
    print(overlap_summary(df))
    if args.out:
        df.to_csv(args.out, index=False)
    return df


def _validated_file(ov, bench_json, args) -> pd.DataFrame:
    """One ``gvq.bench overlap --out`` file's rows, refused in one line if it measured another job."""
    import json
    bench = json.loads(bench_json.read_text())
    st = bench["setting"]
    from gvq.bench.common import model_workload
    from gvq.predict.structure import calibrated_shape
    # older files: the input the model's config declares
    shape = model_workload(st["model"], st["num_classes"], st.get("input_shape")).sample_shape
    cal = ov.m.cal
    cal_shape = calibrated_shape(cal)
    if (st["model"], st["batch_per_rank"], st["num_classes"], shape) != (
            cal["model"], cal["batch_size"], cal["num_classes"], cal_shape):
        raise ValueError(f"{bench_json}: measured on {st['model']}, batch {st['batch_per_rank']}, "
                         f"{st['num_classes']} classes, inputs {shape}; the calibration is {cal['model']}, batch "
                         f"{cal['batch_size']}, {cal['num_classes']} classes, inputs {cal_shape}")
    print(f"# model / {bench_json} ({st['model']}, batch {st['batch_per_rank']}; phases from the "
          f"{args.overlap_phases}; messages at the {args.overlap_msg}'s cost; bench settings {st['set']} "
          f"{st.get('per_option', {})}, calibration settings {ov.m.cal['settings']}; ratio 1 = exact)")
    return overlap_rows(ov, bench, args.overlap_phases, args.comm_core == "shared", args.overlap_msg == "host")
