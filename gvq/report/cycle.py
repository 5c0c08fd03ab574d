"""Times per GradiVeQ cycle, counted as the paper counts them (sec. 4, Fig. 7b): seconds of computation and
of aggregation per ``L_t + L_c`` iterations (500 in the paper), for every run of a sweep, with the paper's
figures beside: ``python -m gvq.report cycle DIR`` writes ``cycle.csv``, ``cycle.md`` and ``cycle.png``.

Counting.  A GradiVeQ run (its ``phase`` column says ``sample`` / ``compress``): its first sampling phase as
logged -- ``L_t - 1`` ordinary sampling iterations (4-bit QSGD-RAR plus storing the sample) at their mean
after ``skip`` start-up iterations, and the ``L_t``-th, whose ``aggregate_s`` holds the PCA refresh too --
plus the compressed phase that follows (``bytes``: every byte sent, the refresh's relay included if
a digest mismatch needed one): summed as logged when the run logged all ``L_c`` of them, else
``L_c`` x their mean (a compressed iteration is stationary: same basis, same bytes, same schedule until the
next refresh).  Any other run: ``L_t + L_c`` x its mean iteration after ``skip``.  Computation is counted the
same way (its mean per iteration does not depend on the phase).  The ``counted`` column says which.
"""
from __future__ import annotations

import math

import pandas as pd

from gvq.report.runs import ReportError, Run, clock_of

PAPER = {   # GradiVeQ paper sec. 4 (CPU: 650 s compute, 850 s vs 162 s aggregation per 500 iterations)
    "cpu": {"RAR aggregation share": 850 / 1500, "RAR / GradiVeQ aggregation": 5.25,
            "QSGD / GradiVeQ aggregation": 2.0, "end-to-end cut vs RAR": 0.46},
    "gpu": {"RAR aggregation share": 0.88, "RAR / GradiVeQ end-to-end": 4.0,
            "QSGD / GradiVeQ end-to-end": 1.40},
}
GRADIVEQ = ("gradiveq", "gradiveq_pooled", "gradiveq_bf16")


def _mean_after(col: pd.Series, skip: int) -> float:
    """Mean after the first ``skip`` values (allocation and cache warm-up), or of all if too few."""
    rest = col.iloc[skip:] if len(col) > skip else col
    return float(rest.mean())


def _gradiveq_cycle(m: pd.DataFrame, L_t: int, L_c: int, skip: int) -> dict:
    sample = m[m["phase"] == "sample"].iloc[:L_t]
    refresh = sample[sample["fit_s"].notna()]
    if len(sample) < L_t or refresh.empty:
        raise ReportError(f"logged {len(sample)} of the {L_t} sampling iterations and no refresh: a cycle "
                          f"needs iterations >= warmup + L_t + 1")
    last = refresh.iloc[-1]
    comp = m[(m["phase"] == "compress") & (m["iteration"] > last["iteration"])].iloc[:L_c]
    if comp.empty:
        raise ReportError("no compressed iteration after the refresh: a cycle needs iterations > warmup + L_t")
    ordinary = sample.drop(index=last.name)
    full = len(comp) == L_c
    agg_c = float(comp["aggregate_s"].sum()) if full else L_c * float(comp["aggregate_s"].mean())
    bytes_c = float(comp["bytes_sent"].sum()) if full else L_c * float(comp["bytes_sent"].mean())
    return {"aggregation": (L_t - 1) * _mean_after(ordinary["aggregate_s"], skip) + float(last["aggregate_s"])
            + agg_c,
            "bytes": float(sample["bytes_sent"].sum()) + bytes_c,     # the refresh's relay (if any) included
            "steady_agg": float(comp["aggregate_s"].mean()), "steady_compute": float(comp["compute_s"].mean()),
            "fit_s": float(last["fit_s"]), "wire_ratio": float(comp["compression_ratio"].mean()),
            "counted": f"{L_t} sampling as logged + " + (f"{L_c} compressed as logged" if full
                                                         else f"{L_c} x mean of {len(comp)} compressed")}


def cycle_of(run: Run, skip: int = 2) -> dict:
    """One run's times per ``L_t + L_c`` iterations (its own config's) in seconds of the run's clock."""
    m, cfg = run.metrics, run.config or {}
    if m is None or m.empty:
        raise ReportError(f"{run.path}: no metrics.csv rows")
    L_t, L_c = int(cfg.get("L_t", 100)), int(cfg.get("L_c", 400))
    n = L_t + L_c
    out = {"compute": n * _mean_after(m["compute_s"], skip)}
    if "phase" in m and m["phase"].isin(["sample", "compress"]).any():
        try:
            out.update(_gradiveq_cycle(m, L_t, L_c, skip))
        except ReportError as e:
            raise ReportError(f"{run.path}: {e}") from None
    else:
        agg = _mean_after(m["aggregate_s"], skip)
        ratio = m["compression_ratio"].mean() if "compression_ratio" in m else math.nan
        out.update(aggregation=n * agg, steady_agg=agg, bytes=n * float(m["bytes_sent"].mean()),
                   steady_compute=_mean_after(m["compute_s"], skip),
                   fit_s=math.nan, wire_ratio=float(ratio), counted=f"{n} x mean of {max(len(m) - skip, 1)}")
    out["end_to_end"] = out["compute"] + out["aggregation"]
    return out


def regime(compute_scale: float) -> str:
    """The paper's names: compute x1 is its CPU cluster, x1/6 its GPU cluster (6x faster compute)."""
    if math.isclose(compute_scale, 1.0):
        return "cpu"
    return "gpu" if math.isclose(compute_scale, 1 / 6, rel_tol=1e-3) else f"compute x{compute_scale:.3g}"


def _setting(run: Run) -> dict:
    cfg = run.config or {}
    net = cfg.get("net") or {}
    return {"N": int(cfg.get("world_size", 0)), "link_Mbps": float(net.get("bandwidth_bps") or math.inf) / 1e6,
            "regime": regime(float(net.get("compute_scale", 1.0))), "clock": clock_of(run)}


def cycle_table(runs: list[Run], skip: int = 2) -> pd.DataFrame:
    """One row per run: setting, method, times per cycle, and ratios against the same setting's rar / qsgd."""
    rows = [{**_setting(r), "method": r.aggregator, "cycle": int(r.config.get("L_t", 100))
             + int(r.config.get("L_c", 400)), **cycle_of(r, skip)} for r in runs if r.status == "completed"]
    if not rows:
        raise ReportError("no completed runs to count")
    df = pd.DataFrame(rows)
    keys = ["N", "link_Mbps", "regime", "clock"]
    for base, name in (("rar", "rar"), ("qsgd", "qsgd")):
        ref = df[df["method"] == base].groupby(keys)[["aggregation", "end_to_end"]].mean()  # seeds: mean
        for col, short in (("aggregation", "agg"), ("end_to_end", "e2e")):
            joined = df.join(ref[col].rename("_ref"), on=keys)
            df[f"{name}/x {short}"] = joined["_ref"] / df[col]
    df["agg share"] = df["aggregation"] / df["end_to_end"]
    return df.sort_values(keys + ["method"], key=_method_order).reset_index(drop=True)


def _method_order(col: pd.Series) -> pd.Series:
    order = {"rar": 0, "fp16": 1, "qsgd": 2}
    return col.map(lambda m: order.get(m, 3)) if col.name == "method" else col


def claims(df: pd.DataFrame) -> pd.DataFrame:
    """The paper's claims beside this sweep's figure, per setting in a regime the paper ran (cpu, gpu)."""
    rows = []
    for (n, link, reg), g in df.groupby(["N", "link_Mbps", "regime"], sort=False):
        by = g.set_index("method")
        for claim, paper in PAPER.get(reg, {}).items():
            row = {"N": n, "link_Mbps": link, "regime": reg, "claim": claim, "paper": paper}
            for m in (x for x in by.index if x in GRADIVEQ):
                row[m] = _claim_value(claim, by, m)
            rows.append(row)
    return pd.DataFrame(rows)


def _claim_value(claim: str, by: pd.DataFrame, m: str) -> float:
    if claim == "RAR aggregation share":
        return float(by.loc["rar", "agg share"]) if "rar" in by.index else math.nan
    if claim == "end-to-end cut vs RAR":
        return 1 - float(by.loc[m, "end_to_end"] / by.loc["rar", "end_to_end"]) if "rar" in by.index else math.nan
    base = "rar" if claim.startswith("RAR") else "qsgd"
    col = f"{base}/x {'agg' if claim.endswith('aggregation') else 'e2e'}"
    return float(by.loc[m, col])


def plot_cycle(df: pd.DataFrame, path) -> None:
    """Bars of computation + aggregation per cycle: a row of panels per (N, link), a column per regime
    (a regime is a clock -- its compute scale -- and no axis mixes clocks), methods along x."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    settings = list(dict.fromkeys(zip(df["N"], df["link_Mbps"])))
    regimes = list(dict.fromkeys(df["regime"]))
    fig, axes = plt.subplots(len(settings), len(regimes), figsize=(4.2 * len(regimes), 3.4 * len(settings)),
                             squeeze=False)
    for (i, (n, link)), (j, reg) in ((a, b) for a in enumerate(settings) for b in enumerate(regimes)):
        ax, g = axes[i][j], df[(df["N"] == n) & (df["link_Mbps"] == link) & (df["regime"] == reg)]
        if g.empty:
            ax.set_axis_off()
            continue
        x = range(len(g))
        ax.bar(x, g["compute"], color="0.6", label="computation")
        ax.bar(x, g["aggregation"], bottom=g["compute"], color="tab:orange", label="aggregation")
        ax.set_xticks(list(x), list(g["method"]), rotation=20, fontsize=8)
        ax.set_title(f"N = {n}, {link:g} Mbit/s, {reg} regime", fontsize=9)
        ax.set_ylabel(f"s per {g['cycle'].iloc[0]} iterations\n{g['clock'].iloc[0]}", fontsize=8)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
