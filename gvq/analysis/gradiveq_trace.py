"""Why GradiVeQ's Eq. 7 loss grows once the gradient shrinks: a per-layer trace on real gradients.

GradiVeQ reconstructs ``g_hat = U_d U_d^T (g - mu) + mu`` (Eq. 3-5), with ``mu`` the mean of the fitting
window's gradients.  Its relative error splits exactly (``U_d`` has orthonormal columns) into what the basis
misses of the centred gradient: ``||(I - U_d U_d^T)(g - mu)||^2 / ||g||^2``.  When the gradient shrinks after
the fitting window, ``mu`` (from larger gradients) can dominate ``g - mu``: the error is then mostly the stale
mean, not the subspace.  Per compressed iteration and layer this module reports

* ``err``: the codec's own relative error (decompress(compress(g)) against g);
* ``ref_err``: the same from an independent float64 reference of Eq. 3-6 (numpy SVD of the same samples),
  so a gap between the two is gvq's implementation, not the method;
* ``mean_share``: ||mu||^2 / ||g||^2 (above 1: the fitted mean is larger than the gradient it is added to);
* ``captured``: the share of ||g - mu||^2 the basis keeps; ``err_no_mean``: the error of the same basis
  with no mean subtracted or added, ||(I - U_d U_d^T) g||^2 / ||g||^2, i.e. what the mean costs; ``d``, ``K``.

Gradients come from one worker's plain SGD run (:func:`gvq.analysis.record.record_gradients`): the ones
GradiVeQ would see if its compression were exact (open loop), fitted on exact samples.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from gvq.analysis.peer_measures import layout_flat
from gvq.compressors.gradiveq.codec import GradiVeQ

WINDOW = 50     # iterations per summary row; fewer => a finer trace, noisier medians


def reference_fit(samples: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 2 and 6 in float64 on one group's samples (L, n, K), fitted on its first slice as s = inf does:
    (U_d (K, d), every slice's mean (n, K))."""
    mu = samples.mean(0)
    rows = samples[:, 0, :] - mu[0]
    _, s, vt = np.linalg.svd(rows, full_matrices=False)
    energy = np.cumsum(s ** 2) / max(float((s ** 2).sum()), 1e-300)
    d = int(np.searchsorted(energy, 1.0 - lam - 1e-12) + 1)
    return vt[:d].T, mu


def _group_row(x: Tensor, g, U: Tensor, mu: Tensor, ref: tuple[np.ndarray, np.ndarray]) -> dict:
    """The trace's numbers for one group (slices of one layer) of one layout-order gradient ``x``."""
    G = x[g.start: g.stop].double().view(g.n, g.K)
    U, mu = U.double(), mu.double()
    g2 = float(G.square().sum())
    c = G - mu
    c2, p2 = float(c.square().sum()), float((c @ U).square().sum())
    Ur, mur = ref
    cr = G.numpy() - mur
    ref_resid = float((cr ** 2).sum() - ((cr @ Ur) ** 2).sum())
    return {"layer": g.layer, "K": g.K, "d": int(U.shape[1]), "g_norm2": g2,
            "mean_share": float(mu.square().sum()) / g2, "captured": p2 / c2 if c2 > 0 else 1.0,
            "err_no_mean": max(g2 - float((G @ U).square().sum()), 0.0) / g2,
            "ref_err": max(ref_resid, 0.0) / g2}


def trace(grads: list[Tensor], shapes, warmup: int, L_t: int, L_c: int, lam: float = 0.01,
          K="auto") -> pd.DataFrame:
    """One row per (compressed iteration, group) of the first cycle: fit on grads[warmup : warmup + L_t],
    evaluate on the next L_c."""
    fit, ev = range(warmup, warmup + L_t), range(warmup + L_t, min(len(grads), warmup + L_t + L_c))
    if len(ev) < 1:
        raise ValueError(f"{len(grads)} gradients: need more than warmup + L_t = {warmup + L_t}")
    comp = GradiVeQ(K=K, lam=lam, world_size=1).bind(shapes)
    samples = torch.stack([layout_flat(comp, grads[t], shapes) for t in fit])
    comp.fit(samples)
    pca = comp.pca
    refs = [reference_fit(samples[:, g.start: g.stop].double().view(len(fit), g.n, g.K).numpy(), lam)
            for g in comp.groups]
    rows, whole = [], slice(0, comp.layout.numel)
    for t in ev:
        x = layout_flat(comp, grads[t], shapes)
        xhat = comp.decompress(comp.compress(x, whole), whole)
        for g, U, mu, ref in zip(comp.groups, pca.U, pca.mu, refs):
            row = _group_row(x, g, U, mu, ref)
            diff = (xhat[g.start: g.stop] - x[g.start: g.stop]).double()
            rows.append({"iteration": t, **row, "err": float(diff.square().sum()) / row["g_norm2"]})
    return pd.DataFrame(rows)


def summarise(df: pd.DataFrame, window: int = WINDOW) -> pd.DataFrame:
    """Per window of iterations: medians over iterations of the whole-vector (all groups) quantities, and
    each window's worst layer by median error."""
    w = df.assign(window=(df.iteration - df.iteration.min()) // window)
    rows = []
    for _, part in w.groupby("window"):
        per_it = part.groupby("iteration")
        g2 = per_it.g_norm2.sum()
        def whole(col):                     # an energy-weighted sum over groups, per iteration
            return (part[col] * part.g_norm2).groupby(part.iteration).sum() / g2
        worst = part.groupby("layer").err.median().idxmax()
        rows.append({"iterations": f"{part.iteration.min()}-{part.iteration.max()}",
                     "err (codec)": whole("err").median(), "err (reference)": whole("ref_err").median(),
                     "err, no mean": whole("err_no_mean").median(),
                     "||mu||^2/||g||^2": whole("mean_share").median(),
                     "captured of g - mu": part.captured.median(), "||g||^2": g2.median(),
                     "worst layer": int(worst), "its err": part[part.layer == worst].err.median()})
    return pd.DataFrame(rows)


def analysis_gradiveq_trace(cfg, paths) -> int:
    """``python -m gvq.analysis gradiveq_trace``: the per-layer trace, its CSV and its medians."""
    from pathlib import Path

    from gvq.analysis.record import record_gradients
    from gvq.schema.tool import namespace
    args = namespace(cfg, paths)
    grads, net = record_gradients(args.model, args.dataset, args.warmup + args.L_t + args.L_c, args.batch,
                                  args.lr, args.seed)
    shapes = [q.shape for q in net.parameters()]
    df = trace(grads, shapes, args.warmup, args.L_t, args.L_c, args.lam)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "trace.csv", index=False)
    layers = df.groupby("layer").agg(K=("K", "first"), d=("d", "first"), err=("err", "median"),
                                     mean_share=("mean_share", "median"), captured=("captured", "median"),
                                     err_no_mean=("err_no_mean", "median")).reset_index()
    print(f"# GradiVeQ's error on {args.model} / {args.dataset} gradients (one worker, batch {args.batch}, "
          f"lr {args.lr}, seed {args.seed}): fitted on iterations {args.warmup}-{args.warmup + args.L_t - 1}, "
          f"lambda {args.lam}; medians")
    print(summarise(df).to_markdown(index=False, floatfmt=".3g"))
    print("\n# per layer, over the whole compressed phase")
    print(layers.to_markdown(index=False, floatfmt=".3g"))
    print(f"-> {out}/trace.csv")
    return 0
