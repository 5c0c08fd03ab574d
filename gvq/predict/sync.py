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

Not priced: the outer step's few vector passes (Δ, Nesterov on the fp32 copy, the reset: well under a
gradient's aggregation), local SGD's every-step start (``start_iter``; a steady state is priced), and an
overlapped sync's codec work competing with compute for a core (only its time on the link hides).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from gvq.predict import cost_model as M
from gvq.predict.table import traffic
from gvq.schema.compose import compose
from gvq.schema.errors import ConfigError
from gvq.schema.setting import canonical_named, split_name


@dataclass(frozen=True)
class Sync:
    every: int = 1               # H: iterations over which the whole vector is synced once
    fragments: int = 1           # P: a sync moves 1/P of it, every H/P iterations
    delay: int = 0               # tau: iterations of compute a sync overlaps

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
    s = Sync(int(cfg.get("every", 1)), int(cfg.get("fragments", 1)), int(cfg.get("delay", 0)))
    if not (s.every >= s.fragments >= 1 and s.delay >= 0):
        raise M.PredictError(f"methods: {name!r}: needs every >= fragments >= 1 and delay >= 0")
    return s


def method_iteration(m: M.Calibrated, name: str, n: int, bps: float, sync: Sync = Sync(), alpha: float = 0.0,
              codec_scale: float = 1.0, compute_scale: float = 1.0, compute_s=None) -> dict:
    """:func:`gvq.predict.cost_model.iteration` under ``sync``: ``measure_s`` and ``aggregate_s`` per
    iteration (amortized over the period; one sync's own aggregation ``sync_s``, ``exposed_s`` of it);
    ``iter_s`` = their sum with compute, so every_step's is today's."""
    it = M.iteration(m, name, n, bps, alpha, codec_scale, compute_scale, compute_s, sync.fraction)
    exposed = sync.exposed(it["aggregate_s"], it["compute_s"])
    meas, agg = it["measure_s"] / sync.period, exposed / sync.period
    return {"compute_s": it["compute_s"], "measure_s": meas, "aggregate_s": agg, "iter_s": it["compute_s"] + meas + agg,
            "sync_s": it["aggregate_s"], "exposed_s": exposed}


def named(aggregator: str, method: str) -> str:
    """A setting's name with its method, as the report's :attr:`Run.named` and keyed as every tool keys it."""
    return canonical_named(" ".join(filter(None, (aggregator, method))))


def method_row(m: M.Calibrated, name: str, method: str, n: int, bps: float, alpha: float = 0.0, codec: float = 1.0,
        compute: float = 1.0) -> dict:
    """One (setting, method) at N ranks and ``bps``: the iteration, bytes a rank sends per iteration
    (amortized), the compute utilization (compute / iteration)."""
    sync = of_method(method)
    it = method_iteration(m, name, n, bps, sync, alpha, codec, compute)
    nbytes, _ = traffic(m, name, n)
    return {"N": n, "link_bps": bps, "compute_scale": compute, "setting": named(name, method), "aggregator": name,
            "method": split_name(method)[0] if method else "every_step", "every": sync.every,
            "fragments": sync.fragments, "delay": sync.delay, **it,
            "MB_per_rank_iter": nbytes * sync.fraction / sync.period / 1e6,
            "utilization": it["compute_s"] / it["iter_s"]}


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


def methods_grid(m: M.Calibrated, names, methods, worlds, links, scales) -> pd.DataFrame:
    """Every (N, link, compute scale, aggregator, method) row (:func:`method_row`)."""
    rows = [method_row(m, a, meth, n, b, 0.0, 1.0, c) for n in worlds for b in links for c in scales
            for a in names for meth in methods]
    return pd.DataFrame(rows).assign(model=m.cal["model"])


def methods_asked(args) -> list[str]:
    """``project``'s ``methods`` beside every_step alone (none: the projection as before); with
    ``overlap=true``, which prices a sync every step, refused in one line."""
    methods = [] if list(args.methods) == ["every_step"] else list(args.methods)
    if methods and args.overlap:
        raise M.PredictError("gvq.predict project overlap=true prices a sync every step: give methods= without it")
    for meth in methods:
        of_method(meth)                      # a method or knob the options lack: refused before any work
    return methods


def project_methods(args, pricing, methods, links, scales, at: int = 64) -> pd.DataFrame:
    """``project methods=[...]``: every model's :func:`methods_grid` (its aggregators under each method) to
    ``projection_methods.csv``, and at N = ``at`` (or the largest projected below it) seconds per iteration
    per link and setting, compute x1."""
    frames = []
    for model in args.models:
        m, _ = pricing(M.Calibrated.load(M.calibration_folder(args.calibration, model)))
        worlds = [n for n in m.world_sizes if n & (n - 1) == 0 and n <= args.max_world_size]
        frames.append(methods_grid(m, args.aggregators or m.aggregators, methods, worlds, links, scales))
    full = pd.concat(frames)
    full.to_csv(args.out / "projection_methods.csv", index=False)
    for model, g in full.groupby("model"):
        n = max([w for w in g["N"].unique() if w <= at] or [g["N"].min()])
        g = g[(g["N"] == n) & (g["compute_scale"] == g["compute_scale"].max())]
        print(f"# {model}, N = {n}: seconds per iteration per setting and method (virtual-time terms, compute "
              f"x1; every N, link and scale in {args.out}/projection_methods.csv)")
        print(g.pivot(index="link_bps", columns="setting", values="iter_s").to_markdown(floatfmt=".4g"))
    return full
