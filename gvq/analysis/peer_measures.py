"""Per-method measurements for :mod:`gvq.analysis.peers` (``python -m gvq.analysis peers``): payload
bytes and relative compression errors of PowerSGD, GradiVeQ and 4-bit QSGD on recorded gradients, and
GradiVeQ's bytes predicted from its samples' PCA spectra, so that a knob (``KNOBS``) can be matched to a
byte target without refitting.  Gradients are model-order flat vectors; errors are relative, in float64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from gvq.compressors.gradiveq.codec import GradiVeQ
from gvq.compressors.gradiveq.pca import choose_d
from gvq.compressors.powersgd import PowerSGD
from gvq.compressors.qsgd import QSGD

KNOBS = ("lambda", "target_ratio")


# -- helpers -------------------------------------------------------------------------------------------
def split_params(flat: Tensor, shapes) -> list[Tensor]:
    """Views of a model-order flat vector as the parameters' shapes."""
    return [t.view(s) for t, s in zip(flat.split([math.prod(s) for s in shapes]), shapes)]


def conv_mask(shapes) -> Tensor:
    """True on conv weights (4-D parameters); identical in model order and GradiVeQ's layout (the
    layout permutes entries only within a parameter)."""
    parts = [torch.full((math.prod(s),), len(s) == 4, dtype=torch.bool) for s in shapes]
    return torch.cat(parts)


def rel_errors(x: Tensor, ref: Tensor, mask: Tensor) -> tuple[float, float]:
    """(||x - ref||^2 / ||ref||^2 on everything, the same on ``mask``), in float64."""
    d2 = (x.double() - ref.double()).square()
    r2 = ref.double().square()
    whole = float(d2.sum()) / float(r2.sum()) if float(r2.sum()) > 0 else 0.0
    den = float(r2[mask].sum())
    return whole, (float(d2[mask].sum()) / den if den > 0 else 0.0)


# -- PowerSGD ------------------------------------------------------------------------------------------
def powersgd_bytes(shapes, rank: int, min_compression_rate: float = 2.0) -> int:
    """PowerSGD's payload bytes per iteration (both passes), as the aggregator sends them."""
    return PowerSGD(shapes, rank, min_compression_rate, warm_start=True).bytes_per_iteration   # bytes: either way


def powersgd_run(grads: list[Tensor], shapes, rank: int, start: int, ef: bool,
                 min_compression_rate: float = 2.0, warm_start: bool = True, seed: int = 0) -> dict:
    """Run PowerSGD's two stages (one process: the sums are the payloads) on grads[start:], in order.
    Returns {iteration: (err, err_conv, err_vs_g, err_conv_vs_g)}: err of A(M) against M (M = g + e with
    EF, g without), *_vs_g against the fresh g (the same as err without EF)."""
    lr = PowerSGD(shapes, rank, min_compression_rate, warm_start, seed=seed)
    numel, seg, mask = lr.numel, slice(0, lr.numel), conv_mask(shapes)
    e = torch.zeros(numel)
    out = {}
    for t in range(start, len(grads)):
        g = grads[t].float()
        lr.begin()
        M = g + e if ef else g
        lr.p_stage.decompress(lr.p_stage.compress(M, seg), seg)       # P^ = orth(M Q)
        A = lr.q_stage.decompress(lr.q_stage.compress(M, seg), seg)   # P^ (M^T P^)^T, next Q kept
        if ef:
            e = M - A                       # raw blocks: A == M there, so e stays 0
        out[t] = (*rel_errors(A, M, mask), *rel_errors(A, g, mask))
    return out


# -- GradiVeQ: spectra, byte prediction and matching ----------------------------------------------------
@dataclass
class Spectrum:
    n: int          # slices in the group (floats per unit of d)
    K: int
    eig: Tensor     # descending eigenvalues of the sample covariance
    rank: int       # numerical rank, capped at the degrees of freedom (as pca.principal_subspace)


def spectra(comp: GradiVeQ, samples: Tensor) -> list[Spectrum]:
    """Per group, the spectrum :meth:`GradiVeQ.fit` would decompose (same centring, dof and rank rule;
    ``mu='slice'`` only), so that d for any lambda / target_ratio follows without refitting."""
    if comp.mu != "slice":
        raise ValueError("peers: only mu='slice' (the default) is supported")
    eps = torch.finfo(samples.dtype).eps
    L, out = samples.shape[0], []
    for g in comp.groups:
        blk = samples[:, g.start: g.stop].to(torch.float64).reshape(L, g.n, g.K)
        mean = blk.mean(0)
        if comp.pool:
            rows, dof = (blk - mean).reshape(L * g.n, g.K), g.n * (L - 1)
        else:
            rows, dof = blk[:, 0] - mean[0], L - 1
        S = torch.linalg.svdvals(rows)
        eig = S.square() / max(dof, 1)
        tol = float(S.max()) * max(rows.shape) * eps if S.numel() else 0.0
        rank = min(int((S > tol).sum()), dof)
        out.append(Spectrum(g.n, g.K, eig, 0 if float(eig.sum()) <= 0 else rank))
    return out


def predicted_ds(spec: list[Spectrum], lam: float = 0.0, target_ratio: float | None = None) -> list[int]:
    return [1 if s.rank == 0 else choose_d(s.eig, s.K, lam, s.rank, None, target_ratio) for s in spec]


def predicted_bytes(spec: list[Spectrum], raw: int, ds: list[int]) -> int:
    return 4 * (raw + sum(s.n * d for s, d in zip(spec, ds)))


def raw_count(comp: GradiVeQ) -> int:
    """Values GradiVeQ sends raw (non-conv parameters and conv tails)."""
    return comp.layout.numel - sum(g.n * g.K for g in comp.groups)


def match_knob(spec: list[Spectrum], raw: int, knob: str, target: int, steps: int = 60) -> float:
    """A ``knob`` value (lambda in [0, 1) or target_ratio > 1) whose predicted bytes are closest to
    ``target``.  Bytes never increase with either knob (a step function): bisection finds the crossing,
    then the value returned is the middle of the chosen step, far from its edges, so that round-off
    between this prediction and the real fit cannot flip a d."""
    if knob == "lambda":
        def f(v):
            return predicted_bytes(spec, raw, predicted_ds(spec, lam=v))
        lo, hi = 0.0, 1.0 - 1e-9

        def mid(a, b):
            return 0.5 * (a + b)
    elif knob == "target_ratio":
        def f(v):
            return predicted_bytes(spec, raw, predicted_ds(spec, target_ratio=v))
        lo, hi = 1.0 + 1e-9, 2.0 * max(s.K for s in spec)

        def mid(a, b):
            return math.sqrt(a * b)
    else:
        raise ValueError(f"knob={knob!r}: one of {KNOBS}")

    def edge(above):        # (a, b): above(f(a)) holds, above(f(b)) does not, b - a tiny
        a, b = lo, hi
        for _ in range(steps):
            m = mid(a, b)
            a, b = (m, b) if above(f(m)) else (a, m)
        return a, b

    if f(lo) <= target:
        best = f(lo)
    elif f(hi) >= target:
        best = f(hi)
    else:
        a, b = edge(lambda y: y >= target)          # f(a) >= target > f(b)
        best = min((f(a), f(b)), key=lambda y: (abs(y - target), -y))
    left = lo if f(lo) == best else edge(lambda y: y > best)[1]
    right = hi if f(hi) == best else edge(lambda y: y >= best)[0]
    return mid(left, right)


def layout_flat(comp: GradiVeQ, g: Tensor, shapes) -> Tensor:
    return comp.flatten(split_params(g.float(), shapes))


def fit_gradiveq(shapes, samples: Tensor, K, pool: bool, knob: str, value: float) -> GradiVeQ:
    kw = {"lam": value} if knob == "lambda" else {"target_ratio": value}
    return GradiVeQ(K=K, pool=pool, world_size=1, **kw).bind(shapes).fit(samples)


def gradiveq_errors(comp: GradiVeQ, flats: list[Tensor], mask: Tensor) -> list[tuple[float, float]]:
    """[(err, err_conv)] of decompress(compress(x)) against x for each layout-order gradient x."""
    seg = slice(0, comp.layout.numel)
    return [rel_errors(comp.decompress(comp.compress(x, seg), seg), x, mask) for x in flats]


def state_bytes(comp: GradiVeQ) -> int:
    ds, vals = comp.pca.tensors()
    return ds.numel() * ds.element_size() + vals.numel() * vals.element_size()


# -- QSGD ------------------------------------------------------------------------------------------------
def qsgd(norm: str) -> QSGD:
    q = QSGD(bits=4, bucket=2048, norm=norm)
    q.reseed(0)
    return q


def qsgd_errors(comp: QSGD, grads: list[Tensor], mask: Tensor) -> list[tuple[float, float]]:
    out = []
    for g in grads:
        g = g.float()
        seg = slice(0, g.numel())
        out.append(rel_errors(comp.decompress(comp.compress(g, seg), seg), g, mask))
    return out
