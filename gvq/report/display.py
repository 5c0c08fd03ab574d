"""What the report says in words: the setting line, the display table (units, ± std, '—' where a value
cannot be known), time to the target and the notes that say what the table's figures are."""
from __future__ import annotations

import math

import pandas as pd

from gvq.report.target import as_target

DASH = "—"
#: the shown table's name for table.csv's ``compression_ratio`` (:func:`gvq.report.stats.compression_ratio`)
COMPRESSION_RATIO = "compression ratio vs rar (bytes)"


# -- setting ------------------------------------------------------------------------------------------
def _net(net: dict) -> str:
    bps = (net or {}).get("bandwidth_bps")
    text = "unshaped" if bps is None else (f"{bps / 1e9:g} Gbit/s" if bps >= 1e9 else f"{bps / 1e6:g} Mbit/s")
    lat = (net or {}).get("latency_s") or 0
    return f"{text} + {lat * 1e3:g} ms/msg" if lat else text


def _name(node) -> str:
    return str((node or {}).get("_target_", "?")).rsplit(".", 1)[-1]


def describe_setting(runs) -> str:
    """One line: model, dataset, ranks, link, iterations, batch (every distinct value across runs)."""
    fields = {"model": lambda c: _name(c.get("model")), "dataset": lambda c: _name(c.get("dataset")),
              "world_size": lambda c: c.get("world_size"), "net": lambda c: _net(c.get("net")),
              "iterations": lambda c: c.get("iterations"), "batch/rank": lambda c: c.get("batch_size"),
              "device": lambda c: c.get("device")}
    parts = []
    for name, get in fields.items():
        values = sorted({str(get(r.config)) for r in runs if r.config}, key=str)
        parts.append(f"{name}: {', '.join(values) or '?'}")
    return " · ".join(parts)


# -- display table ------------------------------------------------------------------------------------
def _pm(mean, std, fmt: str) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return DASH
    text = format(mean, fmt)
    return text if std is None or math.isnan(std) else f"{text} ± {format(std, fmt)}"


def _num(v, fmt: str, suffix: str = "") -> str:
    return DASH if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt) + suffix


def _target(row) -> str:
    """Iterations (± std over seeds) and time to the target accuracy, over the runs that reached it."""
    k, n = (int(x) for x in row["reached"].split("/"))
    if k == 0:
        return "not reached"
    iters = _pm(row["iters_to_target"], row["iters_to_target_std"], ".0f")
    return f"{iters} it, " + _num(row["time_to_target_s"], ".2f", " s") + ("" if k == n else f" ({k}/{n} runs)")


def status_text(run_status: str, reason: str, reasons: int) -> str:
    """A group's status as the table shows it: its runs' statuses in summary.json's words (``collapsed``:
    the loss back at chance; ``never_learned``: never out of it; counted where seeds differ), and one
    reason, the first run's: the others, per seed, are in each run's summary.json."""
    if not reason:
        return run_status
    more = f" (+{reasons - 1} other reasons: each run's summary.json)" if reasons > 1 else ""
    return f"{run_status}: {reason}{more}"


def display_table(df: pd.DataFrame, target: float) -> pd.DataFrame:
    """The human table (Markdown / HTML): units, ± std, '—' where a value cannot be known."""
    return pd.DataFrame({
        "group": df["group"], "aggregator": df["aggregator"], "runs": df["runs"],
        "status": [status_text(s, r, k) for s, r, k in zip(df["run_status"], df["reason"], df["reasons"])],
        "clock": df["clock"],
        "final top-1": [_pm(m, s, ".4f") for m, s in zip(df["final_top1"], df["final_top1_std"])],
        **({"final bpb": [_pm(m, s, ".4f") for m, s in zip(df["final_bpb"], df["final_bpb_std"])]}
           if df["final_bpb"].notna().any() else {}),
        f"time to {as_target(target).label}": [_target(r) for _, r in df.iterrows()],
        "aggregation / iter": [_num(v * 1e3, ".2f", " ms") for v in df["aggregate_s_per_iter"]],
        "agg. speed-up vs rar": [_num(v, ".2f", "x") for v in df["aggregation_speedup"]],
        "iter. speed-up vs rar": [_num(v, ".2f", "x") for v in df["iteration_speedup"]],
        "bytes / iter": [_num(v, ",.0f") for v in df["bytes_per_iter"]],
        **({"received / iter": [_num(v, ",.0f") for v in df["bytes_received_per_iter"]]}
           if df["bytes_received_per_iter"].notna().any() else {}),
        COMPRESSION_RATIO: [_num(v, ".2f") for v in df["compression_ratio"]],
        "compression error mean (median)": [
            DASH if math.isnan(m) else f"{m:.3g} ({md:.3g})"
            for m, md in zip(df["compression_error"], df["compression_error_median"])],
        # runs with aggregate_error=true only: the mean's error, re-encoding at every hop included
        **({"aggregate error": [_pm(m, s, ".3g") for m, s in zip(df["aggregate_error"], df["aggregate_error_std"])]}
           if df["aggregate_error"].notna().any() else {})})


def time_to_target(table: pd.DataFrame, target) -> pd.DataFrame:
    """Per group of the completed ones: how many seeds reached the target, in how many iterations and
    seconds (mean ± std over those that did; iteration 0's one-off start-up left out) on which clock."""
    done = table[table["status"] == "completed"]
    return pd.DataFrame({
        "group": done["group"], "reached": done["reached"],
        f"iterations to {as_target(target).label}": [_pm(m, s, ".0f") for m, s in
                                                    zip(done["iters_to_target"], done["iters_to_target_std"])],
        "seconds": [_pm(m, s, ".2f") for m, s in zip(done["time_to_target_s"], done["time_to_target_s_std"])],
        "clock": done["clock"]})


def table_note(table: pd.DataFrame, runs=(), target=None) -> str:
    """What the summary table's figures are, said under it in table.md and report.html: the groups, the
    baseline (and the groups that have none: their speed-ups and compression ratio are missing, not
    replaced), the target (and why, where it is a default), time to it, and the clock (:func:`clock_note`)."""
    missing = [f"{g} ({a})" if g != a else g for g, a, n in
               zip(table["group"], table["aggregator"], table["baseline_runs"]) if n == 0]
    lines = [f"{len(runs)} runs in {len(table)} groups (same overrides minus seed). Speed-ups and compression "
             "ratio (rar's mean bytes a rank sends per iteration over the group's): against the completed rar "
             "runs of the same setting. Time to target: wall_s of the first evaluation at or above it less "
             "iteration 0's one-off start-up (iteration 0 counted as a typical one), mean over the runs that "
             "reached it."]
    if missing:
        lines.append(f"No completed rar run of its setting: {', '.join(missing)}: speed-ups and compression "
                     f"ratio {DASH} (run aggregator=rar with the same overrides beside them).")
    if target is not None:
        said = as_target(target).said
        lines.append(f"{said[0].upper()}{said[1:]}.")
    clock = clock_note(runs)
    return "\n".join(lines + ([clock] if clock else []))


def clock_note(runs) -> str:
    """A line for wall-clock runs on an unshaped link ("" where there are none): their seconds measure the
    host, not a network, so they are no answer to "which is faster on my link"."""
    loopback = [r for r in runs if ((r.config or {}).get("net") or {}).get("clock", "wall") != "virtual"
                and not ((r.config or {}).get("net") or {}).get("bandwidth_bps")]
    if not loopback:
        return ""
    return (f"Clock: {len(loopback)} of {len(runs)} runs on the wall clock over unshaped loopback (no net "
            "shaping): their seconds (time to target, aggregation, speed-ups) measure this host's cores and "
            "memory copies, not a network link. For time to the target priced on a link: python -m gvq.report "
            "tta RUNS --bench BENCH.json (BENCH.json from python -m gvq.bench overlap --out).")
