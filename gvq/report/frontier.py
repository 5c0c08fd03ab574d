"""The accuracy-cost frontier: ``python -m gvq.report frontier DIR target_acc=0.8``; a language model's
(``target_loss=2.4`` on runs that logged ``test_bpb``) has final validation bits per byte on its quality
axis instead, lower being better (:func:`score_axis`).

One point per setting (a group: the same overrides but the seed): bytes a rank sends per iteration against
the final accuracy (or bpb), and against the iterations to the target, each with its seed band (mean +- std).  A
setting is *dominated* when another sends no more bytes, is not worse beyond the two bands, and is better
on one axis (fewer bytes, or a band wholly better); the rest are the frontier.  A difference inside the
seed spread does not count, and a setting some seed of which never reached the target is behind every
setting all of whose seeds did (its iterations count as never).  Runs that ended at chance stay in their
setting's band (dropping them would flatter it) and are counted; a setting every seed of which ended at
chance is never on the frontier and ranks no other.  A setting with fewer than
:data:`MIN_SEEDS` seeds (a screen) is shown but neither ranked nor ranks others: it has no band.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gvq.report.intervals import MIN_SEEDS, UNRANKED, Interval
from gvq.report.target import as_target

#: a setting's bytes per iteration within this share of another's count as equal (counters of one run
#: vary by a few bytes: headers, the relay); larger => more settings tie on cost
BYTES_TOLERANCE = 0.01


@dataclass(frozen=True)
class Axis:
    """The frontier's quality axis: ``key`` names its columns in ``frontier.csv`` (``final_<key>``,
    ``final_<key>_std``, ``frontier_<key>``), ``source`` the report table's column it is read from."""
    key: str
    source: str
    header: str          # the frontier table's column
    label: str           # the figure's axis
    title: str
    higher: bool         # whether a larger figure is better


ACC = Axis("acc", "final_top1", "final acc", "final test accuracy", "Accuracy-cost frontier", higher=True)
BPB = Axis("bpb", "final_bpb", "final bpb", "final validation bits per byte (lower is better)",
           "Bits-per-byte-cost frontier (validation bpb, lower is better)", higher=False)


def score_axis(table: pd.DataFrame, target) -> Axis:
    """Bits per byte where the target is a loss and the runs logged validation bpb (a language model's),
    else accuracy."""
    lm = as_target(target).lower_is_better and "final_bpb" in table and table["final_bpb"].notna().any()
    return BPB if lm else ACC


def axis_of(df: pd.DataFrame) -> Axis:
    """The quality axis a :func:`setting_frontier` table was ranked on."""
    return BPB if "final_bpb" in df else ACC


def band(mean: float, std: float) -> Interval:
    """A mean over seeds with its band (no band from one seed: it ties with whatever it meets)."""
    if not np.isfinite(mean):
        return Interval(mean, mean, mean)
    return Interval(mean, None, None) if not np.isfinite(std) else Interval(mean, mean - std, mean + std)


def _better(a: Interval, b: Interval, higher: bool) -> bool:
    """``a`` wholly better than ``b`` (its band clear of ``b``'s on the good side); a figure that is
    never (iterations to a target some seed missed) is behind every finite one."""
    fa, fb = bool(np.isfinite(a.median)), bool(np.isfinite(b.median))
    if fa != fb:
        return fa
    if not (fa and a.bounded and b.bounded):
        return False
    return a.lo > b.hi if higher else a.hi < b.lo


def _not_worse(a: Interval, b: Interval, higher: bool) -> bool:
    """``a`` at least as good as ``b``: its mean as good, or each mean inside the other's band (a
    difference within the seed spread); a wide band alone does not make a worse mean as good."""
    if _better(b, a, higher):
        return False
    if a.median == b.median or (a.median > b.median if higher else a.median < b.median):
        return True
    return a.bounded and b.bounded and b.lo <= a.median <= b.hi and a.lo <= b.median <= a.hi


def dominated(cost: list[float], score: list[Interval], higher: bool) -> list[bool]:
    """For each point, whether another costs no more, is at least as good (:func:`_not_worse`), and is
    cheaper or wholly better (see the module docstring)."""
    out = []
    for i, (c_i, s_i) in enumerate(zip(cost, score)):
        hit = False
        for j, (c_j, s_j) in enumerate(zip(cost, score)):
            if j == i or not c_j <= c_i * (1 + BYTES_TOLERANCE):
                continue
            cheaper = c_j < c_i * (1 - BYTES_TOLERANCE)
            if _not_worse(s_j, s_i, higher) and (cheaper or _better(s_j, s_i, higher)):
                hit = True
                break
        out.append(hit)
    return out


def setting_frontier(table: pd.DataFrame, axis: Axis = ACC) -> pd.DataFrame:
    """From the report's numeric table (``stats.build_table``): per setting its MB per iteration, final
    accuracy (``axis``: or bpb) and iterations to the target with their bands, seeds at chance, and
    ``frontier_acc`` (``frontier_bpb``) / ``frontier_iters``: not dominated on that axis."""
    t = table[table["status"] == "completed"].reset_index(drop=True)
    reached = t["reached"].str.split("/").map(lambda p: int(p[0]) == int(p[1]))
    iters = [band(m, s) if ok else Interval(np.inf, np.inf, np.inf)
             for m, s, ok in zip(t["iters_to_target"], t["iters_to_target_std"], reached)]
    score = [band(m, s) for m, s in zip(t[axis.source], t[axis.source + "_std"])]
    cost = list(t["bytes_per_iter"].astype(float))
    out = pd.DataFrame({
        "setting": t["group"], "aggregator": t["aggregator"], "setting_name": t["setting_name"],
        "variant": t["variant"], "seeds": t["runs"], "at_chance": t["collapsed"],
        "MB_per_iter": t["bytes_per_iter"] / 1e6, f"final_{axis.key}": t[axis.source],
        f"final_{axis.key}_std": t[axis.source + "_std"],
        "iters_to_target": t["iters_to_target"], "iters_to_target_std": t["iters_to_target_std"],
        "reached": t["reached"]})
    # a setting every seed of which ended at chance learned nothing: however cheap, it is no trade-off,
    # so it is neither on the frontier nor pushes a setting that learned off it
    out["all_at_chance"] = t["collapsed"] == t["runs"]
    out["ranked"] = (t["runs"] >= MIN_SEEDS) & ~out["all_at_chance"]
    ranked = list(np.flatnonzero(out["ranked"]))
    out[f"frontier_{axis.key}"] = out["frontier_iters"] = False
    on_score = dominated([cost[i] for i in ranked], [score[i] for i in ranked], higher=axis.higher)
    on_iters = dominated([cost[i] for i in ranked], [iters[i] for i in ranked], higher=False)
    # a setting some seed of which never reached the target has no figure to put on that frontier
    out.loc[ranked, f"frontier_{axis.key}"] = [not d for d in on_score]
    out.loc[ranked, "frontier_iters"] = [not d and reached[i] for d, i in zip(on_iters, ranked)]
    return out.sort_values("MB_per_iter").reset_index(drop=True)


def _place(on: bool, ranked: bool, at_chance: bool) -> str:
    if at_chance:
        return "no: every seed at chance"
    return ("yes" if on else "") if ranked else "unranked"


def frontier_display(df: pd.DataFrame, target: float) -> pd.DataFrame:
    """The frontier as ``frontier.md`` and ``report.html`` show it: bands as ± std, the frontier marked."""
    axis = axis_of(df)
    iters = [f"{m:.0f} ± {s:.0f} ({r})" if np.isfinite(s) else f"{m:.0f} ({r})" if np.isfinite(m) else f"never ({r})"
             for m, s, r in zip(df["iters_to_target"], df["iters_to_target_std"], df["reached"])]
    return pd.DataFrame({
        "setting": df["setting"], "MB/iter": df["MB_per_iter"].map(lambda v: f"{v:.3g}"),
        axis.header: [f"{m:.4f} ± {s:.4f}" if np.isfinite(s) else f"{m:.4f}" for m, s in
                      zip(df[f"final_{axis.key}"], df[f"final_{axis.key}_std"])],
        f"iters to {as_target(target).label}": iters,
        "at chance": df["at_chance"],
        **{f"frontier ({name})": [_place(on, ranked, chance) for on, ranked, chance in
                                  zip(df[f"frontier_{name}"], df["ranked"], df["all_at_chance"])]
           for name in (axis.key, "iters")}})


#: what the frontier table's marks mean, said under it wherever it is shown
FRONTIER_NOTE = ("mean ± std over seeds; a setting is on the frontier unless another sends no more bytes, is as "
                 "good within the seed bands and cheaper or wholly better; iterations to the target over the seeds "
                 f"that reached it, (k/n) how many did; fewer than {MIN_SEEDS} seeds: no band, unranked; every seed "
                 "at chance: never on it")


def frontier_markdown(df: pd.DataFrame, target: float) -> str:
    shown = frontier_display(df, target)
    return f"{axis_of(df).title} ({FRONTIER_NOTE}):\n\n{shown.to_markdown(index=False)}\n"


#: how the frontier figure marks a setting's place (the colour is the setting's own): (label, marker, filled)
PLACES = (("on the frontier", "o", True), ("dominated", "o", False), (UNRANKED, "X", True),
          ("every seed at chance", "v", True))
NOT_REACHED = "not reached by any seed (at the top edge)"


def _place_of(r) -> str:
    if r["all_at_chance"]:
        return PLACES[3][0]
    return PLACES[2][0] if not r["ranked"] else PLACES[0][0] if r["on"] else PLACES[1][0]


def plot_setting_frontier(df: pd.DataFrame, path, target: float) -> None:
    """Two panels against MB per iteration (log): final accuracy (or bpb) and iterations to the target, seeds
    as error bars, the frontier joined; each setting in its own colour (:func:`gvq.schema.palette.colour_of`),
    its place by marker; a setting no seed of which reached the target at the top edge of the iterations
    panel; a legend for every mark."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    score = axis_of(df)
    for ax, col, flag, label in ((axes[0], f"final_{score.key}", f"frontier_{score.key}", score.label),
                                 (axes[1], "iters_to_target", "frontier_iters",
                                  f"iterations to {as_target(target).label}")):
        shown = df.assign(on=df[flag])
        ok = shown[np.isfinite(shown[col])]
        for _, r in ok.iterrows():
            _point(ax, r, col)
        front = ok[ok["on"]].sort_values("MB_per_iter")
        ax.plot(front["MB_per_iter"], front[col], "-", color="0.4", alpha=0.5, label="frontier (joined)")
        _never_reached(ax, shown[~np.isfinite(shown[col])] if col == "iters_to_target" else shown.iloc[:0])
        _log_ticks(ax)
        ax.set_xlabel("MB a rank sends per iteration")
        ax.set_ylabel(label)
        _place_legend(ax, {_place_of(r) for _, r in ok.iterrows()})
    _setting_legend(fig, df)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _point(ax, r, col: str) -> None:
    """One setting's point: its colour, its place's marker, its seed band, its name beside it."""
    from gvq.schema.palette import colour_of
    colour = colour_of(r["setting_name"], r["variant"])
    marker, filled = next((m, f) for name, m, f in PLACES if name == _place_of(r))
    std = r[col + "_std"] if np.isfinite(r[col + "_std"]) else 0.0
    ax.errorbar([r["MB_per_iter"]], [r[col]], yerr=[std], fmt=marker, color=colour, capsize=3,
                mfc=colour if filled else "none", ms=7)
    k, n = r["reached"].split("/")
    text = f"{r['setting']} ({k}/{n} reached)" if col == "iters_to_target" and k != n else r["setting"]
    ax.annotate(text, (r["MB_per_iter"], r[col]), xytext=(4, 4), textcoords="offset points", fontsize=6, alpha=0.8)


def _never_reached(ax, never: pd.DataFrame) -> None:
    """Settings no seed of which reached the target: a marker at the iterations panel's top edge, at their
    bytes, in their colour, labelled, so they never vanish from it."""
    from gvq.schema.palette import colour_of
    for _, r in never.iterrows():
        colour = colour_of(r["setting_name"], r["variant"])
        ax.plot([r["MB_per_iter"]], [0.97], "^", color=colour, ms=9, transform=ax.get_xaxis_transform(),
                clip_on=False)
        ax.annotate(f"{r['setting']}: not reached", (r["MB_per_iter"], 0.97), xycoords=ax.get_xaxis_transform(),
                    xytext=(5, -10), textcoords="offset points", fontsize=6, color=colour)
    if len(never):
        ax.plot([], [], "^", color="0.3", ms=9, label=NOT_REACHED)


def _place_legend(ax, used: set[str]) -> None:
    """What each marker ``used`` on ``ax`` means, in grey (the colour is the setting's: the figure's other
    legend), and the panel's own marks (the joined frontier, the not-reached marker)."""
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], marker=m, ls="none", color="0.3", mfc="0.3" if f else "none", ms=7, label=name)
               for name, m, f in PLACES if name in used]
    own, labels = ax.get_legend_handles_labels()
    ax.legend(handles + own, [h.get_label() for h in handles] + labels, fontsize=7, loc="best",
              title="error bars: ± std over seeds", title_fontsize=7)


def _setting_legend(fig, df: pd.DataFrame) -> None:
    """Each setting's colour, by name (the colour of a setting is the same in every gvq figure)."""
    from matplotlib.patches import Patch
    from gvq.schema.palette import colour_of
    handles = [Patch(color=colour_of(n, v), label=s) for s, n, v in
               dict.fromkeys(zip(df["setting"], df["setting_name"], df["variant"]))]
    fig.legend(handles=handles, loc="center right", fontsize=7, title="setting", title_fontsize=8)


def _log_ticks(ax) -> None:
    """A log x axis labelled legibly: labels at 1, 2 and 5 of each decade, as plain numbers, slanted, and no
    minor labels (matplotlib labels every minor tick of a span under a decade, and they overlap)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
