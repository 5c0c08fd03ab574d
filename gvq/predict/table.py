"""``python -m gvq.predict`` (the table), ``validate`` and ``validate-overlap``: predicted aggregation and
iteration times per aggregator from a calibration, and the model against benchmarks.  ``bound`` says what
dominates a row: compute, bandwidth (bytes / B), latency (messages x (alpha + posting)) or codec (the rest of
the aggregation)."""
from __future__ import annotations


import pandas as pd

from gvq.predict import codec_costs
from gvq.predict import cost_model as M
from gvq.predict import schedule as S
from gvq.predict.keys import ROOT_DIR, cluster_of
from gvq.predict.qgz import round_traffic
from gvq.schema.tool import namespace



def traffic(m: M.Calibrated, name: str, n: int) -> tuple[float, int]:
    """(bytes a rank sends on average, messages it sends) per aggregation, from the ring structure."""
    nbytes, msgs = 0.0, 0
    for rnd in m.struct["aggregators"][name][str(n)]:
        total = sum(sum(b) for b in rnd["bytes"])
        pieces = sum(1 for seg in rnd["bytes"] for b in seg if b > 0)
        if rnd["kind"] == "qgz":                       # the flat all-to-alls: every byte on the one link
            got = round_traffic(rnd, 1, n)
            nbytes, msgs = nbytes + got["sent"], msgs + round(got["inter_msgs"])
        elif rnd["kind"] == "sparse":                   # per hop: the disjoint-support bound
            b, k = S.sparse_traffic(M.sparse_kept(rnd), [sum(v) for v in rnd["vals"]], n)
            nbytes, msgs = nbytes + b, msgs + k
        elif rnd["kind"] == "allgather":                # every payload forwarded N - 1 times
            nbytes, msgs = nbytes + (n - 1) * total, msgs + n - 1
        elif rnd["kind"] == "ps":                     # N - 1 up, N - 1 down, averaged over ranks
            nbytes, msgs = nbytes + 2 * (n - 1) / n * total, msgs + 2 * (n - 1) // n
        else:
            nbytes += 2 * (n - 1) / n * total
            msgs += 2 * (n - 1) * pieces // max(n, 1)
    return nbytes, msgs


def row(m: M.Calibrated, name: str, n: int, bps: float, alpha: float, codec: float, compute: float,
        cluster=M.FLAT) -> dict:
    """One cell; on nodes of several ranks (``cluster``) ``link_bps`` and ``MB_per_rank`` are the
    inter-node link's, ``MB_intra_per_rank`` the node's (:func:`node_traffic`)."""
    it = M.iteration(m, name, n, bps, alpha, codec, compute, cluster=cluster)
    per, pos = cluster.ranks_per_node, m.cal["msg"][0]
    nbytes, msgs, intra, intra_msgs = node_traffic(m, name, n, per)
    parts = {"compute": it["compute_s"], "bandwidth": 8 * nbytes / bps,
             "latency": msgs * (alpha + 2 * pos)}                             # a send and a receive posted
    node = {}
    if per > 1:
        parts["bandwidth"] += 8 * intra / cluster.intra_bandwidth_bps
        parts["latency"] += intra_msgs * (cluster.intra_latency_s + 2 * pos)
        node = {"ranks_per_node": per, "MB_intra_per_rank": intra / 1e6}
    parts["codec"] = max(it["aggregate_s"] - parts["bandwidth"] - parts["latency"], 0.0) + it["measure_s"]
    return {"N": n, "link_bps": bps, "compute_scale": compute, "aggregator": name, **it,
            "MB_per_rank": nbytes / 1e6, **node, "bound": max(parts, key=parts.get)}


def node_traffic(m: M.Calibrated, name: str, n: int, per: int) -> tuple[float, float, float, float]:
    """(bytes a rank sends between nodes, messages; bytes inside its node, messages), averaged over ranks, on
    nodes of ``per`` ranks: a ring's as the hierarchical all-reduce runs it (its ring across the M nodes on
    1/R of the vector, an fp32 reduce-scatter and all-gather of R shards inside), qgZ's its all-to-alls'
    (:func:`gvq.predict.qgz.round_traffic`; one rank a node: every byte between nodes, as the run logs it)."""
    rounds = m.struct["aggregators"][name][str(n // per)]
    if any(r["kind"] == "qgz" for r in rounds):
        got = [round_traffic(r, per, n // per) for r in rounds]
        inter = sum(g["inter"] for g in got)
        return inter, sum(g["inter_msgs"] for g in got), sum(g["sent"] for g in got) - inter, \
            sum(g["intra_msgs"] for g in got)
    nbytes, msgs = traffic(m, name, n // per)
    if per == 1:
        return nbytes, msgs, 0.0, 0
    return nbytes / per, msgs, 2 * (per - 1) / per * 4 * m.struct["numel"], 2 * (per - 1)


def table(m: M.Calibrated, names, worlds, links, alpha=0.0, codec=1.0, computes=(1.0,), cluster=M.FLAT) -> pd.DataFrame:
    df = pd.DataFrame([row(m, a, n, b, alpha, codec, c, cluster) for n in worlds for b in links for c in computes
                       for a in names])
    keys = ["N", "link_bps", "compute_scale"]
    base = df[df["aggregator"] == "rar"].set_index(keys)["iter_s"].rename("_rar")
    df = df.join(base, on=keys)
    df["speedup_vs_rar"] = df["_rar"] / df["iter_s"]
    return df.drop(columns="_rar")



def predict_table(cfg, paths) -> pd.DataFrame:
    """``python -m gvq.predict``: the predicted table, a row per N x link x compute scale x aggregator."""
    args = namespace(cfg, paths)
    m = M.Calibrated.load(args.calibration or ROOT_DIR / args.model)
    m, priced = codec_costs.apply(m, args, args.aggregators)
    cluster = cluster_of(args)
    df = table(m, args.aggregators or m.aggregators, args.world_size, args.bandwidth, args.latency,
               args.codec_scale, args.compute_scale, cluster)
    nodes = "" if cluster.flat else (f"; nodes of {cluster.ranks_per_node} ranks at {cluster.intra_bandwidth_bps:g} "
                                     "bit/s inside, hierarchical rings, link_bps between nodes")
    print(f"# predicted, virtual-time terms ({m.cal['model']}, batch {m.cal['batch_size']}, codec "
          f"x{args.codec_scale:g}, alpha {args.latency:g} s; calibrated on {m.cal['host']}; {priced}{nodes})")
    print(df.to_markdown(index=False, floatfmt=".4g"))
    return df


def predict_validate(cfg, paths) -> pd.DataFrame:
    """``python -m gvq.predict validate``: the model against virtual-time benchmarks, cell by cell."""
    from gvq.predict import validate
    args = namespace(cfg, paths)
    folder = args.calibration or ROOT_DIR / args.model
    host = validate.host_msg(folder, args.ranks_per_node)
    return validate.report_validation(M.Calibrated.load(folder), args, host)


def predict_validate_overlap(cfg, paths) -> pd.DataFrame:
    """``python -m gvq.predict validate-overlap --bench B.json``: the model (calibrate + calibrate-overlap)
    against `gvq.bench overlap --out` JSONs, per mode."""
    from gvq.predict import validate
    args = namespace(cfg, paths)
    try:
        return validate.report_overlap_validation(args.calibration or ROOT_DIR / args.model, args.bench, args)
    except (ValueError, FileNotFoundError) as e:
        raise M.PredictError(f"validate-overlap: {e}") from None
