"""``python -m gvq.predict utilization``: the link (bit/s per rank) each setting and method needs for a
compute utilization (compute / iteration: 50, 80, 95%) at N ranks, solved from the cost model
(:func:`gvq.predict.sync.needed_bps`), Streaming DiLoCo's Table 4 as gvq prices it.  Data-parallel is
``every_step`` under each aggregator, and, where the calibration has ``overlap.json`` with fp16, DDP's
overlapped hooks on NCCL (``ddp``: fp32; ``fp16``), priced as ``project overlap=true baseline=nccl`` prices
them; DiLoCo and Streaming DiLoCo are their ``methods`` entries.  On a two-level net (``ranks_per_node``
R > 1, :class:`gvq.predict.keys.NodeKeys`) the link solved for is the one between nodes: every_step and
``workers=rank`` methods priced hierarchical, ``workers=node`` ones with the nodes as the workers
(:mod:`gvq.predict.sync`); DDP's rows, a flat ring's, are left out there.  Each row's ``x_dp`` is the first
data-parallel row's link over its own: how many times less bandwidth it needs.

What is measured (the calibration, on its host): compute per iteration and its spread, codec and vector
costs, the CPU of posting a message, backward's profile.  What is projected: N ranks (the rings replayed
at N on those costs, the slowest of N computes), the link, and a method's syncs (:mod:`gvq.predict.sync`).
"""
from __future__ import annotations

import pandas as pd

from gvq.predict import pricing
from gvq.predict import cost_model as M
from gvq.predict import sync as Y
from gvq.predict.keys import ROOT_DIR, cluster_of
from gvq.schema.tool import namespace


def solve(util_of, targets) -> dict:
    """{"<target>": bit/s} for each utilization target: the slowest link reaching it (NaN: none does)."""
    return {f"{t:g}": Y.needed_bps(util_of, t) for t in targets}


def model_rows(m: M.Calibrated, aggregators, methods, n: int, targets, scales, alpha=0.0, codec=1.0,
               cluster=M.FLAT) -> list[dict]:
    """A row per (compute scale, aggregator, method): its link per target (between nodes on a two-level
    ``cluster``), from the cost model."""
    out = []
    for c in scales:
        for a in aggregators:
            for meth in methods:
                sync = Y.of_method(meth)

                def util(bps, a=a, sync=sync, c=c):
                    it = Y.method_iteration(m, a, n, bps, sync, alpha, codec, c, cluster=cluster)
                    return it["compute_s"] / it["iter_s"]
                out.append({"compute_scale": c, "setting": Y.named(a, meth), "every": sync.every,
                            "fragments": sync.fragments, "delay": sync.delay, "workers": sync.workers,
                            **solve(util, targets)})
    return out


def ddp_rows(folder, m: M.Calibrated, n: int, targets, scales, alpha=0.0) -> tuple[list[dict], str]:
    """DDP's overlapped hooks on NCCL (:class:`gvq.predict.nccl.Nccl`), where ``overlap.json`` and fp16 are
    calibrated: its rows, and a line saying what priced them or why there are none."""
    from gvq.predict import nccl
    from gvq.predict.overlap import Overlap
    if "fp16" not in m.aggregators or not (folder / "overlap.json").is_file():
        return [], ("data-parallel overlapped (DDP on NCCL) left out: needs fp16 calibrated and overlap.json "
                    f"(python -m gvq.predict calibrate-overlap --calibration {folder})")
    ov, base = Overlap.load(folder), nccl.Nccl(nccl.load_codec(), alpha)
    out = []
    for c in scales:
        for name in ("ddp", "fp16"):
            def util(bps, name=name, c=c):
                return ov.phases(n, c).total / base.iteration(ov, name, n, bps, c)["iter_s"]
            out.append({"compute_scale": c, "setting": f"{name} overlap (nccl)", "every": 1, "fragments": 1,
                        "delay": 0, "workers": "rank", **solve(util, targets)})
    return out, base.describe()


def with_ratios(rows: list[dict], targets) -> pd.DataFrame:
    """Gbit/s per target, and ``x_dp``: the first data-parallel row's link over each row's, per scale."""
    df = pd.DataFrame(rows)
    keys = [f"{t:g}" for t in targets]
    for k in keys:
        df[k] = df[k] / 1e9
        dp = df[df["every"] == 1].groupby("compute_scale")[k].first()
        df[f"x_dp@{k}"] = df["compute_scale"].map(dp) / df[k]
    return df


def check_world(m: M.Calibrated, n: int, cluster) -> None:
    """A one-line refusal unless N's rings (N / R across nodes of R ranks) are in the calibrated structure."""
    per = cluster.ranks_per_node
    if M.nodes_of(n, cluster) not in m.world_sizes:
        what = f"world_size={n}" if per == 1 else f"{n // per} nodes (world_size={n} as {n // per} x {per})"
        raise M.PredictError(f"{what}: not in the calibrated structure (have {m.world_sizes})")


def predict_utilization(cfg, paths) -> pd.DataFrame:
    """``python -m gvq.predict utilization``: the table (Gbit/s per target), what is measured and projected."""
    args = namespace(cfg, paths)
    if not all(0 < t < 1 for t in args.utilization):
        raise M.PredictError(f"utilization={args.utilization}: each a share of the iteration, 0 < u < 1")
    folder = args.calibration or ROOT_DIR / args.model
    m, priced = pricing.as_keys_price(M.Calibrated.load(folder), args, args.aggregators)
    cluster = cluster_of(args)
    check_world(m, args.world_size, cluster)
    rows = model_rows(m, args.aggregators, args.methods, args.world_size, args.utilization, args.compute_scale,
                      args.latency, args.codec_scale, cluster)
    extra, line = ddp_rows(folder, m, args.world_size, args.utilization, args.compute_scale, args.latency) \
        if cluster.flat else ([], "DDP on NCCL (a flat ring) left out on nodes")
    df = with_ratios(extra + rows, args.utilization)
    comp = M.compute_time(m, args.world_size)
    print(f"# Gbit/s per rank for each compute utilization at N = {args.world_size} (NaN: out of reach; x_dp: "
          f"the first data-parallel row's link / this one's)")
    print(f"# measured ({m.cal['model']}, batch {m.cal['batch_size']}, on {m.cal['host']}): compute "
          f"{m.cal['compute_s'] * 1e3:.2f} ms median, {comp * 1e3:.2f} ms the slowest of {args.world_size}; "
          f"{priced}; posting {m.cal['msg'][0] * 1e6:.1f} us + {m.cal['msg'][1] * 1e9:.2f} ns/byte a message")
    nodes = "" if cluster.flat else (f" as {args.world_size // cluster.ranks_per_node} nodes x "
                                     f"{cluster.ranks_per_node} ({cluster.intra_bandwidth_bps:g} bit/s, "
                                     f"{cluster.intra_latency_s:g} s inside a node; the link solved: between nodes)")
    print(f"# projected: N = {args.world_size}{nodes}, the links, each method's syncs; {line}")
    print(df.to_markdown(index=False, floatfmt=".3g"))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.out, index=False)
    return df

