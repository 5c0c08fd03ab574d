"""Rendering for :mod:`gvq.report`: figures (matplotlib, Agg) and every file of a report (:func:`render`); its
words (the display table, the notes) are :mod:`gvq.report.display`'s."""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from gvq.report import html as report_html
from gvq.report.display import describe_setting, display_table, table_note, time_to_target
from gvq.report.target import as_target, in_panel
from gvq.schema.palette import colour_of

PARTS = (("compute_s", "computation", "0.55"), ("compress_s", "compress", "tab:blue"),
         ("wire_s", "wire (blocked on peers)", "tab:orange"), ("decompress_s", "decompress", "tab:green"),
         ("other_s", "other aggregation", "tab:purple"),
         ("exposed_s", "exposed communication (overlapped)", "tab:red"))
HIDDEN = ("hidden_s", "hidden communication (overlapped, during backward)")
#: the target line's colour and style: no setting's colour (gvq.schema.palette), so it never reads as a run
TARGET_STYLE = {"color": "#b8860b", "linestyle": (0, (6, 3)), "lw": 2.0}
BAND_LABEL = "± std over seeds (shading)"


# -- figures ------------------------------------------------------------------------------------------
def _series(group, col: str, smooth: int = 1, log: bool = False) -> pd.DataFrame:
    """Mean, mean - std, mean + std of ``col`` over the group's runs at each iteration, with the mean
    ``wall_s``; ``log``: of log10(col) (geometric mean and std: a band that fits a log axis)."""
    frames = []
    for r in group.runs:
        m = r.metrics
        if m is None or col not in m or not m[col].notna().any():
            continue
        m = m.dropna(subset=[col])[["iteration", "wall_s", col]].copy()
        m[col] = m[col].rolling(smooth, min_periods=1).mean()
        if log:
            m[col] = np.log10(m[col].where(m[col] > 0))
        frames.append(m)
    if not frames:
        return pd.DataFrame(columns=["iteration", "wall_s", "mean", "lo", "hi"])
    agg = pd.concat(frames).groupby("iteration").agg(wall_s=("wall_s", "mean"), mean=(col, "mean"),
                                                     std=(col, "std")).reset_index()
    agg["lo"], agg["hi"] = agg["mean"] - agg["std"], agg["mean"] + agg["std"]
    if log:
        agg[["mean", "lo", "hi"]] = 10.0 ** agg[["mean", "lo", "hi"]]
    return agg


def time_clock(groups) -> str:
    """The one clock time axes use: the first completed group's (groups on another clock are left off
    those axes: two clocks never share one)."""
    done = [g for g in groups if g.status == "completed"] or list(groups)
    return done[0].clock if done else "wall-clock"


def curve_columns(groups) -> list[str]:
    """The curves' rows: test accuracy and train loss, and a language model's validation bits per byte
    where a run logged it (``test_bpb``)."""
    lm = any(r.metrics is not None and "test_bpb" in r.metrics and r.metrics["test_bpb"].notna().any()
             for g in groups for r in g.runs)
    return ["test_acc", "train_loss", *(["test_bpb"] if lm else [])]


def group_colour(group) -> str:
    """A group's colour in every figure: its setting's name and variant's (:func:`gvq.schema.palette.colour_of`),
    never its place among the groups of one report."""
    return colour_of(group.runs[0].setting, group.runs[0].variant)


def _plot_group(axes, group, color, smooth: int, on_time_axis: bool, columns: list[str]) -> None:
    style = "-" if group.status == "completed" else "--"
    label = group.label + ("" if group.status == "completed" else f" ({group.status})") + (
        f" ({group.collapsed}/{len(group.runs)} collapsed)" if group.collapsed else "")
    for row, col in enumerate(columns):
        # the train loss is logged each step: smoothed, and a geometric band that fits its log axis
        s = _series(group, col, smooth if col == "train_loss" else 1, log=col == "train_loss")
        for ax, x in zip(axes[row], ("iteration", "wall_s") if on_time_axis else ("iteration",)):
            first = row == 0 and x == "iteration"
            ax.plot(s[x], s["mean"], style, color=color, label=label if first else None, lw=1.4)
            if len(group.runs) > 1 and s["lo"].notna().any():
                ax.fill_between(s[x], s["lo"], s["hi"], color=color, alpha=0.2)


def _loss_limits(axes, groups, smooth: int) -> None:
    """Log scale, limits from the completed groups: a diverged run must not flatten the others."""
    values = [_series(g, "train_loss", smooth, log=True)["mean"] for g in groups if g.status == "completed"]
    values = pd.concat(values) if values else pd.Series(dtype=float)
    values = values[np.isfinite(values) & (values > 0)]
    for ax in axes:
        ax.set_yscale("log")
        if len(values):
            ax.set_ylim(values.min() / 1.5, values.max() * 1.5)


def plot_curves(groups, path: Path, setting: str, target=None) -> Path:
    """2 x 2: test accuracy / train loss against iteration / the run's clock (a third row, validation bits
    per byte, for a language model's runs: :func:`curve_columns`); shading: +- std over seeds; each group in
    its setting's colour (:func:`group_colour`); ``target`` drawn on the panels that show its quantity, in
    their unit (:func:`_target_lines`)."""
    columns = curve_columns(groups)
    fig, axes = plt.subplots(len(columns), 2, figsize=(12, 4 * len(columns)), sharex="col")
    longest = max((len(r.metrics) for g in groups for r in g.runs if r.metrics is not None), default=1)
    smooth = max(1, longest // 50)
    clock = time_clock(groups)
    for g in groups:
        _plot_group(axes, g, group_colour(g), smooth, g.clock == clock, columns)
    axes[0][0].set_ylabel("test accuracy (top-1)")
    axes[1][0].set_ylabel("train loss" + (f" (running mean of {smooth})" if smooth > 1 else "")
                          + "\ngeometric mean ± std over seeds")
    if "test_bpb" in columns:
        axes[2][0].set_ylabel("validation bits per byte\nmean ± std over seeds (lower is better)")
    axes[-1][0].set_xlabel("iteration")
    others = sorted({g.clock for g in groups} - {clock})
    axes[-1][1].set_xlabel(f"{clock} (s)" + (f"\nnot shown: runs on {', '.join(others)}" if others else ""))
    _loss_limits(axes[1], groups, smooth)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    drawn = _target_lines(axes, columns, target, [r for g in groups for r in g.runs])
    _curve_legends(axes, columns, drawn, banded=any(len(g.runs) > 1 for g in groups))
    fig.suptitle(textwrap.fill(f"Convergence ({setting})", 150), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _target_lines(axes, columns: list[str], target, runs) -> list[int]:
    """The target as a horizontal line on each panel of the rows whose column shows its quantity (an
    accuracy target on test accuracy; a loss target, nats per token, on validation bits per byte converted as
    the runs converted it); the rows drawn on."""
    if target is None:
        return []
    drawn = []
    for row, col in enumerate(columns):
        y = in_panel(target, col, runs)
        if y is None:
            continue
        t = as_target(target)
        label = f"target: {t.describe}" + (f" = {y:.3g} bpb" if col != t.column else "")
        for ax in axes[row]:
            ax.axhline(y, label=label, **TARGET_STYLE)
        drawn.append(row)
    return drawn


def _curve_legends(axes, columns: list[str], target_rows: list[int], banded: bool) -> None:
    """A legend for every mark: the groups (and the shading) on the first panel, and on each row with a target
    line that line's own entry."""
    from matplotlib.patches import Patch
    for row in sorted({0, *target_rows}):
        handles, labels = axes[row][0].get_legend_handles_labels()
        if row == 0 and banded:
            handles, labels = handles + [Patch(color="0.5", alpha=0.2)], labels + [BAND_LABEL]
        loc = "lower right" if columns[row] == "test_acc" else "upper right"
        axes[row][0].legend(handles, labels, fontsize=8, loc=loc)


def breakdown(groups, stats_of) -> pd.DataFrame:
    """Seconds per iteration (the mean over each group's iterations) of each completed group, stacking to
    compute_s + aggregate_s (GradiVeQ's Fig. 7b stacks seconds per 500 iterations; a run of another length
    would misread that unit, so the bars are per iteration).
    Post-backward: aggregation is all exposed, split into compress / wire / decompress and ``other_s``
    (aggregate_s minus those; each part is a max over ranks, so clipped at 0).  Overlapped
    (``exposed_s`` logged): the codec and wire work ran on the communication thread during backward, so
    it is not stacked; ``exposed_s`` is what the iteration waited for after the last rank's backward, and
    ``hidden_s`` = comm_s - exposed_s is drawn inside the computation bar (as is ``straggle_s``, faster
    ranks waiting for the slowest one's backward: compute imbalance, not communication)."""
    rows, clock = [], time_clock(groups)
    for g in groups:
        s = stats_of(g)
        if g.status != "completed" or math.isnan(s.get("aggregate_s", math.nan)) or "compute_s" not in s \
                or g.clock != clock:        # one axis, one clock
            continue
        rows.append({"group": g.label, "clock": g.clock, **_parts(s)})
    return pd.DataFrame(rows)


def _parts(s: dict) -> dict:
    total = s["compute_s"] + s["aggregate_s"]
    exposed, comm = (_or0(s.get(k)) for k in ("exposed_s", "comm_s"))
    if "exposed_s" in s and not math.isnan(s["exposed_s"]):
        row = dict.fromkeys(("compress_s", "wire_s", "decompress_s", "other_s"), 0.0)
        return {**row, "compute_s": max(0.0, total - exposed), "exposed_s": exposed,
                "hidden_s": max(0.0, comm - exposed), "aggregate_s": s["aggregate_s"]}
    row = {k: _or0(s.get(k)) for k in ("compute_s", "compress_s", "wire_s", "decompress_s")}
    row["other_s"] = max(0.0, s["aggregate_s"] - row["compress_s"] - row["wire_s"] - row["decompress_s"])
    return {**row, "exposed_s": 0.0, "hidden_s": 0.0, "aggregate_s": s["aggregate_s"]}


def _or0(v) -> float:
    return 0.0 if v is None or math.isnan(v) else float(v)


def plot_breakdown(table: pd.DataFrame, path: Path, setting: str) -> Path:
    """GradiVeQ Fig. 7b: stacked computation + aggregation (compress / wire / decompress / other, or an
    overlapped run's exposed communication), with the communication hidden inside backward hatched."""
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(table) + 3), 4.5))
    x, bottom = np.arange(len(table)), np.zeros(len(table))
    for key, label, color in PARTS:                       # seconds in the table, milliseconds on the axis
        values = 1e3 * table[key].to_numpy() if len(table) else np.zeros(0)
        ax.bar(x, values, 0.6, bottom=bottom, label=label, color=color)
        bottom += values
    if len(table) and table["hidden_s"].any():
        ax.bar(x, 1e3 * table["hidden_s"].to_numpy(), 0.3, fill=False, hatch="//", edgecolor="k", label=HIDDEN[1])
    for xi, (total, agg) in enumerate(zip(bottom, table.get("aggregate_s", []))):
        ax.text(xi, total, f"agg {1e3 * agg:.3g} ms", ha="center", va="bottom", fontsize=7)
    if len(table):
        ax.set_ylim(0, 1.12 * bottom.max())                  # room for the labels above the tallest bar
    ax.set_xticks(x, table.get("group", []), rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"ms per iteration (mean)\n({table['clock'].iloc[0] if len(table) else 'wall-clock'})")
    ax.set_title(textwrap.fill(f"Computation vs aggregation ({setting})", 12 * fig.get_figwidth()),
                 fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# -- all files ----------------------------------------------------------------------------------------
def render(out: Path, title: str, runs, groups, stats_of, table: pd.DataFrame, target: float):
    """Write table.csv / .md, the figures and report.html into ``out``; returns the display table."""
    display = display_table(table, target)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "table.csv", index=False)
    note = table_note(table, runs, target)
    (out / "table.md").write_text(display.to_markdown(index=False) + "\n\n" + note + "\n")
    setting = describe_setting(runs)
    bpb = ", validation bits per byte" if "test_bpb" in curve_columns(groups) else ""
    figures = [(plot_curves(groups, out / "curves.png", setting, target),
                f"Test accuracy, train loss{bpb} against iteration and {time_clock(groups)} "
                "(bands: ± std over seeds; loss: geometric)")]
    parts = breakdown(groups, stats_of)
    if len(parts):
        parts.to_csv(out / "breakdown.csv", index=False)
        figures.append((plot_breakdown(parts, out / "breakdown.png", setting),
                        "Computation vs aggregation time per iteration, mean over each run's iterations "
                        "(GradiVeQ Fig. 7b's bars, which stack seconds per 500 iterations)"))
    sections = report_html.Sections(display, table, note, figures, time_to_target(table, target),
                                    _frontier(table, out, target))
    report_html.write_html(out / "report.html", title, setting, sections, groups)
    return display


def _frontier(table: pd.DataFrame, out: Path, target) -> tuple | None:
    """The accuracy-cost frontier of the completed settings (:mod:`gvq.report.frontier`): its display
    table, ``frontier.png`` and its quality axis; None where no setting completed or none logged its bytes."""
    from gvq.report import frontier
    if not (table["status"] == "completed").any() or not table["bytes_per_iter"].notna().any():
        return None
    df = frontier.setting_frontier(table, frontier.score_axis(table, target))
    frontier.plot_setting_frontier(df, out / "frontier.png", target)
    return frontier.frontier_display(df, target), out / "frontier.png", frontier.axis_of(df)
