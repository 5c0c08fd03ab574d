"""GradiVeQ vs PowerSGD at equal bytes: compression error on REAL gradients (the error half of the
comparison; the timing half is ``python -m gvq.bench aggregate``, whose random gradients make errors
meaningless).

    python -m gvq.analysis peers [model=cnn dataset=digits rank=[2,4] K=[auto,x1] ...]

See docs/design.md#gvqanalysispeerspy for how it works and why.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import Tensor

from gvq.analysis.peer_measures import (KNOBS, Spectrum, conv_mask, fit_gradiveq, gradiveq_errors,
                                        layout_flat, match_knob, powersgd_bytes, powersgd_run,
                                        predicted_bytes, predicted_ds, qsgd, qsgd_errors, raw_count,
                                        spectra, state_bytes)
from gvq.compressors.gradiveq.codec import GradiVeQ

COLUMNS = ["r", "method", "bytes", "vs_powersgd_%", "ratio", "matched", "err_mean", "err_median",
           "err_conv_mean", "err_mean_by_cycle", "sched_bytes", "relay_bytes", "err_max", "err_conv_median",
           "err_fit_window_mean", "n_eval", "config"]
PRINTED = ["r", "method", "bytes", "vs_powersgd_%", "ratio", "matched", "err_mean", "err_median",
           "err_conv_mean", "err_mean_by_cycle", "sched_bytes"]


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


@dataclass
class PeerSetup:
    """What every row is computed from: model-order flat gradients, the parameters' shapes and the
    schedule's knobs; the cycles, their index lists and the conv mask are derived once."""
    grads: list[Tensor]
    shapes: list[torch.Size]
    warmup: int
    L_t: int
    L_c: int
    samples: str                                    # GradiVeQ's fitting samples: exact | qsgd
    cycles: list[tuple[range, range]] = field(init=False)
    eval_idx: list[int] = field(init=False)         # evaluation iterations, in order
    fit_idx: list[int] = field(init=False)
    sizes: list[int] = field(init=False)            # evaluation gradients per cycle
    numel: int = field(init=False)
    mask: Tensor = field(init=False)                # conv weights

    def __post_init__(self):
        self.cycles = schedule(len(self.grads), self.warmup, self.L_t, self.L_c)
        self.eval_idx = [t for _, ev in self.cycles for t in ev]
        self.sizes = [len(ev) for _, ev in self.cycles]
        self.fit_idx = [t for fit, _ in self.cycles for t in fit]
        self.numel, self.mask = sum(math.prod(s) for s in self.shapes), conv_mask(self.shapes)

    def fitting_samples(self, probe: GradiVeQ, fit: range) -> Tensor:
        """The fitting window's gradients in ``probe``'s layout, one per row (``samples='qsgd'``: each
        through one 4-bit max-norm QSGD encode, as the paper's sampling phase sends them)."""
        S = torch.stack([layout_flat(probe, self.grads[t], self.shapes) for t in fit])
        if self.samples == "qsgd":
            qq, whole = qsgd("max"), slice(0, self.numel)
            S = torch.stack([qq.decompress(qq.compress(x, whole), whole) for x in S])
        return S


@dataclass
class GradiVeQProbe:
    """GradiVeQ at one (K, pool), bound to the shapes, with the spectrum of every cycle's samples: the
    d's for any knob value follow from these without refitting."""
    K: int | str
    pool: bool
    comp: GradiVeQ
    specs: list[list[Spectrum]]     # per cycle
    raw: int                        # values sent raw

    @property
    def name(self) -> str:
        return f"K={self.K}{' pool' if self.pool else ''}"


# -- the table -------------------------------------------------------------------------------------------
def error_stats(errs, sizes=None) -> dict:
    """Mean / median / max of [(err, err_conv)]; with ``sizes`` (evaluation gradients per cycle) also
    the mean per cycle, as 'a/b/c'."""
    e = torch.tensor([x[0] for x in errs], dtype=torch.float64)
    c = torch.tensor([x[1] for x in errs], dtype=torch.float64)
    out = {"err_mean": float(e.mean()), "err_median": float(e.median()), "err_max": float(e.max()),
           "err_conv_mean": float(c.mean()), "err_conv_median": float(c.median()), "n_eval": len(errs)}
    if sizes is not None:
        out["err_mean_by_cycle"] = "/".join(f"{float(p.mean()):.3g}" for p in e.split(list(sizes)))
    return out


def check_peer_options(samples: str, knobs) -> None:
    if samples not in ("exact", "qsgd"):
        raise ValueError(f"samples={samples!r}: exact | qsgd")
    for k in knobs:
        if k not in KNOBS:
            raise ValueError(f"match={k!r}: one of {KNOBS}")


def log_cycle_norms(setup: PeerSetup, log) -> None:
    """Per cycle, median gradient norms of the fitting and evaluation windows and the norm of the
    fitting window's mean."""
    grads = setup.grads
    for i, (fit, ev) in enumerate(setup.cycles):  # GradiVeQ adds the fitting window's mean back: stale?
        norms = torch.stack([grads[t].double().norm() for t in [*fit, *ev]])
        mean = torch.stack([grads[t].double() for t in fit]).mean(0).norm()
        log(f"cycle {i}: fit {fit.start}-{fit.stop - 1}, eval {ev.start}-{ev.stop - 1}: median ||g|| "
            f"{float(norms[:len(fit)].median()):.3g} (fit) {float(norms[len(fit):].median()):.3g} (eval); "
            f"||mean of the fitting gradients|| {float(mean):.3g}")


def qsgd_rows(setup: PeerSetup) -> list[dict]:
    """4-bit QSGD, max and l2 norm: a reference at its own bytes."""
    rows, grads, mask = [], setup.grads, setup.mask
    for norm in ("max", "l2"):
        q = qsgd(norm)
        nb = q.payload_nbytes(slice(0, setup.numel))
        errs = qsgd_errors(q, [grads[t] for t in setup.eval_idx], mask)
        fit_errs = qsgd_errors(q, [grads[t] for t in setup.fit_idx], mask)
        rows.append({"r": "-", "method": f"QSGD 4-bit {norm}", "config": "bucket 2048, one encode",
                     "bytes": nb, "sched_bytes": nb, "relay_bytes": 0, "matched": None,
                     **error_stats(errs, setup.sizes), "err_fit_window_mean": error_stats(fit_errs)["err_mean"]})
    return rows


def gradiveq_probes(setup: PeerSetup, Ks, pools, log) -> dict[tuple, GradiVeQProbe]:
    """A :class:`GradiVeQProbe` per (K, pool), logging the byte range it can reach.  Only the spectra are
    kept: the samples are rebuilt when fitting (memory)."""
    probes = {}
    for K, pool in [(K, pool) for K in Ks for pool in pools]:
        comp = GradiVeQ(K=K, pool=pool, world_size=1).bind(setup.shapes)
        specs = [spectra(comp, setup.fitting_samples(comp, fit)) for fit, _ in setup.cycles]
        probe = GradiVeQProbe(K, pool, comp, specs, raw_count(comp))
        raw = probe.raw
        lo = max(predicted_bytes(sp, raw, [1] * len(sp)) for sp in specs)
        hi = min(predicted_bytes(sp, raw, [max(1, s.rank) for s in sp]) for sp in specs)
        log(f"GradiVeQ {probe.name}: reachable {lo} .. {hi} bytes/iteration "
            f"({raw} values raw: every non-conv parameter and conv tails; d <= sample rank)")
        probes[K, pool] = probe
    return probes


def powersgd_rows(setup: PeerSetup, r: int, target: int, min_compression_rate: float,
                  seed: int) -> list[dict]:
    """PowerSGD rank ``r`` (``target`` bytes) from the first post-warmup iteration, without and with
    error feedback."""
    base = {"r": r, "bytes": target, "sched_bytes": target, "relay_bytes": 0, "matched": True}
    cfg = f"warm start, min_compression_rate {min_compression_rate:g}"
    plain = powersgd_run(setup.grads, setup.shapes, r, setup.warmup, False, min_compression_rate, seed=seed)
    withef = powersgd_run(setup.grads, setup.shapes, r, setup.warmup, True, min_compression_rate, seed=seed)
    rows = []
    for name, res, pick in (("PowerSGD", plain, slice(0, 2)), ("PowerSGD+EF", withef, slice(0, 2)),
                            ("PowerSGD+EF (t vs g)", withef, slice(2, 4))):
        rows.append({**base, "method": name, "config": cfg,
                     **error_stats([res[t][pick] for t in setup.eval_idx], setup.sizes),
                     "err_fit_window_mean": error_stats([res[t][pick] for t in setup.fit_idx])["err_mean"]})
    return rows


def gradiveq_cycle(setup: PeerSetup, probe: GradiVeQProbe, i: int, knob: str, target: int, log) -> dict:
    """Cycle ``i``: GradiVeQ's ``knob`` matched to ``target`` bytes, fitted on the fitting window,
    scored on the evaluation window (and on the fitting window, for reference)."""
    (fit, ev), sp, raw = setup.cycles[i], probe.specs[i], probe.raw
    v = match_knob(sp, raw, knob, target)
    comp = fit_gradiveq(setup.shapes, setup.fitting_samples(probe.comp, fit), probe.K, probe.pool, knob, v)
    b = comp.payload_nbytes(slice(0, setup.numel))
    kw = {"lam": v} if knob == "lambda" else {"target_ratio": v}
    if b != predicted_bytes(sp, raw, predicted_ds(sp, **kw)):
        log(f"warning: GradiVeQ {probe.name} {knob}={v:.4g}: the fit's bytes ({b}) differ "
            f"from the prediction ({predicted_bytes(sp, raw, predicted_ds(sp, **kw))})")

    def flats(ts):
        return (layout_flat(probe.comp, setup.grads[t], setup.shapes) for t in ts)
    return {"errs": gradiveq_errors(comp, flats(ev), setup.mask),
            "fit_errs": gradiveq_errors(comp, flats(fit), setup.mask), "bytes": b,
            "relay": state_bytes(comp),
            "note": f"{knob}={v:.3g} d=" + "/".join(str(st["d"]) for st in comp.layer_stats()) + f" {b}B"}


def gradiveq_row(setup: PeerSetup, probe: GradiVeQProbe, knob: str, r: int, target: int,
                 sampling_bytes: int, tolerance: float, log) -> dict:
    """GradiVeQ matched to PowerSGD rank ``r``'s ``target`` bytes in every cycle; ``sched_bytes`` mixes
    in the L_t sampling iterations at ``sampling_bytes`` (4-bit QSGD)."""
    cycles = [gradiveq_cycle(setup, probe, i, knob, target, log) for i in range(len(setup.cycles))]
    nbytes = [c["bytes"] for c in cycles]
    L_t, L_c = setup.L_t, setup.L_c
    sched = [(L_t * sampling_bytes + L_c * b) / (L_t + L_c) for b in nbytes]
    relay = [c["relay"] for c in cycles]
    b = sum(n * k for n, k in zip(nbytes, setup.sizes)) / sum(setup.sizes)
    worst = max(abs(n / target - 1.0) for n in nbytes)       # every cycle must match
    return {"r": r, "method": f"GradiVeQ {probe.name} {knob}", "bytes": round(b),
            "config": f"{probe.name}; per cycle: " + "; ".join(c["note"] for c in cycles),
            "matched": worst <= tolerance, "sched_bytes": round(sum(sched) / len(sched)),
            "relay_bytes": round(sum(relay) / len(relay)),
            **error_stats([e for c in cycles for e in c["errs"]], setup.sizes),
            "err_fit_window_mean": error_stats([e for c in cycles for e in c["fit_errs"]])["err_mean"]}


def with_byte_columns(rows: list[dict], setup: PeerSetup, ranks, min_compression_rate: float) -> pd.DataFrame:
    """The rows as a table with the byte gap to PowerSGD at the row's rank and the compression ratio."""
    df = pd.DataFrame(rows)
    psgd = {r: powersgd_bytes(setup.shapes, r, min_compression_rate) for r in ranks}
    df["vs_powersgd_%"] = [100.0 * (b / psgd[r] - 1.0) if r in psgd else float("nan")
                           for r, b in zip(df["r"], df["bytes"])]
    df["ratio"] = 4.0 * setup.numel / df["bytes"]
    return df[COLUMNS]


def peers_table(grads: list[Tensor], shapes, ranks=(2, 4), Ks=("auto", "x1"), knobs=("lambda",),
                pools=(False, True), warmup: int = 50, L_t: int = 50, L_c: int = 80,
                samples: str = "exact", min_compression_rate: float = 2.0, tolerance: float = 0.03,
                seed: int = 0, log=print) -> pd.DataFrame:
    """One row per (rank, method): bytes per iteration, the gap to PowerSGD's, errors (see
    docs/design.md#gvqanalysispeerspy).  ``grads`` are model-order flat gradients; ``shapes`` the parameters' shapes."""
    check_peer_options(samples, knobs)
    setup = PeerSetup(grads, [torch.Size(s) for s in shapes], warmup, L_t, L_c, samples)
    log_cycle_norms(setup, log)
    rows = qsgd_rows(setup)
    sampling_bytes = qsgd("max").payload_nbytes(slice(0, setup.numel))
    probes = gradiveq_probes(setup, Ks, pools, log)
    for r in ranks:
        target = powersgd_bytes(setup.shapes, r, min_compression_rate)
        rows += powersgd_rows(setup, r, target, min_compression_rate, seed)
        for probe in probes.values():
            for knob in knobs:
                rows.append(gradiveq_row(setup, probe, knob, r, target, sampling_bytes, tolerance, log))
    return with_byte_columns(rows, setup, ranks, min_compression_rate)
