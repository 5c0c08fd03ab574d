"""Time to accuracy: each aggregator's iterations to a target accuracy (its runs) times its seconds per
iteration in each cell of ``python -m gvq.bench overlap`` (N x link x compute regime, post-backward and
overlapped): ``python -m gvq.report tta RUNS --bench BENCH.json target_acc=0.8``.

An iteration costs what its *phase* costs: GradiVeQ's warm-up aggregates as RAR and its sampling phase as
4-bit QSGD-RAR (the bench pins every option in its compressed phase), PowerSGD's uncompressed start as
RAR; so a run's iterations up to the target are counted per phase and each count is priced at the phase's
own option in the cell.  Iterations come from post-backward runs for both variants (overlap changes when a
bucket is reduced, not what is summed; the report checks it on any overlapped runs given).  Runs under
``net.clock=virtual`` with an emulated link are also validated end to end: their own measured time to the
target (the sum of ``compute_s + aggregate_s`` up to it, evaluation excluded) against the composition.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from gvq.report.intervals import MIN_SEEDS, UNRANKED, Interval, best_of, tied_with_best
from gvq.report.runs import ReportError, Run
from gvq.report.target import as_target, typical_first_step
from gvq.schema.setting import BenchKey, overrides_for, read_bench

FP16_OVERLAP = "fp16 (overlap)"      # the reference a cell's gain is over

#: a phase that aggregates as another option does (bench seconds of that option), at the defaults; any
#: other phase is priced as the run's own option (GradiVeQ's schedule knobs: :func:`phase_options`)
PHASE_AS = {"warmup": "rar", "allreduce": "rar", "sample": "qsgd"}


def phase_options(run: Run) -> dict[str, str]:
    """:data:`PHASE_AS` for this run: GradiVeQ's warm-up as ``aggregator.warmup_by`` sums it, its
    sampling as ``aggregator.sampling`` does, and samples taken inside the warm-up
    (``aggregator.samples_in_warmup``: the first L_t) as the warm-up does."""
    agg = run.config.get("aggregator") or {}
    warm = str(agg.get("warmup_by", PHASE_AS["warmup"]))
    return {**PHASE_AS, "warmup": warm, "sample": str(agg.get("sampling", PHASE_AS["sample"])),
            "sample_in_warmup": warm}
REGIMES = {1.0: "CPU (x1)", round(1 / 6, 4): "GPU (x1/6)"}
VALIDATION_TOLERANCE = 0.10       # composed within this share of measured counts as validated


def _to_target(run: Run, target: float) -> pd.DataFrame | None:
    """The run's rows up to and including its first evaluation at or beyond ``target`` (None: never)."""
    m = run.metrics
    if m is None:
        return None
    hit = m[as_target(target).reached(m)]
    return None if hit.empty else m[m["iteration"] <= hit["iteration"].iloc[0]]


def phase_counts(run: Run, target: float) -> dict[str, int] | None:
    """Iterations per phase up to the target (None: the run never reached it); with
    ``aggregator.samples_in_warmup`` the first L_t samples count as ``sample_in_warmup``."""
    upto = _to_target(run, target)
    if upto is None:
        return None
    counts = {str(k): int(v) for k, v in upto["phase"].value_counts().items()}
    agg = run.config.get("aggregator") or {}
    if agg.get("samples_in_warmup") and counts.get("sample"):
        first = min(counts["sample"], int(agg.get("L_t", 0)))
        counts["sample_in_warmup"], counts["sample"] = first, counts["sample"] - first
    return {k: v for k, v in counts.items() if v}


def measured_time(run: Run, target: float) -> float:
    """The run's own seconds to the target on its clock: compute + aggregation, evaluation excluded, and
    iteration 0 as a typical iteration (its one-off start-up left out, as the bench's medians leave it)."""
    upto = _to_target(run, target)
    steps, typical = upto["compute_s"] + upto["aggregate_s"], typical_first_step(run.metrics)
    if typical is not None:
        steps = steps.where(upto["iteration"] > 0, typical)
    return float(steps.sum())


#: what a bench file was measured on: files read as one table must agree on every one of these
WORKLOAD_KEYS = ("model", "input_shape", "batch_per_rank", "num_classes", "set", "clock", "codec_scale")


def merge_benches(benches: list[tuple[str, dict]]) -> dict:
    """Several ``gvq.bench overlap --out`` files (a long bench run in parts: the settings of one family
    added later) read as one: the same workload (:data:`WORKLOAD_KEYS`) or refused in one line, their
    modes together, a mode that two files measured refused (which one is meant?), their family defaults
    and aliases united; each read through :func:`gvq.schema.setting.read_bench` (older formats)."""
    try:
        benches = [(path, read_bench(bench, f"--bench {path}")) for path, bench in benches]
    except ValueError as e:                    # a newer format than this gvq reads
        raise ReportError(str(e)) from e
    first_path, first = benches[0]
    modes, seen, defaults, aliases = [], {}, {}, {}
    for path, bench in benches:
        st = bench["setting"]
        diff = [f"{k}={st.get(k)} (there: {first['setting'].get(k)})" for k in WORKLOAD_KEYS
                if st.get(k) != first["setting"].get(k)]
        if diff:
            raise ReportError(f"--bench {path}: another workload than {first_path}'s: {', '.join(diff)}")
        for r in bench["modes"]:
            key = BenchKey.of(r)
            if key in seen:
                raise ReportError(f"--bench {path}: {r['setting']} ({r['variant']}) at N={r['N']}, {r['link_Mbps']:g} "
                                  f"Mbit/s, compute x{r['compute_scale']:.3g} is also in {seen[key]}")
            seen[key] = path
            modes.append(r)
        defaults.update(st.get("defaults", {}))
        aliases.update(st.get("aliases", {}))
    return {"setting": {**first["setting"], "defaults": defaults, "aliases": aliases}, "modes": modes}


def bench_seconds(bench: dict, field: str = "iter_s") -> dict[tuple, float]:
    """(N, compute_scale, link_Mbps, setting, variant) -> median seconds per iteration (a setting named as
    ``Run.setting`` names a run's: ``qsgd``, ``qsgd bits=2``), each also under its alias (``qsgd bits=4``:
    the bench's ``aliases``); ``field="iter_lo_s"`` / ``"iter_hi_s"``: the ends of the bench's interval of
    that median instead (NaN where a record has none: an older file, or a single timed iteration)."""
    names = {}
    for alias, name in bench["setting"].get("aliases", {}).items():
        names.setdefault(name, []).append(alias)
    return {BenchKey.of(r, s): np.nan if r.get(field) is None else r[field] for r in bench["modes"]
            for s in [r["setting"], *names.get(r["setting"], [])]}


def priced(counts: dict[str, int], option: str, variant: str, cell: tuple, secs: dict,
           phase_as: dict[str, str] = PHASE_AS) -> float:
    """Seconds to the target: each phase's iterations x its option's seconds per iteration in ``cell``
    ((N, compute_scale, link_Mbps)), a phase priced as ``phase_as`` says; ReportError naming what the
    bench lacks."""
    total = 0.0
    for phase, n in counts.items():
        key = (*cell, phase_as.get(phase, option), variant)
        if key not in secs:
            raise ReportError(f"the bench JSON has no seconds for {key[3]} ({variant}) at N={cell[0]}, "
                              f"compute x{cell[1]:g}, {cell[2]:g} Mbit/s (needed by {option}'s {phase!r} phase)")
        total += n * secs[key]
    return total


def iteration_table(runs: list[Run], target: float) -> pd.DataFrame:
    """Per (aggregator, N, variant) group: iterations to the target, mean +- std over its seeds."""
    rows = []
    for r in runs:
        counts = phase_counts(r, target)
        rows.append({"aggregator": r.setting, "N": r.config.get("world_size"), "variant": r.variant,
                     "seed": r.config.get("seed"), "iters": sum(counts.values()) if counts else np.nan})
    df = pd.DataFrame(rows)
    out = (df.groupby(["aggregator", "N", "variant"])["iters"]
           .agg(mean="mean", std="std", seeds="size", reached="count").reset_index())
    out["ranked"] = np.where(out["seeds"] >= MIN_SEEDS, "yes", UNRANKED)
    return out


def tta_records(runs: list[Run], bench: dict, target: float) -> pd.DataFrame:
    """One record per (cell, aggregator, variant, seed): its composed seconds to the target (inf if that
    seed never reached it) and the range the bench's intervals allow it (``tta_lo_s``, ``tta_hi_s``: each
    phase's count x the ends of its seconds' interval; NaN where the bench has none)."""
    secs, post = bench_seconds(bench), [r for r in runs if r.variant == "post"]
    ends = {f"tta_{end}_s": bench_seconds(bench, f"iter_{end}_s") for end in ("lo", "hi")}
    cells = sorted({k[:3] for k in secs})
    rows = []
    for r in post:
        counts = phase_counts(r, target)
        for cell in (c for c in cells if c[0] == r.config.get("world_size")):
            timed = sorted({k[4] for k in secs if k[:3] == cell and k[3] == r.setting})
            if not timed:
                raise ReportError(f"the bench JSON has no seconds for {r.setting} at N={cell[0]}, compute "
                                  f"x{cell[1]:g}, {cell[2]:g} Mbit/s (run {r.path.name}): time that setting with "
                                  "gvq.bench overlap grid.settings=[OPTION:KEY=VALUE] (keys under aggregator.)")
            for variant in timed:
                price = (lambda s: priced(counts, r.setting, variant, cell, s, phase_options(r))) if counts \
                    else (lambda s: np.inf)
                rows.append({"N": cell[0], "compute_scale": cell[1], "link_Mbps": cell[2],
                             "aggregator": r.setting, "variant": variant, "seed": r.config.get("seed"),
                             "tta_s": price(secs), **{k: price(v) for k, v in ends.items()}})
    if not rows:
        raise ReportError("no post-backward run shares a world size with the bench JSON's cells")
    return pd.DataFrame(rows)


def family_gain(spread: dict[str, Interval], best: str, defaults: dict[str, str],
                aliases: dict[str, str] | None = None) -> float:
    """The best mode's gain over its family's default setting (``defaults``: option -> that setting's name,
    the bench's; a run may name it by an ``aliases`` key; the faster of its variants): 1 where the default
    is the best, NaN where the default was not run."""
    option = best.split(" ", 1)[0]
    default = defaults.get(option, option)
    names = {default, *(a for a, name in (aliases or {}).items() if name == default)}
    mine = [v.median for k, v in spread.items() if k.rsplit(" (", 1)[0] in names]
    return min(mine) / spread[best].median if mine and np.isfinite(spread[best].median) else np.nan


def cell_table(records: pd.DataFrame, defaults: dict[str, str] | None = None,
               aliases: dict[str, str] | None = None) -> pd.DataFrame:
    """Per cell: every (setting, variant)'s mean seconds to the target over seeds (inf where a seed never
    reached it); the winner among the modes run with at least :data:`MIN_SEEDS` seeds that reached it (a
    never-reached mode is behind every figure, in no tie), its gain over overlapped fp16 and over its
    family's default setting (``defaults``, the bench JSON's: option -> setting; an option's bare name where
    absent); ``one_seed``: the fastest mode run with one seed, never a winner (:func:`one_seed_text`);
    ``unranked``: those modes' names."""
    g = (records.groupby(["N", "compute_scale", "link_Mbps", "aggregator", "variant"])
         .agg(mean=("tta_s", "mean"), std=("tta_s", "std"), seeds=("tta_s", "size"),
              lo=("tta_lo_s", "first"), hi=("tta_hi_s", "first")).reset_index())
    out = []
    for cell, recs in g.groupby(["N", "compute_scale", "link_Mbps"]):
        modes = {f"{r.aggregator} ({r.variant})": r for r in recs.itertuples(index=False)}
        ranked = {k: _seed_band(r.mean, r.std) for k, r in modes.items() if r.seeds >= MIN_SEEDS}
        single = {k: _bench_band(r.mean, r.lo, r.hi) for k, r in modes.items() if r.seeds < MIN_SEEDS}
        every = {**ranked, **single}
        reached = {k: v for k, v in ranked.items() if np.isfinite(v.median)}
        won = best_of(reached) if reached else {"best": "", "winner": _no_winner(ranked, single)}
        best, fp16 = every.get(won["best"]), every.get(FP16_OVERLAP)
        out.append({"N": cell[0], "scale": cell[1], "link_Mbps": cell[2],
                    "regime": REGIMES.get(cell[1], f"x{cell[1]:g}"), "winner": won["winner"], "best": won["best"],
                    "winner_s": best.median if best else np.nan,
                    "winner_std": best.median - best.lo if best and best.bounded else np.nan,
                    "fp16_overlap_s": fp16.median if fp16 else np.nan,
                    "gain_over_fp16": fp16.median / best.median if best and fp16 else np.nan,
                    "gain_over_default": family_gain(every, won["best"], defaults or {}, aliases) if best else np.nan,
                    "one_seed": one_seed_text(single), "unranked": "; ".join(single),
                    **{k: v.median for k, v in every.items()}})
    # the overlap table's order: per N, the CPU regime first, links from slow to fast
    return (pd.DataFrame(out).sort_values(["N", "scale", "link_Mbps"], ascending=[True, False, True])
            .drop(columns="scale").reset_index(drop=True))


def _no_winner(ranked: dict, single: dict) -> str:
    """The winner cell where no mode with a seed band reached the target."""
    if any(np.isfinite(v.median) for v in single.values()):
        return UNRANKED
    return "none reached" if ranked or single else "—"


def one_seed_text(single: dict[str, Interval]) -> str:
    """The fastest one-seed mode that reached the target, its seconds, and the one-seed modes the bench's
    intervals cannot tell from it (a one-seed figure has no seed band, so only the bench's timing spread is
    known: its iteration count's spread is not); "" where no one-seed mode reached the target."""
    finite = {k: v for k, v in single.items() if np.isfinite(v.median)}
    if not finite:
        return ""
    fastest = min(finite, key=lambda k: finite[k].median)
    head = f"{fastest} {finite[fastest].median:.1f} s, {UNRANKED}"
    if not finite[fastest].bounded:
        return head + "; the bench JSON has no intervals to compare it by"
    tied = [k for k in tied_with_best(finite)[1:] if finite[k].bounded]
    blind = sorted(k for k, v in finite.items() if not v.bounded)
    return head + (f"; within the bench's intervals: {', '.join(tied)}" if tied
                   else "; no other within the bench's intervals") + (
        f"; no intervals for {', '.join(blind)}" if blind else "")


def _seed_band(mean: float, std: float) -> Interval:
    """A mean over seeds with its band mean +- std (a setting run with at least :data:`MIN_SEEDS` seeds;
    a never (inf) is a point behind every finite figure)."""
    if not np.isfinite(mean):                  # never reached in some seed: behind every finite figure
        return Interval(mean, mean, mean)
    if not np.isfinite(std):
        return Interval(mean, None, None)
    return Interval(mean, mean - std, mean + std)


def _bench_band(mean: float, lo: float, hi: float) -> Interval:
    """A one-seed figure with the range the bench's intervals allow it (none where the bench has none)."""
    if not np.isfinite(mean):
        return Interval(mean, mean, mean)
    return Interval(mean, None, None) if np.isnan(lo) or np.isnan(hi) else Interval(mean, lo, hi)


def validation(runs: list[Run], bench: dict, target: float) -> pd.DataFrame:
    """Virtual-time runs with an emulated link: measured seconds to the target against the composition
    of their own phase counts with the bench's seconds in their cell."""
    secs, rows = bench_seconds(bench), []
    for r in runs:
        net = r.config.get("net") or {}
        counts = phase_counts(r, target)
        if net.get("clock") != "virtual" or not net.get("bandwidth_bps") or not counts:
            continue
        cell = (r.config["world_size"], round(net["compute_scale"], 4), net["bandwidth_bps"] / 1e6)
        composed = priced(counts, r.setting, r.variant, cell, secs, phase_options(r))
        measured = measured_time(r, target)
        rows.append({"N": cell[0], "link_Mbps": cell[2], "regime": REGIMES.get(cell[1], f"x{cell[1]:g}"),
                     "aggregator": r.setting, "variant": r.variant, "seed": r.config.get("seed"),
                     "iters": sum(counts.values()), "measured_s": measured, "composed_s": composed,
                     "composed_over_measured": composed / measured,
                     "within": abs(composed / measured - 1) <= VALIDATION_TOLERANCE})
    return pd.DataFrame(rows)


def _config_value(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def check_setting(runs: list[Run], setting: dict) -> None:
    """Refuse runs priced at seconds measured on another setting: batch per rank, and every override the
    bench applied to all its modes (``grid.set``) must be the run's.  A setting's own overrides (PowerSGD's
    rank, QSGD's bits) are in its name, which each run is matched by (``bench_seconds``)."""
    import yaml
    for r in runs:
        if r.method:          # the bench times a sync every step: another method's seconds are not those
            raise ReportError(f"{r.path}: method={r.method.split(' ')[0]}: gvq.bench overlap times a sync every "
                              "step, so only method=every_step runs are priced by it")
        wanted = overrides_for(r.aggregator, setting.get("set", []))
        mismatch = [] if r.config.get("batch_size") == setting["batch_per_rank"] else [
            f"batch_size={r.config.get('batch_size')} (bench: {setting['batch_per_rank']})"]
        for o in wanted:
            key, value = o.split("=", 1)
            have = _config_value(r.config, key)
            if have is not None and have != yaml.safe_load(value):
                mismatch.append(f"{key}={have} (bench: {value})")
        if mismatch:
            raise ReportError(f"{r.path}: measured on another setting than the bench JSON: {', '.join(mismatch)}")
