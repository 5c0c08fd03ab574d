"""Are a stochastic quantizer's draws independent within a call and across calls?  ``python -m
gvq.analysis dither`` (the check behind ``tests/analysis/test_dither.py``).

See docs/design.md#gvqanalysisditherpy for how it works and why.
"""
from __future__ import annotations

import math

import torch

from gvq.compressors.bingrad_pb import BinGradPB
from gvq.compressors.linear import Linear
from gvq.compressors.orq import ORQ
from gvq.compressors.qsgd import QSGD
from gvq.compressors.terngrad import TernGrad

#: every stochastic quantizer configuration (GradiVeQ's sampling QSGD is ``qsgd4_max``)
CONFIGS = {
    "qsgd4_max": lambda: QSGD(bits=4, norm="max"),
    "qsgd4_l2": lambda: QSGD(bits=4, norm="l2"),
    "qsgd2_max": lambda: QSGD(bits=2, norm="max"),
    "qsgd5": lambda: QSGD(levels=5),
    "terngrad": lambda: TernGrad(),
    "terngrad_clip": lambda: TernGrad(clip=2.5),
    "orq3": lambda: ORQ(levels=3),
    "orq5": lambda: ORQ(levels=5),
    "orq9": lambda: ORQ(levels=9),
    "linear5": lambda: Linear(levels=5),
    "bingrad_pb": lambda: BinGradPB(),
}
LAGS = (1, 2, 3, 5, 10)


def total_errors(comp, v: torch.Tensor, calls: int) -> tuple[torch.Tensor, float]:
    """(T_t for each call, sum_i var(e_i) estimated over the calls)."""
    seg = slice(0, v.numel())
    s1 = torch.zeros(v.numel(), dtype=torch.float64)
    s2 = torch.zeros(v.numel(), dtype=torch.float64)
    totals = torch.empty(calls, dtype=torch.float64)
    for t in range(calls):
        e = (comp.decompress(comp.compress(v, seg), seg) - v).double()
        totals[t] = e.sum()
        s1 += e
        s2 += e * e
    per_element = (s2 / calls - (s1 / calls) ** 2) * calls / (calls - 1)
    return totals, float(per_element.sum())


def independence(comp, v: torch.Tensor, calls: int = 2000, block: int = 100) -> dict:
    """z-scores of the statistics in docs/design.md#gvqanalysisditherpy (0 +- 1 under independence)."""
    totals, var_sum = total_errors(comp, v, calls)
    x = totals - totals.mean()
    var_t = float((x * x).sum() / (calls - 1))
    out = {"calls": calls, "numel": v.numel(), "var_T": var_t, "sum_var_e": var_sum,
           "z_within": (var_t / var_sum - 1) / math.sqrt(2 / (calls - 1))}
    for k in LAGS:
        r = float((x[:-k] * x[k:]).sum() / (x * x).sum())
        out[f"z_lag{k}"] = r * math.sqrt(calls)
    m = calls // block
    sums = totals[: m * block].view(m, block).sum(dim=1)
    out["block_var_ratio"] = float(sums.var()) / (block * var_t)
    out["z_block"] = (out["block_var_ratio"] - 1) / math.sqrt(2 / (m - 1))
    return out


def independence_table(names, sizes, calls: int = 2000, block: int = 100, seed: int = 0):
    """One row per (quantizer, vector size): the z-scores, on a Laplace-distributed vector."""
    import pandas as pd

    from gvq.bench.quantizers import laplace_vector
    torch.set_num_threads(1)
    rows = []
    for numel in sizes:
        v = laplace_vector(numel, seed=seed)
        for name in names:
            comp = CONFIGS[name]()
            comp.reseed(seed)
            rows.append({"quantizer": name, **independence(comp, v, calls, block)})
    return pd.DataFrame(rows)


def verdict(row, z_lag: float = 5.0, z_block: float = 4.0, z_within: float = 4.0) -> bool:
    """The bar for independence: lag autocorrelations within 5 SE, block sums and the within-call variance 4 SE."""
    lags = max(abs(row[f"z_lag{k}"]) for k in LAGS)
    return lags <= z_lag and abs(row["z_block"]) <= z_block and abs(row["z_within"]) <= z_within


def analysis_dither(cfg, paths) -> int:
    """``python -m gvq.analysis dither``: the table, and exit status 1 where some draw is not independent."""
    from gvq.schema.tool import choose, namespace
    args = namespace(cfg, paths)
    args.quantizers = args.quantizers or list(CONFIGS)
    choose("quantizers", args.quantizers, list(CONFIGS))
    df = independence_table(args.quantizers, args.sizes, args.calls, args.block)
    df["independent"] = [verdict(r) for _, r in df.iterrows()]
    print(f"# z-scores of {args.calls} consecutive calls (0 +- 1 if independent; "
          f"bar: |lag| <= 5, |block|, |within| <= 4)")
    print(df.to_markdown(index=False, floatfmt=".3g"))
    if args.out:
        df.to_csv(args.out, index=False)
    print(f"{int(df['independent'].sum())} of {len(df)} configurations independent")
    return 0 if df["independent"].all() else 1
