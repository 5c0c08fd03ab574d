"""The projection's heatmaps (``python -m gvq.predict project``): one panel per compute scale, N down, the
link across, each cell in its winner's colour.

A winner's colour is :func:`gvq.schema.palette.colour_of` of its setting's name and mode, a function of
the name alone, so ``powersgd rank=6 (post)`` is one colour in the per-iteration heatmap, the
time-to-target one and any other figure gvq draws (a colour picked by a winner's index among one
figure's winners gave one colour to different modes in two figures); its setting's marker
(:func:`gvq.schema.palette.marker_of`) in the cell's corner and in the legend tells apart settings of one
colour (``rar`` and ``ddp`` share their family's).  A tie is light grey.  The figure
says what the number in a cell is (``caption``) and what ``=k`` is, and its legend holds every colour
and the GradiVeQ-RAR = RAR line.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from gvq.schema.palette import colour_of, marker_of

TIE = "tie within the seed spread"
TIE_COLOUR = "lightgrey"
#: what ``=k`` under a cell's number means, said in every figure that draws one
TIE_TEXT = "=k: k modes tie in the cell (grey)"


def label_of(winner: str, modes: bool) -> tuple[str, str | None]:
    """(setting name, mode) of a cell's winner: ``qsgd bits=2 overlap`` -> (``qsgd bits=2``, ``overlap``)
    where the winners carry their mode (``project overlap=true``), else (the name, None)."""
    if not modes:
        return winner, None
    name, _, mode = winner.rpartition(" ")
    return name, mode


def legend_name(winner: str, modes: bool) -> str:
    """How the legend writes a winner: ``qsgd bits=2 (overlap)``, as the benches name a mode."""
    if winner == TIE:
        return TIE
    name, mode = label_of(winner, modes)
    return f"{name} ({mode})" if mode else name


def cell_colours(win: pd.DataFrame, modes: bool) -> tuple[pd.Series, pd.Series, dict[str, str]]:
    """(modes tied per cell, each cell's label: its winner or :data:`TIE`, {label: colour} in legend order)."""
    tied = win["tied"].fillna("").astype(str) if "tied" in win else pd.Series("", index=win.index)
    label = win["winner"].where(tied == "", TIE)
    names = sorted(set(label) - {TIE}) + [TIE] * bool((tied != "").any())
    return tied, label, {n: TIE_COLOUR if n == TIE else colour_of(*label_of(n, modes)) for n in names}


#: (column, axis label, tick text) of the axes a heatmap can take
AXES = {"N": ("N", "N ranks", str), "nodes": ("nodes", "nodes", str),
        "link_bps": ("link_bps", "link, bit/s per rank", lambda b: f"{b / 1e9:g}G" if b >= 1e9 else f"{b / 1e6:g}M"),
        "compute_scale": ("compute_scale", "compute scale", lambda c: f"x{c:.3g}")}


def plot(win: pd.DataFrame, model: str, path: Path, note: str = "", caption: str = "", modes: bool = False,
         rows: str = "N", cols: str = "link_bps", panels: str = "compute_scale") -> None:
    """One panel per value of ``panels`` (the compute scale; a two-level projection: its one inter-node
    link), ``rows`` down and ``cols`` across (:data:`AXES`): each cell coloured by its winner (``modes``:
    winners are ``NAME MODE``), or grey where ``win``'s ``tied`` names modes tied with it; the number in a
    cell is ``margin`` (what it is: ``caption``, printed in the figure), ``=k`` below it the count of modes
    sharing a tied cell; ``note`` (which baseline priced it) heads the figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tied, label, colours = cell_colours(win, modes)
    scales = sorted(win[panels].unique(), reverse=True)
    line = int(np.isfinite(win["gradiveq_vs_rar"].astype(float)).any())   # drawn only with both calibrated
    entries = [legend_name(n, modes) for n in colours] + ["GradiVeQ-RAR = RAR"] * line
    # the legend wraps rather than outrun the figure: as many columns as its longest name allows (inches at 8 pt)
    ncol = max(1, min(len(entries), int(5.2 * len(scales) // (0.5 + 0.07 * max(map(len, entries))))))
    lines = -(-len(entries) // ncol)
    head = [ln for text in (note, caption + ("; " + TIE_TEXT if TIE in colours else "")) if text
            for ln in textwrap.wrap(text, 70 * len(scales))]
    fig, axes = plt.subplots(1, len(scales), figsize=(5.2 * len(scales), 4.4 + 0.14 * len(head) + 0.25 * lines),
                             squeeze=False)
    for ax, c in zip(axes[0], scales):
        _panel(ax, win[win[panels] == c], tied, label, colours, modes, rows, cols)
        where = f"compute x{c:.3g}" if panels == "compute_scale" else f"{AXES[panels][2](c)}bit/s between nodes"
        ax.set_title(f"{model}, {where} (virtual-time terms)", fontsize=9)
    handles = [_handle(plt, n, col, modes) for n, col in colours.items()]
    if head:                                  # wrapped: the baseline's line outruns a narrow figure
        fig.suptitle("\n".join(head), fontsize=7)
    edge = plt.Line2D([], [], color="k", path_effects=_halo())
    fig.legend(handles + [edge] * line, entries, loc="lower center", ncol=ncol, fontsize=8)
    fig.tight_layout(rect=(0, 0.02 + 0.05 * lines, 1, 1 - 0.03 * len(head)))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _marker(label: str, modes: bool) -> str | None:
    """The marker of a cell's winner (a function of its setting's name), None for a tie."""
    return None if label == TIE else marker_of(label_of(label, modes)[0])


def _handle(plt, label: str, colour: str, modes: bool):
    """A legend entry: the cell's colour with the winner's marker on it, as the cells draw them."""
    square = plt.Rectangle((0, 0), 1, 1, color=colour)
    marker = _marker(label, modes)
    if marker is None:
        return square
    from matplotlib.colors import to_rgb
    return (square, plt.Line2D([], [], ls="", marker=marker, ms=4, color=_ink(to_rgb(colour))))


def _halo() -> list:
    """A white halo round the GradiVeQ-RAR = RAR line: black alone vanishes over rar's black cells."""
    from matplotlib import patheffects
    return [patheffects.withStroke(linewidth=3.5, foreground="white")]


def _ink(rgb) -> str:
    """Text that reads on a cell of colour ``rgb``: white on a dark one (rar's family is black)."""
    return "white" if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 0.5 else "black"


def _panel(ax, w: pd.DataFrame, tied: pd.Series, label: pd.Series, colours: dict[str, str], modes: bool,
           rows: str = "N", cols: str = "link_bps") -> None:
    """One panel's cells, their numbers and markers, the GradiVeQ-RAR = RAR line and the axes."""
    from matplotlib.colors import to_rgb
    Ns, Bs = sorted(w[rows].unique()), sorted(w[cols].unique())
    img = np.ones((len(Ns), len(Bs), 3))                  # white: a cell no winner was computed for
    for k, r in w.iterrows():
        i, j = Ns.index(r[rows]), Bs.index(r[cols])
        img[i, j] = to_rgb(colours[label[k]])
        share = f"\n={len(tied[k].split(', ')) + 1}" if tied[k] else ""
        ax.text(j, i, f"{r['margin']:.1f}{share}", ha="center", va="center", fontsize=6, color=_ink(img[i, j]))
        if _marker(label[k], modes):              # top left: clear of the number and of where a test samples
            ax.plot(j - 0.32, i + 0.28, ls="", marker=_marker(label[k], modes), ms=3, color=_ink(img[i, j]))
    ax.imshow(img, aspect="auto", origin="lower", interpolation="nearest")
    gv = w.pivot(index=rows, columns=cols, values="gradiveq_vs_rar").reindex(index=Ns, columns=Bs)
    if min(gv.shape) >= 2 and np.isfinite(gv.values).any():    # no GradiVeQ or RAR calibrated, one N: no line
        ax.contour(np.arange(len(Bs)), np.arange(len(Ns)), gv.values, levels=[1.0], colors="k", linewidths=1.5
                   ).set(path_effects=_halo())
    ax.set_xticks(range(len(Bs)), [AXES[cols][2](b) for b in Bs], fontsize=7)
    ax.set_yticks(range(len(Ns)), [AXES[rows][2](n) for n in Ns], fontsize=7)
    ax.set_xlabel(AXES[cols][1])
    ax.set_ylabel(AXES[rows][1])
