"""Numbers of runs and groups: per-run means from ``metrics.csv``, mean +- std over a group's seeds,
the matching uncompressed ``rar`` baseline, and the numeric table (``table.csv``)."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from gvq.report.runs import Group, Run, setting_key
from gvq.report.target import as_target, startup_s
from gvq.schema.columns import AMOUNTS


# -- numbers -------------------------------------------------------------------------------------------
def run_stats(run: Run, target) -> dict:
    """One run's numbers, straight from its metrics.csv (summary.json where there is no CSV); ``target``: a
    :class:`gvq.report.target.Target` (a number: test accuracy)."""
    m, s = run.metrics, run.summary
    if m is None or m.empty:
        return {"final_acc": s.get("final_test_acc", np.nan), "aggregate_s": s.get("mean_aggregate_s", np.nan),
                **({"final_bpb": s["final_test_bpb"]} if "final_test_bpb" in s else {})}
    out = {k: m[k].mean() for k in AMOUNTS if k in m}      # every declared time and byte count it logged
    out["iter_s"] = (m["compute_s"] + m["aggregate_s"]).mean()
    evals = m.dropna(subset=["test_acc"]) if "test_acc" in m else m.iloc[:0]
    out["final_acc"] = evals["test_acc"].iloc[-1] if len(evals) else np.nan
    if "test_bpb" in m and m["test_bpb"].notna().any():      # a language model: its held-out bits per byte
        out["final_bpb"] = m["test_bpb"].dropna().iloc[-1]
    hit = evals[as_target(target).reached(evals)]
    out["target_s"] = hit["wall_s"].iloc[0] - startup_s(m) if len(hit) else np.nan
    out["target_iters"] = hit["iteration"].iloc[0] + 1 if len(hit) and "iteration" in hit else np.nan
    # the logged compression_ratio (a codec's own, per iteration) is not averaged here: the report's
    # compression ratio is one quantity, from bytes_sent and a rar baseline (build_table)
    for col in ("compression_error", "aggregate_error"):   # absent: not logged by the run
        if col in m and m[col].notna().any():
            out[col] = m[col].mean()
    if "compression_error" in out:          # heavy-tailed (GradiVeQ's Eq. 7 loss): the median too
        out["error_median"] = m["compression_error"].median()
    return out


def _mean_std(values: list) -> tuple[float, float]:
    v = np.array([x for x in values if x is not None and not np.isnan(x)], dtype=float)
    if not len(v):
        return np.nan, np.nan
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else np.nan


def group_stats(g: Group, target: float) -> dict:
    per = [run_stats(r, target) for r in g.runs]
    keys = sorted({k for p in per for k in p})
    out = {}
    for k in keys:
        out[k], out[k + "_std"] = _mean_std([p.get(k, np.nan) for p in per])
    out["reached"] = sum(not np.isnan(p.get("target_s", np.nan)) for p in per)
    return out


def baseline_for(g: Group, groups: list[Group], stats: dict) -> dict | None:
    """Pooled means of the completed every-step rar runs sharing ``g``'s setting and how many there are
    (``runs``); None if there are none.  A method that syncs less often is compared with rar every step
    (its own rar runs would make every ratio 1)."""
    want = {setting_key(r.config) for r in g.runs}
    rar = [h for h in groups if h.aggregator == "rar" and h.status == "completed"
           and not any(r.method for r in h.runs) and {setting_key(r.config) for r in h.runs} == want]
    if not rar:
        return None
    weights = [len(h.runs) for h in rar]
    return {"runs": sum(weights), **{k: np.average([stats[id(h)].get(k, np.nan) for h in rar], weights=weights)
                                     for k in ("aggregate_s", "iter_s", "bytes_sent")}}


def compression_ratio(base: dict | None, s: dict) -> float:
    """The report's one compression ratio: the rar baseline's mean bytes a rank sends per iteration over the
    group's (both ``bytes_sent``, every hop of the ring counted alike); NaN where there is no baseline or
    no bytes, never another quantity in its place."""
    sent = s.get("bytes_sent", np.nan)
    return base["bytes_sent"] / sent if base and sent > 0 else np.nan


def run_statuses(runs: list[Run]) -> str:
    """The runs' statuses in summary.json's words (``collapsed``; ``completed 1/2, collapsed 1/2`` where
    seeds differ), the most common first."""
    counts = Counter(r.status for r in runs)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{status} {n}/{len(runs)}" for status, n in counts.most_common())


def build_table(groups: list[Group], stats: dict) -> pd.DataFrame:
    """The numeric table (one row per group; ``stats``: id(group) -> group_stats): ``table.csv``.
    ``status``: the group's (a seed at chance trained every iteration: completed), ``run_status`` its
    runs' own (summary.json's words); ``reason`` the first run's (each run's is in its summary.json),
    ``reasons`` how many distinct ones its runs gave."""
    rows = []
    for g in groups:
        s, base = stats[id(g)], baseline_for(g, groups, stats)
        reasons = list(dict.fromkeys(r.reason for r in g.runs if r.reason))     # distinct, the first seed's first
        done = g.status == "completed"
        rows.append({
            "group": g.label, "aggregator": g.aggregator, "setting_name": g.runs[0].named,
            "variant": g.runs[0].variant, "runs": len(g.runs), "status": g.status,
            "run_status": run_statuses(g.runs), "collapsed": g.collapsed,
            "clock": g.clock,
            "reason": reasons[0] if reasons else "", "reasons": len(reasons),
            "final_top1": s.get("final_acc") if done else np.nan,
            "final_top1_std": s.get("final_acc_std") if done else np.nan,
            "final_bpb": s.get("final_bpb", np.nan) if done else np.nan,
            "final_bpb_std": s.get("final_bpb_std", np.nan) if done else np.nan,
            "time_to_target_s": s.get("target_s", np.nan), "time_to_target_s_std": s.get("target_s_std", np.nan),
            "reached": f"{s['reached']}/{len(g.runs)}",
            "iters_to_target": s.get("target_iters", np.nan), "iters_to_target_std": s.get("target_iters_std", np.nan),
            "aggregate_s_per_iter": s.get("aggregate_s", np.nan),
            "aggregation_speedup": base["aggregate_s"] / s["aggregate_s"] if base else np.nan,
            "iteration_s": s.get("iter_s", np.nan),
            "iteration_speedup": base["iter_s"] / s["iter_s"] if base and "iter_s" in s else np.nan,
            "bytes_per_iter": s.get("bytes_sent", np.nan), "compression_ratio": compression_ratio(base, s),
            # an all-gather receives N - 1 payloads where a ring receives what it sends: both sides of the wire
            "bytes_received_per_iter": s.get("bytes_received", np.nan),
            "baseline_runs": base["runs"] if base else 0,
            "compression_error": s.get("compression_error", np.nan),
            "compression_error_median": s.get("error_median", np.nan),
            "aggregate_error": s.get("aggregate_error", np.nan),
            "aggregate_error_std": s.get("aggregate_error_std", np.nan),
            "run_dirs": " ".join(str(r.path) for r in g.runs)})
    return pd.DataFrame(rows)


