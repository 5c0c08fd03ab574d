"""The error-cost frontier at equal bytes: GradiVeQ over its slice size K and PowerSGD over its rank, on
REAL gradients.

    python -m gvq.analysis frontier [model=cnn dataset=digits ratios=[4,8,16] rank=[1,2,4,8] ...]

See docs/design.md#gvqanalysisfrontierpy for how it works and why.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from gvq.analysis.peer_measures import (
    fit_gradiveq,
    layout_flat,
    match_knob,
    powersgd_bytes,
    powersgd_run,
)
from gvq.analysis.peers import PeerSetup, error_stats, gradiveq_probes, gradiveq_row
from gvq.bench.common import median_seconds, one_thread
from gvq.compressors.powersgd import PowerSGD

COLUMNS = ["method", "K", "pool", "rank", "ratio", "actual_ratio", "bytes", "matched", "in_budget", "d_range",
           "error", "codec_ms", "compress_ms", "decompress_ms", "error_x_ms", "error_median", "error_conv",
           "n_eval", "d", "K_per_layer", "config"]
PRINTED = ["method", "K", "pool", "rank", "ratio", "actual_ratio", "bytes", "matched", "in_budget", "d_range",
           "error", "codec_ms", "compress_ms", "decompress_ms", "error_x_ms"]


def slice_multiples(shapes) -> list[str]:
    """``x1`` .. ``x<H W>`` for the largest conv kernel: every multiple of F*D GradiVeQ accepts per
    layer that still compresses something (a larger K leaves every layer raw)."""
    hw = [int(s[2]) * int(s[3]) for s in shapes if len(s) == 4]
    if not hw:
        raise ValueError("frontier: no conv layer (4-D parameter) for GradiVeQ to compress")
    return [f"x{m}" for m in range(1, max(hw) + 1)]


def single_thread_ms(fns, reps: int) -> list[float]:
    """Median milliseconds per call of each function, with one intra-op thread."""
    with one_thread():
        return [1e3 * median_seconds(fn, reps) for fn in fns]


def powersgd_codec_ms(shapes, rank: int, x: torch.Tensor, reps: int, min_compression_rate: float,
                      seed: int) -> list[float]:
    """[compress, decompress] ms of PowerSGD rank ``rank`` on ``x``, both passes."""
    lr = PowerSGD(shapes, rank, min_compression_rate, warm_start=True, seed=seed)   # one pass: either way
    seg = slice(0, lr.numel)
    lr.begin()
    p = lr.p_stage.compress(x, seg)
    lr.p_stage.decompress(p, seg)               # P^ for pass Q's compress
    q = lr.q_stage.compress(x, seg)

    def compress():
        lr.begin()                              # resets the list pass Q appends its payload to
        lr.p_stage.compress(x, seg)
        lr.q_stage.compress(x, seg)

    def decompress():
        lr.p_stage.decompress(p, seg)
        lr.q_stage.decompress(q, seg)
    return single_thread_ms([compress, decompress], reps)


def powersgd_frontier_row(setup: PeerSetup, rank: int, reps: int, min_compression_rate: float,
                          seed: int) -> dict:
    res = powersgd_run(setup.grads, setup.shapes, rank, setup.warmup, False, min_compression_rate,
                       seed=seed)
    st = error_stats([res[t][:2] for t in setup.eval_idx])
    nb = powersgd_bytes(setup.shapes, rank, min_compression_rate)
    x = setup.grads[setup.eval_idx[0]].float()
    c, d = powersgd_codec_ms(setup.shapes, rank, x, reps, min_compression_rate, seed)
    return {"method": "PowerSGD", "K": None, "pool": None, "rank": rank, "ratio": 4 * setup.numel / nb,
            "bytes": nb, "matched": True, "d_range": None, "d": None, "K_per_layer": None,
            "error": st["err_mean"], "error_median": st["err_median"], "error_conv": st["err_conv_mean"],
            "n_eval": st["n_eval"], "compress_ms": c, "decompress_ms": d,
            "config": f"warm start, no error feedback, min_compression_rate {min_compression_rate:g}"}


def gradiveq_frontier_row(setup: PeerSetup, probe, ratio: float, reps: int, tolerance: float,
                          log) -> dict:
    """GradiVeQ at ``probe``'s (K, pool) matched to 4 numel / ``ratio`` bytes (``target_ratio`` knob)
    in every cycle; timed on a fit of the first cycle."""
    target = round(4 * setup.numel / ratio)
    row = gradiveq_row(setup, probe, "target_ratio", ratio, target, 0, tolerance, log)  # 0: sched unused
    fit, ev = setup.cycles[0]
    v = match_knob(probe.specs[0], probe.raw, "target_ratio", target)
    comp = fit_gradiveq(setup.shapes, setup.fitting_samples(probe.comp, fit), probe.K, probe.pool,
                        "target_ratio", v)
    x, seg = layout_flat(comp, setup.grads[ev.start], setup.shapes), slice(0, setup.numel)
    payload = comp.compress(x, seg)
    c, d = single_thread_ms([lambda: comp.compress(x, seg), lambda: comp.decompress(payload, seg)], reps)
    ds = [st["d"] for st in comp.layer_stats()]
    return {"method": "GradiVeQ", "K": str(probe.K), "pool": probe.pool, "rank": None, "ratio": ratio,
            "bytes": row["bytes"], "matched": bool(row["matched"]), "d_range": f"{min(ds)}-{max(ds)}",
            "d": "/".join(map(str, ds)), "K_per_layer": "/".join(str(g.K) for g in comp.groups),
            "error": row["err_mean"], "error_median": row["err_median"], "error_conv": row["err_conv_mean"],
            "n_eval": row["n_eval"], "compress_ms": c, "decompress_ms": d, "config": row["config"]}


def frontier_table(grads, shapes, Ks=None, ratios=(4, 8, 16), ranks=(1, 2, 4, 8), pools=(True,),
                   warmup: int = 50, L_t: int = 50, L_c: int = 80, samples: str = "exact", reps: int = 7,
                   tolerance: float = 0.03, min_compression_rate: float = 2.0, seed: int = 0,
                   log=print) -> pd.DataFrame:
    """One row per configuration (docs/design.md#gvqanalysisfrontierpy); ``Ks`` None = :func:`slice_multiples`."""
    setup = PeerSetup(grads, [torch.Size(s) for s in shapes], warmup, L_t, L_c, samples)
    Ks = slice_multiples(setup.shapes) if Ks is None else Ks
    rows = [powersgd_frontier_row(setup, r, reps, min_compression_rate, seed) for r in ranks]
    for probe in gradiveq_probes(setup, Ks, pools, log).values():
        rows += [gradiveq_frontier_row(setup, probe, ratio, reps, tolerance, log) for ratio in ratios]
    df = pd.DataFrame(rows)
    df["actual_ratio"] = 4.0 * setup.numel / df["bytes"]
    df["in_budget"] = (df["method"] != "GradiVeQ") | (df["actual_ratio"] * (1 + tolerance) >= df["ratio"])
    df["codec_ms"] = df["compress_ms"] + df["decompress_ms"]
    df["error_x_ms"] = df["error"] * df["codec_ms"]
    return df[COLUMNS]


def recommend_K(df: pd.DataFrame, ratio: float = 8) -> pd.Series | None:
    """The GradiVeQ row at ``ratio`` within its byte budget (``in_budget``) with the lowest error x
    codec_ms, ties to the lower error; None if no GradiVeQ row at that ratio is within budget."""
    cand = df[(df["method"] == "GradiVeQ") & (df["ratio"] == ratio) & df["in_budget"].astype(bool)]
    if cand.empty:
        return None
    score = cand["error"] * (cand["compress_ms"] + cand["decompress_ms"])
    return cand.assign(_s=score).sort_values(["_s", "error"], kind="stable").iloc[0].drop("_s")


def recommendation_line(df: pd.DataFrame, ratio: float = 8) -> str:
    best = recommend_K(df, ratio)
    if best is None:
        return f"recommendation at ratio {ratio:g}: none (no GradiVeQ configuration within its bytes)"
    cand = df[(df["method"] == "GradiVeQ") & (df["ratio"] == ratio) & df["in_budget"].astype(bool)]
    low, fast = cand.loc[cand["error"].idxmin()], cand.loc[cand["codec_ms"].idxmin()]
    pool = " pooled" if best["pool"] else ""
    return (f"recommendation at ratio {ratio:g}: K={best['K']}{pool} (d {best['d_range']}, actual ratio "
            f"{best['actual_ratio']:.3g}) has the least error per codec-millisecond (lowest error x codec_ms "
            f"among the {len(cand)} GradiVeQ configurations within ratio {ratio:g}'s bytes): error "
            f"{best['error']:.4g} x {best['codec_ms']:.3g} ms = {best['error'] * best['codec_ms']:.4g}; "
            f"lowest error: K={low['K']} ({low['error']:.4g}, {low['codec_ms']:.3g} ms), "
            f"fastest: K={fast['K']} ({fast['error']:.4g}, {fast['codec_ms']:.3g} ms)")


def plot_frontier(df: pd.DataFrame, path_png) -> None:
    """Error against codec time (log-log): one marker series per ratio (GradiVeQ rows within its bytes,
    labelled by K; hollow: capped below the target bytes), PowerSGD as its own series (by rank)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 5.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    g = df[(df["method"] == "GradiVeQ") & df["in_budget"].astype(bool)]
    for i, (ratio, part) in enumerate(g.groupby("ratio")):
        face = [f"C{i}" if m else "none" for m in part["matched"].astype(bool)]
        ax.scatter(part["codec_ms"], part["error"], marker="os^Dv"[i % 5], edgecolors=f"C{i}",
                   facecolors=face, label=f"GradiVeQ {ratio:g}x")
        for _, r in part.iterrows():
            ax.annotate(f"{r['K']}{'' if r['pool'] else ' np'}", (r["codec_ms"], r["error"]), fontsize=6)
    p = df[df["method"] == "PowerSGD"]
    ax.plot(p["codec_ms"], p["error"], "x--", color="k", label="PowerSGD (rank r)")
    for _, r in p.iterrows():
        ax.annotate(f"r{r['rank']:g} ({r['ratio']:.0f}x)", (r["codec_ms"], r["error"]), fontsize=6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("codec time per call, compress + decompress (ms, 1 thread)")
    ax.set_ylabel("||D(C(g)) - g||^2 / ||g||^2 (held-out gradients)")
    ax.set_title("Error vs codec time at equal bytes (hollow: fewer bytes than the ratio allows)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path_png, dpi=120)


def analysis_frontier(cfg, paths) -> int:
    """``python -m gvq.analysis frontier``: the table, its figure and the recommended K."""
    from gvq.analysis.record import record_gradients
    from gvq.schema.tool import choose, namespace
    a = namespace(cfg, paths)
    choose("samples", a.samples, ("exact", "qsgd"))
    grads, net = record_gradients(a.model, a.dataset, a.iterations, batch_size=a.batch, lr=a.lr, seed=a.seed)
    shapes = [p.shape for p in net.parameters()]
    df = frontier_table(grads, shapes, a.K, a.ratios, a.rank, list(dict.fromkeys(a.pool)),
                        a.warmup, a.L_t, a.L_c, a.samples, a.reps, a.tolerance, a.min_compression_rate, a.seed)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "frontier.csv", index=False)
    plot_frontier(df, out / "frontier.png")
    print(f"# {a.model} on {a.dataset}, batch {a.batch}, {sum(s.numel() for s in shapes)} values; "
          f"{a.iterations} iterations, warmup {a.warmup}, cycles of L_t={a.L_t} fitting / <= L_c={a.L_c} "
          f"evaluation gradients ({int(df['n_eval'].iloc[0])} evaluated); bytes = payload per gradient; "
          f"ms = median of {a.reps} calls, 1 thread")
    blank = ("K", "pool", "rank", "d_range")
    shown = df[PRINTED].astype({"rank": "Int64"}).astype({c: object for c in blank})
    print(shown.fillna({c: "-" for c in blank}).to_markdown(index=False, floatfmt=".4g"))
    print(recommendation_line(df, a.recommend_at))
    print(f"-> {out}/frontier.csv, .png")
    return 0
