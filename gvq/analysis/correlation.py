"""GradiVeQ's motivating observations on real gradients (paper sec. 1, Fig. 4 and Fig. 5).

    python -m gvq.analysis correlation --out runs/correlation iterations=150 [model=resnet20]

See docs/design.md#gvqanalysiscorrelationpy for how it works and why.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib
import torch

from gvq.compressors.gradiveq.pca import principal_subspace

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def conv_series(grads: list[torch.Tensor], net: torch.nn.Module, layer: int) -> tuple[torch.Tensor, tuple]:
    """(T, numel) float64 series of conv layer ``layer`` (0 = first conv) in the paper's layout."""
    shapes = [tuple(p.shape) for p in net.parameters()]
    offsets = [sum(math.prod(s) for s in shapes[:i]) for i in range(len(shapes))]
    convs = [i for i, s in enumerate(shapes) if len(s) == 4]
    if not 0 <= layer < len(convs):
        raise ValueError(f"layer={layer}: the model has {len(convs)} conv layers")
    i = convs[layer]
    F, D, H, W = shapes[i]
    block = torch.stack(grads)[:, offsets[i]: offsets[i] + F * D * H * W].double()
    return block.view(-1, F, D, H, W).permute(0, 3, 4, 2, 1).reshape(len(grads), -1), shapes[i]


def fig4(series: torch.Tensor, path_png: Path) -> dict:
    """PCA of the first three entries; fraction of variance in the top 2 components; the plot."""
    X = series[:, :3]
    C = X - X.mean(0)
    _, S, Vh = torch.linalg.svd(C, full_matrices=False)
    eig = S.square()
    frac = float(eig[:2].sum() / eig.sum()) if float(eig.sum()) > 0 else 1.0
    plane = C @ Vh[:2].T @ Vh[:2] + X.mean(0)               # projection onto the 2-PC plane
    fig = plt.figure(figsize=(6, 5))
    ax = fig.add_subplot(projection="3d")
    ax.scatter(*X.T.numpy(), s=8, c="tab:blue", label="gradients (g0, g1, g2)")
    ax.scatter(*plane.T.numpy(), s=4, c="tab:green", alpha=0.5, label="projection on 2 PCs")
    ax.set_xlabel("g0"), ax.set_ylabel("g1"), ax.set_zlabel("g2")
    ax.set_title(f"3 adjacent gradients, {len(X)} iterations: {100 * frac:.2f}% variance in 2 PCs")
    ax.legend(loc="upper left", fontsize=8)
    fig.savefig(path_png, dpi=110)
    plt.close(fig)
    return {"variance_2pc": frac, "eigenvalues": eig.tolist(), "iterations": len(X)}


def slice_sizes(numel: int, fd: int) -> list[int]:
    kmax = min(numel // 2, 4 * fd)                          # at least one other slice to compress
    if kmax - 1 <= 400:
        return list(range(2, kmax + 1))
    ks = set(range(2, kmax + 1, max(1, fd // 32)))
    for m in range(fd, kmax + 1, fd):
        ks.update(k for k in range(m - 3, m + 4) if 2 <= k <= kmax)
    return sorted(ks)


def slice_loss(series: torch.Tensor, K: int, lam: float) -> tuple[int, float, float]:
    """(d, loss with each slice's own mean, loss with the first slice's mean) at slice size K."""
    T, m = series.shape[0], series.shape[1] // K
    X = series[:, : m * K].reshape(T, m, K)
    first = X[:, 0]
    mu0 = first.mean(0)
    U = principal_subspace(first - mu0, T - 1, lam, mu0).U.double()
    rest = X[:, 1:]
    den = float(rest.square().sum())

    def resid(c):
        return float((c - (c @ U) @ U.T).square().sum()) / den if den > 0 else 0.0
    return U.shape[1], resid(rest - rest.mean(0)), resid(rest - mu0)


def fig5(series: torch.Tensor, fd: int, lam: float, out: Path):
    import pandas as pd
    rows = []
    for K in slice_sizes(series.shape[1], fd):
        d, loss, loss_mu0 = slice_loss(series, K, lam)
        rows.append({"K": K, "multiple_of_FD": K % fd == 0, "d": d, "ratio": K / d, "loss": loss,
                     "loss_first_mu": loss_mu0})
    df = pd.DataFrame(rows)
    prev, nxt = df.loss.shift(1), df.loss.shift(-1)
    df["local_min"] = (df.loss < prev.fillna(math.inf)) & (df.loss < nxt.fillna(math.inf))
    df.to_csv(out / "fig5_slice_loss.csv", index=False)
    mult, other = df[df.multiple_of_FD], df[~df.multiple_of_FD]
    summary = {"FD": fd, "median_loss_at_multiples": float(mult.loss.median()),
               "median_loss_between": float(other.loss.median()),
               "multiples_that_are_local_minima": f"{int(mult.local_min.sum())}/{len(mult)}"}
    summary["drops_at_multiples"] = summary["median_loss_at_multiples"] < summary["median_loss_between"]
    _plot5(df, fd, out / "fig5_slice_loss.png")
    return df, summary


def _plot5(df, fd: int, path_png: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(df.K, df.loss, "-", lw=1, label="loss (own slice mean)")
    ax.plot(df.K, df.loss_first_mu, "-", lw=0.8, alpha=0.6, label="loss (first slice mean)")
    for k in df.K[df.multiple_of_FD]:
        ax.axvline(k, color="grey", lw=0.5, ls=":")
    ax.set_xlabel(f"slice size K (dotted: multiples of F*D = {fd})")
    ax.set_ylabel("compression loss on other slices")
    ax2 = ax.twinx()
    ax2.plot(df.K, df.ratio, color="tab:red", lw=0.8, alpha=0.7)
    ax2.set_ylabel("compression ratio K/d", color="tab:red")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path_png, dpi=110)
    plt.close(fig)


def analysis_correlation(cfg, paths) -> dict:
    """``python -m gvq.analysis correlation``: train, write both figures; returns the Fig. 4 / Fig. 5
    summaries."""
    from gvq.schema.tool import namespace
    a = namespace(cfg, paths)
    if a.iterations < 3:
        raise ValueError(f"iterations={a.iterations}: must be >= 3")
    from gvq.analysis.record import record_gradients
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    grads, net = record_gradients(model=a.model, dataset="digits", iterations=a.iterations,
                                  batch_size=a.batch, seed=a.seed)
    series, shape = conv_series(grads, net, a.layer)
    info4 = {"model": a.model, "layer": a.layer, "shape": list(shape),
             **fig4(series, out / "fig4_scatter.png")}
    (out / "fig4.json").write_text(json.dumps(info4, indent=2))
    _, info5 = fig5(series, shape[0] * shape[1], a.lam, out)
    (out / "fig5.json").write_text(json.dumps(info5, indent=2))
    print(f"Fig. 4: conv layer {a.layer} {tuple(shape)}, {a.iterations} iterations: "
          f"{100 * info4['variance_2pc']:.2f}% of the variance of 3 adjacent gradients in 2 PCs")
    print(f"Fig. 5: F*D = {info5['FD']}: median loss {info5['median_loss_at_multiples']:.3g} at multiples "
          f"vs {info5['median_loss_between']:.3g} between; local minima at "
          f"{info5['multiples_that_are_local_minima']} multiples; drops at multiples: "
          f"{info5['drops_at_multiples']}")
    print(f"-> {out}")
    return {"fig4": info4, "fig5": info5}

