"""A method's syncs in the cost model: how often the ranks communicate and how much of the vector a sync
moves, for ``methods=`` of ``python -m gvq.predict project`` and ``utilization``.  A method is written as
its name in a report (``diloco every=100``, :func:`gvq.schema.setting.method_name`); its knobs are read
from its composed config (conf/method/): ``every`` (H; 1 where it has none), ``fragments`` (P; 1),
``delay`` (tau; 0).  Per iteration:

    every_step           one aggregation of the gradient: :func:`gvq.predict.cost_model.iteration`, unchanged
    local_sgd, diloco    one aggregation of the parameter vector (Δ is the gradient's size) every H
                         iterations, blocking: compute + (measure + aggregation) / H, bytes / H
    streaming_diloco     1/P of the vector every H/P iterations, overlapping tau iterations' compute: exposed
                         max(0, aggregation of 1/P - tau x compute) per sync, P/H syncs per iteration

With ``workers=node`` (gvq/methods/nodes.py; on a two-level ``cluster`` of M nodes x R ranks, R >= 2; the
flat net is refused, as the run refuses it) the nodes are the workers:

    every iteration      the gradient's fp32 plain ring over the node's R ranks on the intra links, blocking
                         (``inner_s``; nothing crosses a node)
    every H / P          the aggregator's ring over the M nodes on 1/R of the fragment (rank j of each node
                         sends block j) on the inter links, then the blocks' fp32 all-gather inside the
                         node: one sync of ``sync_s``, exposed and amortized as above

With ``workers=rank`` on a two-level cluster every aggregation is priced hierarchical
(:func:`gvq.predict.cost_model.aggregation`'s ``cluster``).

Not priced: the outer step's few vector passes (Δ, Nesterov on the fp32 copy, the reset: well under a
gradient's aggregation), local SGD's every-step start (``start_iter``; a steady state is priced), and an
overlapped sync's codec work competing with compute for a core (only its time on the link hides).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gvq.predict import cost_model as M
from gvq.predict import schedule as S
from gvq.predict.keys import cluster_of
from gvq.predict.table import traffic
from gvq.schema.compose import compose
from gvq.schema.errors import ConfigError
from gvq.schema.setting import canonical_named, split_name


@dataclass(frozen=True)
class Sync:
    every: int = 1               # H: iterations over which the whole vector is synced once
    fragments: int = 1           # P: a sync moves 1/P of it, every H/P iterations
    delay: int = 0               # tau: iterations of compute a sync overlaps
    workers: str = "rank"        # node: a two-level net's nodes are the workers (see the module docstring)

    @property
    def period(self) -> float:
        """Iterations between two syncs."""
        return self.every / self.fragments

    @property
    def fraction(self) -> float:
        return 1.0 / self.fragments

    def exposed(self, sync_s: float, compute_s: float) -> float:
        """What one sync of ``sync_s`` on the link adds to the iterations it overlaps.  An overlap past the
        next sync's start would hold two syncs on one link at once: at most a period hides it."""
        return max(0.0, sync_s - min(self.delay, self.period) * compute_s)


def of_method(name: str) -> Sync:
    """The syncs of method ``name`` ("" or ``every_step``: each iteration), its knobs composed from
    conf/method/; a method or knob the options lack, or a schedule that cannot run, is refused in one line."""
    if not name:
        return Sync()
    option, pairs = split_name(name)
    try:
        cfg = compose([f"method={option}", *(f"method.{k}={v}" for k, v in pairs)]).method
    except ConfigError as e:
        raise M.PredictError(f"methods: {name!r}: {e}") from None
    s = Sync(int(cfg.get("every", 1)), int(cfg.get("fragments", 1)), int(cfg.get("delay", 0)),
             str(cfg.get("workers", "rank")))
    if not (s.every >= s.fragments >= 1 and s.delay >= 0):
        raise M.PredictError(f"methods: {name!r}: needs every >= fragments >= 1 and delay >= 0")
    return s


def method_iteration(m: M.Calibrated, name: str, n: int, bps: float, sync: Sync = Sync(), alpha: float = 0.0,
              codec_scale: float = 1.0, compute_scale: float = 1.0, compute_s=None, cluster=M.FLAT) -> dict:
    """:func:`gvq.predict.cost_model.iteration` under ``sync``: ``measure_s`` and ``aggregate_s`` per
    iteration (amortized over the period; one sync's own aggregation ``sync_s``, ``exposed_s`` of it;
    ``inner_s``: the every-step averaging inside a node, in ``aggregate_s`` too); ``iter_s`` = their sum
    with compute, so every_step's is today's.  ``cluster``: ``bps`` / ``alpha`` the links between nodes."""
    if sync.workers == "node":
        return node_iteration(m, name, n, bps, sync, alpha, codec_scale, compute_scale, compute_s, cluster)
    it = M.iteration(m, name, n, bps, alpha, codec_scale, compute_scale, compute_s, sync.fraction, cluster)
    return amortized(sync, it["compute_s"], 0.0, it["measure_s"], it["aggregate_s"])


def amortized(sync: Sync, compute_s: float, inner_s: float, measure_s: float, sync_s: float) -> dict:
    """One iteration's terms from a sync's (``measure_s``, ``sync_s``: once a period) and every step's."""
    exposed = sync.exposed(sync_s, compute_s)
    meas, agg = measure_s / sync.period, inner_s + exposed / sync.period
    return {"compute_s": compute_s, "measure_s": meas, "aggregate_s": agg, "iter_s": compute_s + meas + agg,
            "sync_s": sync_s, "exposed_s": exposed, "inner_s": inner_s}


def require_nodes(cluster) -> None:
    """``workers=node``'s one-line refusal of the flat net (nodes of one rank), as the run's."""
    if cluster.ranks_per_node < 2:
        raise M.PredictError("methods: workers=node needs nodes of several ranks: ranks_per_node=1 is the flat "
                             "net (give ranks_per_node=R, or workers=rank)")


def node_workers(n: int, cluster) -> int:
    """M, the nodes of ``workers=node`` at N ranks: a one-line refusal where a node holds one rank (the flat
    net) or the ranks fill no whole nodes."""
    require_nodes(cluster)
    return M.nodes_of(n, cluster)


def node_iteration(m: M.Calibrated, name: str, n: int, bps: float, sync: Sync, alpha: float, codec_scale: float,
                   compute_scale: float, compute_s, cluster) -> dict:
    """:func:`method_iteration` with the nodes as workers (the module docstring): the node's ring every
    step, and a sync = the aggregator across the M nodes on 1/R of the fragment, then its all-gather."""
    nodes, per = node_workers(n, cluster), cluster.ranks_per_node
    share, values = sync.fraction / per, float(m.struct["numel"])
    intra = S.Link(cluster.intra_bandwidth_bps, cluster.intra_latency_s, *m.cal["msg"])
    seg = np.full(per, values / per)
    inner = float(S.plain_ring(4.0 * seg, M.op_cost(m.cal["vector"]["add"], seg, 1.0), intra).max())
    inner += float(M.op_cost(m.cal["vector"]["div"], values, 1.0))
    across = M.aggregation(m, name, nodes, bps, alpha, codec_scale, fraction=share)
    ranks = S.Ranks(per, intra, np.full(per, across))
    S.allgather(ranks, np.full(per, 4.0 * values * share))
    return amortized(sync, M.compute_phase(m, n, compute_scale, compute_s), inner,
                     m.cal["measure"].get(name, 0.0) * share, float(ranks.t.max()))


def bytes_per_rank(m: M.Calibrated, name: str, n: int, sync: Sync, cluster=M.FLAT) -> dict:
    """MB a rank sends per iteration (amortized) per link class: ``MB_per_rank_iter`` between nodes (the
    only class on the flat net), ``MB_intra_per_rank_iter`` inside a node (0 there)."""
    per, values = cluster.ranks_per_node, 4.0 * m.struct["numel"]
    ring = 2 * (per - 1) / per * values                 # an fp32 ring over the node's ranks
    if sync.workers == "node":
        across, _ = traffic(m, name, node_workers(n, cluster))
        inter = across / per * sync.fraction / sync.period
        intra = ring + (per - 1) / per * values * sync.fraction / sync.period      # + the blocks' all-gather
    else:
        across, _ = traffic(m, name, n // per)
        inter = across / per * sync.fraction / sync.period
        intra = ring * sync.fraction / sync.period     # hierarchical: its reduce-scatter and all-gather
    return {"MB_per_rank_iter": inter / 1e6, "MB_intra_per_rank_iter": intra / 1e6}


def named(aggregator: str, method: str) -> str:
    """A setting's name with its method, as the report's :attr:`Run.named` and keyed as every tool keys it."""
    return canonical_named(" ".join(filter(None, (aggregator, method))))


def method_row(m: M.Calibrated, name: str, method: str, n: int, bps: float, alpha: float = 0.0, codec: float = 1.0,
        compute: float = 1.0, cluster=M.FLAT) -> dict:
    """One (setting, method) at N ranks and ``bps`` (between nodes, on a two-level ``cluster``): the
    iteration, bytes a rank sends per iteration per link class (amortized), the compute utilization
    (compute / iteration)."""
    sync = of_method(method)
    it = method_iteration(m, name, n, bps, sync, alpha, codec, compute, cluster=cluster)
    return {"N": n, "link_bps": bps, "compute_scale": compute, "setting": named(name, method), "aggregator": name,
            "method": split_name(method)[0] if method else "every_step", "every": sync.every,
            "fragments": sync.fragments, "delay": sync.delay, "workers": sync.workers, **it,
            **bytes_per_rank(m, name, n, sync, cluster), "utilization": it["compute_s"] / it["iter_s"]}


def needed_bps(utilization, target: float, lo: float = 1e3, hi: float = 1e15, rtol: float = 1e-6) -> float:
    """The slowest link (bit/s) at which ``utilization(bps)`` (non-decreasing in bps, as every schedule
    here is) reaches ``target``: bisection on log B to ``rtol``; NaN where even ``hi`` falls short (a
    codec, measurement or latency floor no link removes), ``lo`` where it is reached at once."""
    if utilization(hi) < target:
        return math.nan
    if utilization(lo) >= target:
        return lo
    while hi / lo > 1 + rtol:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if utilization(mid) >= target else (mid, hi)
    return hi


def methods_grid(m: M.Calibrated, names, methods, worlds, links, scales, cluster=M.FLAT) -> pd.DataFrame:
    """Every (N, link, compute scale, aggregator, method) row (:func:`method_row`)."""
    rows = [method_row(m, a, meth, n, b, 0.0, 1.0, c, cluster) for n in worlds for b in links for c in scales
            for a in names for meth in methods]
    return pd.DataFrame(rows).assign(model=m.cal["model"])


def methods_asked(args) -> list[str]:
    """``project``'s ``methods`` beside every_step alone (none: the projection as before); with
    ``overlap=true``, which prices a sync every step, or ``workers=node`` on the flat net, refused in one
    line."""
    methods = [] if list(args.methods) == ["every_step"] else list(args.methods)
    if methods and args.overlap:
        raise M.PredictError("gvq.predict project overlap=true prices a sync every step: give methods= without it")
    for meth in methods:                     # a method or knob the options lack: refused before any work
        if of_method(meth).workers == "node":
            require_nodes(cluster_of(args))
    return methods


def project_methods(args, pricing, methods, links, scales, at: int = 64) -> pd.DataFrame:
    """``project methods=[...]``: every model's :func:`methods_grid` (its aggregators under each method) to
    ``projection_methods.csv``, and at N = ``at`` (or the largest projected below it) seconds per iteration
    per link and setting, compute x1.  On nodes of R ranks (``ranks_per_node``) N runs over R x the
    calibrated powers of two, the link between nodes."""
    frames, cluster = [], cluster_of(args)
    per = cluster.ranks_per_node            # N = M x R, M nodes in the calibrated structure (as project's grid)
    for model in args.models:
        m, _ = pricing(M.Calibrated.load(M.calibration_folder(args.calibration, model)))
        worlds = [n * per for n in m.world_sizes if n & (n - 1) == 0 and (n > 1 or per == 1)
                  and n * per <= args.max_world_size]
        frames.append(methods_grid(m, args.aggregators or m.aggregators, methods, worlds, links, scales, cluster))
    full = pd.concat(frames)
    full.to_csv(args.out / "projection_methods.csv", index=False)
    for model, g in full.groupby("model"):
        n = max([w for w in g["N"].unique() if w <= at] or [g["N"].min()])
        g = g[(g["N"] == n) & (g["compute_scale"] == g["compute_scale"].max())]
        print(f"# {model}, N = {n}: seconds per iteration per setting and method (virtual-time terms, compute "
              f"x1; every N, link and scale in {args.out}/projection_methods.csv)")
        print(g.pivot(index="link_bps", columns="setting", values="iter_s").to_markdown(floatfmt=".4g"))
    return full
