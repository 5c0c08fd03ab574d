"""PCA for GradiVeQ (sec. 2-3): principal directions of centred gradient samples and the choice of d.

See docs/design.md#gvqcompressorsgradiveqpcapy for how it works and why.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class PCAFit:
    U: Tensor           # (K, d) float32, orthonormal columns, descending eigenvalue
    d: int
    energy: float       # sum(eig[:d]) / sum(eig): 1 - (relative loss on the centred samples)
    rank: int           # numerical rank of the centred samples


def choose_d(eig: Tensor, K: int, lam: float, rank: int, d: int | None = None,
             target_ratio: float | None = None) -> int:
    """d for one group from its descending eigenvalues (the order: docs/design.md#gvqcompressorsgradiveqpcapy)."""
    if d is not None:
        want = d
    elif target_ratio is not None:
        want = max(1, round(K / target_ratio))
    else:
        frac = eig.cumsum(0)
        frac = frac / frac[-1]                   # exactly 1 at the end, so lambda = 0 reaches the rank
        want = int((frac < 1.0 - lam).sum()) + 1
    return max(1, min(want, rank))


def principal_subspace(centred: Tensor, dof: int, lam: float, fallback: Tensor, d: int | None = None,
                       target_ratio: float | None = None, eps: float | None = None) -> PCAFit:
    """Fit U_d on the (rows x K) centred samples; ``fallback`` is the zero-variance direction; ``eps``
    the precision of the recorded samples (default: ``centred``'s dtype) sets the rank tolerance."""
    eps = torch.finfo(centred.dtype).eps if eps is None else eps
    X = centred.to(torch.float64)
    K = X.shape[1]
    S, top = _spectrum(X, eps)
    eig = S.square() / max(dof, 1)
    if X.device.type == "meta":       # shapes only (a dry run): full rank, d as asked or the rank
        rank = max(1, min(dof, *X.shape))
        k = min(rank, d if d is not None else max(1, round(K / target_ratio)) if target_ratio else rank)
        return PCAFit(top(k).T.float().contiguous(), k, float("nan"), rank)
    tol = float(S.max()) * max(X.shape) * eps if S.numel() else 0.0
    rank = min(int((S > tol).sum()), dof)
    if rank == 0 or float(eig.sum()) <= 0.0:
        u = fallback.to(torch.float64).reshape(K, 1)
        norm = float(u.norm())
        if norm == 0.0:
            u = torch.zeros(K, 1, dtype=torch.float64, device=fallback.device)
            u[0, 0] = 1.0
        else:
            u = u / norm
        return PCAFit(u.float().contiguous(), 1, 1.0, 0)
    k = choose_d(eig, K, lam, rank, d, target_ratio)
    energy = float(eig[:k].sum() / eig.sum())
    return PCAFit(top(k).T.float().contiguous(), k, energy, rank)


def _spectrum(X: Tensor, eps: float):
    """Singular values (descending) of X, float64, and ``top(k)``: its first k right singular vectors
    (rows) -- only the kept ones are formed (sample space: k of the L_t rows, a GEMM saved in proportion).

    Where the samples were recorded in float32 or coarser (``eps``), through the smaller of the two
    Gram matrices, X X^T (rows x rows, the sample space: the paper's L_t x L_t) or X^T X (K x K), and one
    symmetric eigendecomposition: several times faster than LAPACK's SVD on these shapes.  Its singular
    values are good to ~1e-8 of the largest (float64's sqrt(eps)), far below the rank tolerance such
    samples get (max(S) * max(rows, K) * 1.2e-7), so the rank, d, the energies and the kept directions
    (up to sign) are the SVD's within float tolerance.  Float64 samples take the SVD."""
    rows, K = X.shape
    if eps < torch.finfo(torch.float32).eps or X.device.type == "meta" or min(rows, K) == 0:
        _, S, Vh = torch.linalg.svd(X, full_matrices=False)
        return S, lambda k: Vh[:k]
    if rows < K:                                   # sample space: V = X^T (P / S), 1/S folded into the
        w, P = torch.linalg.eigh(X @ X.T)          # small P, V formed (K, k) so the fit's U needs no
        S = w.flip(0).clamp_(min=0.0).sqrt()       # transposed copy (top(k) is its transposed view)
        return S, lambda k: (X.T @ (P[:, -k:].flip(1) / torch.where(S[:k] > 0, S[:k], 1.0))).T
    w, V = torch.linalg.eigh(X.T @ X)              # K space
    return w.flip(0).clamp_(min=0.0).sqrt(), lambda k: V[:, -k:].flip(1).T
