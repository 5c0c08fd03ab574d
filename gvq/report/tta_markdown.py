"""``tta.md``: the tables of :mod:`gvq.report.tta` as a reader sees them: the setting, iterations to the
target, the winner per cell (and, apart, the fastest one-seed mode: never a winner), every mode per cell
and the end-to-end validation."""
from __future__ import annotations

import numpy as np
import pandas as pd

from gvq.report.intervals import UNRANKED
from gvq.report.target import as_target
from gvq.report.tta import FP16_OVERLAP, VALIDATION_TOLERANCE


def _reached_pm(mean: float, std: float, fmt: str = "{:.0f}", missing: str = "—") -> str:
    """A figure ± its spread; ``not reached`` for a never (inf), ``missing`` where there is no figure (NaN:
    nothing was run to give one)."""
    if np.isnan(mean):
        return missing
    if not np.isfinite(mean):
        return "not reached"
    return fmt.format(mean) + ("" if np.isnan(std) else " ± " + fmt.format(std))


def _gain(gain: float, reference_s: float) -> str:
    """A winner's gain over overlapped fp16; without an fp16 run there is no reference, and it says so."""
    if np.isnan(reference_s):
        return f"no {FP16_OVERLAP.split(' ')[0]} run"
    return f"{gain:.2f}x" if np.isfinite(gain) else "—"


def _every_option(cells: pd.DataFrame) -> str:
    """Every (setting, variant)'s seconds per cell: ``not reached`` for a never, ``—`` where that setting was
    not run or timed in the cell, a one-seed figure marked unranked."""
    shown = cells.drop(columns=["winner", "winner_s", "winner_std", "fp16_overlap_s", "gain_over_fp16",
                                "gain_over_default", "one_seed", "unranked"])
    modes = [c for c in shown.columns if c not in ("N", "link_Mbps", "regime", "best")]
    for c in modes:
        one = [c in u.split("; ") for u in cells["unranked"]]
        shown[c] = [_reached_pm(v, np.nan, "{:.1f}") + (" (1 seed)" if o and not np.isnan(v) else "")
                    for v, o in zip(shown[c], one)]
    return shown.to_markdown(index=False)


def _winners(cells: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({
        "N": cells["N"], "link (Mbit/s)": cells["link_Mbps"], "regime": cells["regime"], "winner": cells["winner"],
        "seconds to target": [_reached_pm(m, s, "{:.1f}") for m, s in zip(cells["winner_s"], cells["winner_std"])],
        "overlapped fp16": [_reached_pm(m, np.nan, "{:.1f}", "no fp16 run") for m in cells["fp16_overlap_s"]],
        "gain": [_gain(g, f) for g, f in zip(cells["gain_over_fp16"], cells["fp16_overlap_s"])],
        "over family default": [f"{g:.2f}x" if np.isfinite(g) else "—" for g in cells["gain_over_default"]]})
    if cells["one_seed"].astype(bool).any():
        out["fastest on one seed"] = [t or "—" for t in cells["one_seed"]]
    return out


def markdown(tables: dict, setting: dict, target: float, bench_path) -> str:
    """``tta.md``: the setting, iterations to the target, the winner per cell, every option per cell and
    the end-to-end validation."""
    it, cells, val = tables["iterations"], tables["cells"], tables["validation"]
    shape = "x".join(map(str, setting["input_shape"]))
    lines = [f"Time to {as_target(target).describe}: iterations to it (runs, mean ± std over seeds) x seconds per "
             f"iteration of each phase's option in each cell ({bench_path}: {setting['model']}, input {shape}, "
             f"batch {setting['batch_per_rank']}/rank, clock {setting['clock']}, overrides "
             f"{' '.join(setting['set']) or 'none'}). Seconds are on that clock; evaluation excluded.", "",
             "Iterations to the target:", "",
             pd.DataFrame({"aggregator": it["aggregator"], "N": it["N"], "variant": it["variant"],
                           "iterations": [_reached_pm(m, s, missing="not reached")
                                          for m, s in zip(it["mean"], it["std"])],
                           "reached": [f"{r}/{n}" for r, n in zip(it["reached"], it["seeds"])],
                           "ranked": it["ranked"]}).to_markdown(index=False), "",
             "Winner per cell (among the settings with a seed band: those run with fewer seeds are "
             f"{UNRANKED}, their fastest named apart with the modes the bench's intervals cannot tell from it; "
             "a setting that never reached the target is in no tie), its gain over overlapped fp16 and over "
             "its family's default setting:", "",
             _winners(cells).to_markdown(index=False), "",
             "Every option per cell (seconds to target, mean over seeds):", "",
             _every_option(cells), ""]
    if len(val):
        lines += [f"End to end (virtual time, emulated link): measured against composed, within "
                  f"{VALIDATION_TOLERANCE:.0%}:", "", val.to_markdown(index=False, floatfmt=".4g"), ""]
    return "\n".join(lines)
