"""Quantization error of every scalar quantizer on recorded gradients (the ORQ paper's Fig. 2 metric)
and a check of the paper's claims about it.

``quantizer_error_table(grads)``: for each method, the mean over the given gradient vectors of
||Q(G) - G||^2 / ||G||^2, at s = 3, 5, 9 levels (QSGD-s, Linear-s, ORQ-s; TernGrad at s = 3), at two
levels (Scaled SignSGD, BinGrad-pb, BinGrad-b), plus GradiVeQ's 4-bit QSGD baseline (s = 15).
Stochastic methods are seeded (one draw per gradient), so the table is reproducible.
``check_claims(df)``: ORQ-s below QSGD-s and Linear-s at equal s; BinGrad-b below BinGrad-pb; and gvq's own:
every sort-free fit (``fit: histogram``, the default of ORQ, Linear and BinGrad) within 1% of the error of
the exact sorted fit (``error_sorted``, the same method with ``fit: sorted`` and the same dither seed).
``plot_errors(df, path)``: bars per method, grouped by level count, log scale (Agg, no display).
"""
from __future__ import annotations

import copy

import pandas as pd
import torch

from gvq.compressors.bingrad_b import BinGradB
from gvq.compressors.bingrad_pb import BinGradPB
from gvq.compressors.linear import Linear
from gvq.compressors.orq import ORQ
from gvq.compressors.qsgd import QSGD
from gvq.compressors.signsgd import ScaledSignSGD
from gvq.compressors.terngrad import TernGrad

LEVELS = (3, 5, 9)


def methods(bucket: int | None = 2048) -> list[tuple[str, str, int, object]]:
    """(method, family, levels, compressor) for every row of the table."""
    rows = []
    for s in LEVELS:
        rows += [(f"QSGD-{s}", "QSGD", s, QSGD(levels=s, bucket=bucket)),
                 (f"Linear-{s}", "Linear", s, Linear(levels=s, bucket=bucket)),
                 (f"ORQ-{s}", "ORQ", s, ORQ(levels=s, bucket=bucket))]
    rows += [("TernGrad", "TernGrad", 3, TernGrad(bucket=bucket)),
             ("SignSGD", "SignSGD", 2, ScaledSignSGD(bucket=bucket)),
             ("BinGrad-pb", "BinGrad-pb", 2, BinGradPB(bucket=bucket)),
             ("BinGrad-b", "BinGrad-b", 2, BinGradB(bucket=bucket)),
             ("QSGD 4-bit", "QSGD", 15, QSGD(bits=4, bucket=bucket))]
    return rows


def relative_error(comp, g: torch.Tensor) -> float:
    g = g.reshape(-1).float()
    seg = slice(0, g.numel())
    q = comp.decompress(comp.compress(g, seg), seg)
    denom = float(g.double().pow(2).sum())
    return float((q.double() - g.double()).pow(2).sum()) / denom if denom > 0 else 0.0


def quantizer_error_table(grads: list[torch.Tensor], bucket: int | None = 2048) -> pd.DataFrame:
    """One row per method: method, family, levels, error (mean), error_std, ratio (bytes, mean length),
    error_sorted (methods with a ``fit``: the mean error of their exact sorted fit; NaN for others)."""
    if not grads:
        raise ValueError("quantizer_error_table: no gradient vectors given")
    numel = round(sum(g.numel() for g in grads) / len(grads))
    out = []
    for name, family, s, comp in methods(bucket):
        comp.reseed(0)
        errs = torch.tensor([relative_error(comp, g) for g in grads], dtype=torch.float64)
        out.append({"method": name, "family": family, "levels": s, "error": float(errs.mean()),
                    "error_std": float(errs.std()) if len(errs) > 1 else 0.0,
                    "ratio": comp.ratio(numel), "ideal_ratio": comp.ideal_ratio,
                    "error_sorted": sorted_fit_error(comp, grads)})
    return pd.DataFrame(out)


FITTED = (Linear, ORQ, BinGradB, BinGradPB)     # the quantizers that fit their levels (a ``fit`` setting)


def sorted_fit_error(comp, grads: list[torch.Tensor]) -> float:
    """Mean error of ``comp``'s twin with ``fit: sorted``, same seed (common random numbers: the gap is
    the fits', not the draws'); NaN for a method without a fit."""
    if not isinstance(comp, FITTED) or comp.fit != "histogram":
        return float("nan")
    twin = copy.deepcopy(comp)
    twin.fit = "sorted"
    twin.reseed(0)
    return float(torch.tensor([relative_error(twin, g) for g in grads], dtype=torch.float64).mean())


def check_claims(df: pd.DataFrame) -> list[tuple[str, bool, str]]:
    """The ORQ paper's error claims, each as (claim, held, detail); claims whose rows are absent are
    skipped."""
    err = dict(zip(df["method"], df["error"]))
    pairs = [(f"ORQ-{s}", f"{other}-{s}") for s in LEVELS for other in ("QSGD", "Linear")]
    pairs.append(("BinGrad-b", "BinGrad-pb"))
    claims = []
    for low, high in pairs:
        if low in err and high in err:
            claims.append((f"{low} error < {high} error", bool(err[low] < err[high]),
                           f"{low} {err[low]:.4g} vs {high} {err[high]:.4g}"))
    for row in df[df["error_sorted"].notna()].itertuples() if "error_sorted" in df else ():
        gap = row.error / row.error_sorted - 1 if row.error_sorted > 0 else 0.0
        claims.append((f"{row.method} sort-free fit within 1% of sorted", bool(abs(gap) <= 0.01),
                       f"{row.error:.5g} vs {row.error_sorted:.5g}, {100 * gap:+.2f}%"))
    return claims


def plot_errors(df: pd.DataFrame, path_png) -> None:
    """Bar chart of the relative error, one group per level count, log scale."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    df = df.sort_values(["levels", "method"])
    fig = Figure(figsize=(max(6.0, 0.45 * len(df)), 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colors = {lv: f"C{i}" for i, lv in enumerate(sorted(df["levels"].unique()))}
    ax.bar(range(len(df)), df["error"], yerr=df["error_std"], color=[colors[lv] for lv in df["levels"]])
    ax.set_xticks(range(len(df)), [f"{m}\n(s={lv})" for m, lv in zip(df["method"], df["levels"])],
                  rotation=60, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("||Q(G) - G||^2 / ||G||^2")
    ax.set_title("Quantization error per method (lower is better)")
    fig.tight_layout()
    fig.savefig(path_png, dpi=120)
