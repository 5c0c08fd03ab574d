"""GradiVeQ vs PowerSGD at equal bytes: compression error on REAL gradients (the issue's error half;
the timing half is ``python -m gvq.bench aggregate``, whose random gradients make errors meaningless).

    python -m gvq.analyze peers [--model cnn --dataset digits --rank 2 4 --K auto x1 ...]

What is recorded: one process trains the model with plain SGD (no compression anywhere, so every method
sees the same trajectory) at ``--batch`` 128, standing for the aggregate of N = 4 ranks x 32; every
iteration's gradient is kept (:func:`gvq.analysis.record.record_gradients`).  In one process "the sum
over ranks" (GradiVeQ's Eq. 2 samples, PowerSGD's sum of M_w) is that one gradient; relative errors are
scale-free, so sum vs mean does not matter.  What one process cannot show: per-rank error-feedback
memories (their sum equals the single residual here, in exact arithmetic) and QSGD's compounding over
the decode-add-encode ring's hops.

Schedule (:func:`schedule`): ``warmup`` iterations are skipped, then cycles of {``L_t`` fitting
gradients, ``L_c`` evaluation gradients}, as GradiVeQ's {sample, refresh, compress}.  GradiVeQ is
fitted on a cycle's L_t gradients (``samples='qsgd'``: each passed through one 4-bit max-norm QSGD
encode first, as the paper's sampling phase sends them) and evaluated on the FOLLOWING L_c only.
PowerSGD runs from the first post-warmup iteration on every gradient (its warm-started Q and its
error-feedback memory evolve as in training) and is scored on the same evaluation iterations.

Equal bytes: PowerSGD's payload per iteration is ``PowerSGD(shapes, r).bytes_per_iteration`` (P and Q
of every low-rank matrix, 1-D and no-gain parameters raw in pass P, exactly what the aggregator sends).
GradiVeQ's is ``payload_nbytes`` of the whole vector (d floats per compressed slice, raw values as they
are).  For each knob in ``match`` GradiVeQ is matched by bisection on that knob: ``lambda`` (Eq. 6, the
paper's per-layer energy rule) or ``target_ratio`` (d = K / ratio in every layer).  The bisection runs on
d's predicted from each group's PCA spectrum (one SVD per group, the same centring and rank rule as
:meth:`GradiVeQ.fit`); the chosen knob is then fitted for real and its actual bytes are reported.  Both
are payload bytes of one whole vector: a ring all-reduce sends 2(N-1)/N of that per rank for either.
GradiVeQ's reachable range is bounded: below by its raw part (every non-conv parameter, e.g. the FC
layer, travels raw, where PowerSGD compresses it), above by d <= rank of the samples (<= L_t - 1, or
n (L_t - 1) with ``pool``).  Outside it the closest match is reported with ``matched=False``.

Errors, all relative, whole vector (raw parts count as exact, in the denominator too), mean and median
over the evaluation iterations (``err_conv_*``: conv weights only, = GradiVeQ's Eq. 7 with no tails):

* ``PowerSGD``: ||A(g) - g||^2 / ||g||^2, A = one warm-started rank-r power step, no error feedback;
* ``PowerSGD+EF``: ||A(M) - M||^2 / ||M||^2 with M = g + e the input including the residual e (what
  the aggregator logs as ``compression_error``), then e <- M - A(M);
* ``PowerSGD+EF (t vs g)``: same run, ||A(M) - g||^2 / ||g||^2: the transmitted vs this iteration's
  fresh gradient (can exceed 1: it carries older residuals on purpose);
* ``GradiVeQ``: ||U U^T (g - mu) + mu - g||^2 / ||g||^2 (decompress(compress(g)), N = 1);
* ``QSGD 4-bit``: one encode (bucket 2048), ``max`` norm (the repo's RAR default) and ``l2`` (papers),
  a reference at its own bytes (ratio ~8), seeded.

``sched_bytes``: payload bytes per iteration averaged over one GradiVeQ cycle: L_t sampling iterations
at 4-bit QSGD and L_c at GradiVeQ's payload (every rank fits itself: ``fit_sync: local``, the paper's
way).  ``relay_bytes`` (CSV): the PCA state (U_d, mu) that ``fit_sync: broadcast`` relays once per
refresh on top (a relay sends it (N-1)/N times per rank, an all-reduce 2(N-1)/N times its payload).
For PowerSGD and QSGD ``sched_bytes`` equals ``bytes``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from ..compressors.gradiveq import GradiVeQ
from ..compressors.pca import choose_d
from ..compressors.powersgd import PowerSGD
from ..compressors.qsgd import QSGD

KNOBS = ("lambda", "target_ratio")


# -- schedule ------------------------------------------------------------------------------------------
def schedule(total: int, warmup: int, L_t: int, L_c: int) -> list[tuple[range, range]]:
    """[(fitting iterations, evaluation iterations)] per cycle: after ``warmup``, L_t to fit then at most
    L_c to evaluate, repeated while gradients remain (a last cycle needs >= 1 evaluation gradient)."""
    if warmup < 0 or L_t < 2 or L_c < 1:
        raise ValueError(f"warmup={warmup}, L_t={L_t}, L_c={L_c}: need warmup >= 0, L_t >= 2, L_c >= 1")
    cycles, t = [], warmup
    while t + L_t < total:
        cycles.append((range(t, t + L_t), range(t + L_t, min(total, t + L_t + L_c))))
        t += L_t + L_c
    if not cycles:
        raise ValueError(f"{total} gradients: need more than warmup + L_t = {warmup + L_t}")
    return cycles


# -- helpers -------------------------------------------------------------------------------------------
def split_params(flat: Tensor, shapes) -> list[Tensor]:
    """Views of a model-order flat vector as the parameters' shapes."""
    out, off = [], 0
    for s in shapes:
        n = math.prod(s)
        out.append(flat[off: off + n].view(s))
        off += n
    return out


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
    return PowerSGD(shapes, rank, min_compression_rate).bytes_per_iteration


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
    ds, vals = comp.state_tensors()
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


# -- the table -------------------------------------------------------------------------------------------
def _stats(errs, sizes=None) -> dict:
    """Mean / median / max of [(err, err_conv)]; with ``sizes`` (evaluation gradients per cycle) also
    the mean per cycle, as 'a/b/c'."""
    e = torch.tensor([x[0] for x in errs], dtype=torch.float64)
    c = torch.tensor([x[1] for x in errs], dtype=torch.float64)
    out = {"err_mean": float(e.mean()), "err_median": float(e.median()), "err_max": float(e.max()),
           "err_conv_mean": float(c.mean()), "err_conv_median": float(c.median()), "n_eval": len(errs)}
    if sizes is not None:
        out["err_mean_by_cycle"] = "/".join(f"{float(p.mean()):.3g}" for p in e.split(list(sizes)))
    return out


def peers_table(grads: list[Tensor], shapes, ranks=(2, 4), Ks=("auto", "x1"), knobs=("lambda",),
                pools=(False, True), warmup: int = 50, L_t: int = 50, L_c: int = 80,
                samples: str = "exact", min_compression_rate: float = 2.0, tolerance: float = 0.03,
                seed: int = 0, log=print) -> pd.DataFrame:
    """One row per (rank, method): bytes per iteration, the gap to PowerSGD's, errors (see the module
    docstring).  ``grads`` are model-order flat gradients; ``shapes`` the parameters' shapes."""
    if samples not in ("exact", "qsgd"):
        raise ValueError(f"samples={samples!r}: exact | qsgd")
    for k in knobs:
        if k not in KNOBS:
            raise ValueError(f"match={k!r}: one of {KNOBS}")
    shapes = [torch.Size(s) for s in shapes]
    cycles = schedule(len(grads), warmup, L_t, L_c)
    eval_idx = [t for _, ev in cycles for t in ev]
    sizes = [len(ev) for _, ev in cycles]
    fit_idx = [t for fit, _ in cycles for t in fit]
    numel, mask = sum(math.prod(s) for s in shapes), conv_mask(shapes)
    for i, (fit, ev) in enumerate(cycles):        # GradiVeQ adds the fitting window's mean back: stale?
        norms = torch.stack([grads[t].double().norm() for t in [*fit, *ev]])
        mean = torch.stack([grads[t].double() for t in fit]).mean(0).norm()
        log(f"cycle {i}: fit {fit.start}-{fit.stop - 1}, eval {ev.start}-{ev.stop - 1}: median ||g|| "
            f"{float(norms[:len(fit)].median()):.3g} (fit) {float(norms[len(fit):].median()):.3g} (eval); "
            f"||mean of the fitting gradients|| {float(mean):.3g}")
    rows = []
    qs = {norm: qsgd(norm) for norm in ("max", "l2")}
    q_bytes = qs["max"].payload_nbytes(slice(0, numel))
    for norm, q in qs.items():
        nb = q.payload_nbytes(slice(0, numel))
        rows.append({"r": "-", "method": f"QSGD 4-bit {norm}", "config": "bucket 2048, one encode",
                     "bytes": nb, "sched_bytes": nb, "relay_bytes": 0, "matched": None,
                     **_stats(qsgd_errors(q, [grads[t] for t in eval_idx], mask), sizes),
                     "err_fit_window_mean": _stats(qsgd_errors(q, [grads[t] for t in fit_idx], mask))[
                         "err_mean"]})

    def fit_samples(probe, fit):
        S = torch.stack([layout_flat(probe, grads[t], shapes) for t in fit])
        if samples == "qsgd":
            qq, whole = qsgd("max"), slice(0, numel)
            S = torch.stack([qq.decompress(qq.compress(x, whole), whole) for x in S])
        return S

    # GradiVeQ per (K, pool): the spectra of every cycle's samples (rebuilt when fitting: memory)
    configs = {}
    for K, pool in [(K, pool) for K in Ks for pool in pools]:
        probe = GradiVeQ(K=K, pool=pool, world_size=1).bind(shapes)
        specs, raw = [spectra(probe, fit_samples(probe, fit)) for fit, _ in cycles], raw_count(probe)
        lo = max(predicted_bytes(sp, raw, [1] * len(sp)) for sp in specs)
        hi = min(predicted_bytes(sp, raw, [max(1, s.rank) for s in sp]) for sp in specs)
        log(f"GradiVeQ K={K}{' pool' if pool else ''}: reachable {lo} .. {hi} bytes/iteration "
            f"({raw} values raw: every non-conv parameter and conv tails; d <= sample rank)")
        configs[K, pool] = (probe, specs, raw)

    for r in ranks:
        target = powersgd_bytes(shapes, r, min_compression_rate)
        base = {"r": r, "bytes": target, "sched_bytes": target, "relay_bytes": 0, "matched": True}
        cfg = f"warm start, min_compression_rate {min_compression_rate:g}"
        plain = powersgd_run(grads, shapes, r, warmup, False, min_compression_rate, seed=seed)
        withef = powersgd_run(grads, shapes, r, warmup, True, min_compression_rate, seed=seed)
        for name, res, pick in (("PowerSGD", plain, slice(0, 2)), ("PowerSGD+EF", withef, slice(0, 2)),
                                ("PowerSGD+EF (t vs g)", withef, slice(2, 4))):
            rows.append({**base, "method": name, "config": cfg,
                         **_stats([res[t][pick] for t in eval_idx], sizes),
                         "err_fit_window_mean": _stats([res[t][pick] for t in fit_idx])["err_mean"]})
        for (K, pool), (probe, specs, raw) in configs.items():
            name = f"K={K}{' pool' if pool else ''}"
            for knob in knobs:
                errs, fit_errs, nbytes, sched, relay, notes = [], [], [], [], [], []
                for sp, (fit, ev) in zip(specs, cycles):
                    v = match_knob(sp, raw, knob, target)
                    comp = fit_gradiveq(shapes, fit_samples(probe, fit), K, pool, knob, v)
                    b = comp.payload_nbytes(slice(0, numel))
                    kw = {"lam": v} if knob == "lambda" else {"target_ratio": v}
                    if b != predicted_bytes(sp, raw, predicted_ds(sp, **kw)):
                        log(f"warning: GradiVeQ {name} {knob}={v:.4g}: the fit's bytes ({b}) differ "
                            f"from the prediction ({predicted_bytes(sp, raw, predicted_ds(sp, **kw))})")
                    def flats(ts):
                        return (layout_flat(probe, grads[t], shapes) for t in ts)
                    errs += gradiveq_errors(comp, flats(ev), mask)
                    fit_errs += gradiveq_errors(comp, flats(fit), mask)
                    nbytes.append(b)
                    sched.append((L_t * q_bytes + L_c * b) / (L_t + L_c))
                    relay.append(state_bytes(comp))
                    notes.append(f"{knob}={v:.3g} d=" + "/".join(str(st["d"]) for st in comp.layer_stats())
                                 + f" {b}B")
                b = sum(n * k for n, k in zip(nbytes, sizes)) / sum(sizes)
                worst = max(abs(n / target - 1.0) for n in nbytes)       # every cycle must match
                rows.append({"r": r, "method": f"GradiVeQ {name} {knob}", "bytes": round(b),
                             "config": f"{name}; per cycle: " + "; ".join(notes),
                             "matched": worst <= tolerance, "sched_bytes": round(sum(sched) / len(sched)),
                             "relay_bytes": round(sum(relay) / len(relay)),
                             **_stats(errs, sizes), "err_fit_window_mean": _stats(fit_errs)["err_mean"]})
    df = pd.DataFrame(rows)
    psgd = {r: powersgd_bytes(shapes, r, min_compression_rate) for r in ranks}
    df["vs_powersgd_%"] = [100.0 * (b / psgd[r] - 1.0) if r in psgd else float("nan")
                           for r, b in zip(df["r"], df["bytes"])]
    df["ratio"] = 4.0 * numel / df["bytes"]
    cols = ["r", "method", "bytes", "vs_powersgd_%", "ratio", "matched", "err_mean", "err_median",
            "err_conv_mean", "err_mean_by_cycle", "sched_bytes", "relay_bytes", "err_max", "err_conv_median",
            "err_fit_window_mean", "n_eval", "config"]
    return df[cols]


PRINTED = ["r", "method", "bytes", "vs_powersgd_%", "ratio", "matched", "err_mean", "err_median",
           "err_conv_mean", "err_mean_by_cycle", "sched_bytes"]
