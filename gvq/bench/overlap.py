"""Compression judged against the overlapped baseline: ``python -m gvq.bench overlap``.

For each cell (world size N, link, regime: ``net.compute_scale`` 1 a CPU cluster, 1/6 the GradiVeQ
paper's GPUs), one spawn of N loopback ranks times, interleaved on the same batches and in virtual time:
compute alone (``local``: no communication, as torch's ``noop_hook``), and every aggregator
post-backward and overlapped (``aggregator.overlap=true``: gvq's ring inside backward through the DDP
hook), at DDP's default buckets and at ``bucket_mb``, over the cell's emulated link.  One spawn per
cell, not per N: a rank keeps every mode's aggregator (GradiVeQ's bases, PowerSGD's Q) for the whole
spawn, and with every link in one spawn N = 8 ran a small host out of memory.  A mode's seconds per
iteration are the median of ``iters`` iterations with the bootstrap interval of that median
(:mod:`gvq.report.intervals`).  Per cell the table names the end-to-end winner only where its interval lies
below every other mode's (else the tie, listing the tied), its gain over overlapped fp16, the baseline
practitioners run (Agarwal et al., MLSys 2022), as the range the intervals allow, and checks that
overlapped RAR hides what it can: where post-backward RAR's aggregation is shorter than the backward
pass, its exposed communication is at most the last bucket's own averaging plus a tenth of the compute
time.

``wall=true``: the overlapped ring against torch DDP's own all-reduce on the same (default) buckets, wall
clock on unshaped loopback (torch's collectives never pass through gvq's link emulator or clock).
"""
from __future__ import annotations

import argparse
import statistics
from types import SimpleNamespace

from gvq.bench import Progress
from gvq.bench.common import net_defaults, print_markdown
from gvq.schema.compose import load_grid
from gvq.schema.errors import ConfigError
from gvq.schema.tool import choose, namespace
from gvq.schema.setting import BENCH_VERSION, Setting, aliases, variant_name
from gvq.report.intervals import CONFIDENCE, SEED, Interval, best_of, median_interval
from gvq.bench.train import ModeSpec, RUN_DEFAULTS, run_iterations, workload
from gvq.run.logs import write_json_atomic

OVERLAP = ("aggregator.overlap=true",)
HIDE_SLACK = 0.10          # exposed RAR may exceed its last bucket's averaging by this share of compute
#                            (forward + backward); larger => a laxer hiding check


#: the variants ``variants`` picks from: post-backward, overlapped at DDP's default buckets, overlapped
#: at ``bucket_mb``
VARIANTS = ("post", "overlap", "small")


def table_grid():
    """The table's grid (conf/grid/overlap.yaml): its settings, the overrides they start from (PowerSGD's
    rank), world sizes, links and regimes: the ``grid`` key's defaults."""
    return load_grid("overlap")


def variants(bucket_mb: float, kinds=VARIANTS) -> list[tuple[str, float | None, tuple[str, ...]]]:
    """(variant, bucket size, overrides): post-backward; overlapped at DDP's default buckets; overlapped
    at ``bucket_mb`` (those in ``kinds``)."""
    every = {"post": ("post", None, ()), "overlap": ("overlap", None, OVERLAP),
             "small": ("overlap", bucket_mb, OVERLAP + (f"aggregator.bucket_cap_mb={bucket_mb:g}",))}
    return [every[k] for k in VARIANTS if k in kinds]


def scoped(common) -> tuple[list[str], list[str]]:
    """``grid.set`` split: its ``OPTION:KEY=VALUE`` entries (what that option's settings start from, each
    named in the setting) and its ``KEY=VALUE`` ones (for every aggregator, unnamed)."""
    mine = [o for o in common if ":" in o.split("=", 1)[0]]
    return mine, [o for o in common if o not in mine]


def cell_specs(links: list[float], aggregators, bucket_mb: float, kinds=VARIANTS,
               common=None) -> list[ModeSpec]:
    """Every mode of one spawn: compute alone once (no link), then setting x variant x link; a setting is a
    ``grid.settings`` entry (:meth:`Setting.parse`) starting from ``common``'s (``grid.set``; None: the
    grid file's) entries for its option, its own key replacing theirs, named by every value that differs
    from the option's defaults (:attr:`Setting.canonical`: ``powersgd rank=4``); ``common``'s unscoped
    entries apply to every aggregator after its own."""
    base, every = scoped(table_grid().set if common is None else common)
    specs = [ModeSpec("local", "local")]
    for bps in links:
        for entry in aggregators:
            s = Setting.parse(entry, base)
            for variant, cap, extra in variants(bucket_mb, kinds):
                specs.append(ModeSpec(f"{s.canonical} ({variant_name(variant, cap)}) at {bps:g} bit/s", s.option,
                                      s.overrides + tuple(every) + extra, bps, variant, cap, s.canonical))
    return specs


def _column(rows: list[dict], col: str) -> list[float]:
    return [r[col] for r in rows]


def _median(rows: list[dict], col: str) -> float:
    return statistics.median(_column(rows, col))


def mode_records(raw: dict, specs: list[ModeSpec], world: int, scale: float) -> list[dict]:
    """One record per (aggregator, variant, link): medians over the timed iterations; seconds per
    iteration also with every iteration's own (each the maximum over ranks) and the bootstrap interval
    of their median."""
    alone = {k: _median(raw["rows"]["local"], k) for k in ("iter_s", "compute_s", "backward_s")}
    out = []
    for spec in specs:
        if spec.option == "local":
            continue
        rows = raw["rows"][spec.label]
        rec = {"N": world, "compute_scale": scale, "link_Mbps": spec.bandwidth / 1e6, "aggregator": spec.option,
               "setting": spec.setting,
               "variant": variant_name(spec.variant, spec.bucket_mb), "overlapped": spec.variant == "overlap",
               "bucket_mb": spec.bucket_mb, "alone_s": alone["iter_s"], "compute_s": alone["compute_s"],
               "backward_s": alone["backward_s"]}
        for k in ("aggregate_s", "comm_s", "exposed_s", "last_bucket_s", "straggle_s"):
            rec[k] = _median(rows, k)
        every = _column(rows, "iter_s")
        ci = median_interval(every)                 # its median is the record's iter_s
        rec.update(iter_s=ci.median, iter_lo_s=ci.lo, iter_hi_s=ci.hi, iters_s=every)
        out.append(rec)
    return out


def _interval(rec: dict) -> Interval:
    return Interval(rec["iter_s"], rec["iter_lo_s"], rec["iter_hi_s"])


def _mode_name(rec: dict) -> str:
    return f"{rec['setting']} ({rec['variant']})"


#: the reference every cell's gain is over: fp16 overlapped at DDP's default buckets
FP16_OVERLAP = "fp16 (overlap)"


def cell_summary(records: list[dict]) -> list[dict]:
    """Per (N, link, regime): the winner end to end, or the tie (every mode whose interval overlaps the
    best's), its gain over overlapped fp16 with the range the two intervals allow, RAR's hiding check."""
    cells: dict[tuple, list[dict]] = {}
    for r in records:
        cells.setdefault((r["N"], r["link_Mbps"], r["compute_scale"]), []).append(r)
    out = []
    for (world, mbps, scale), recs in sorted(cells.items()):
        won = best_of({_mode_name(r): _interval(r) for r in recs}, FP16_OVERLAP)
        best = next(r for r in recs if _mode_name(r) == won["best"])
        fp16 = next((r for r in recs if _mode_name(r) == FP16_OVERLAP), None)
        rec = {"N": world, "link_Mbps": mbps, "compute_scale": scale, "alone_s": best["alone_s"],
               "winner": won["winner"], "tied": won["tied"], "best": won["best"], "winner_s": best["iter_s"],
               "winner_lo_s": best["iter_lo_s"], "winner_hi_s": best["iter_hi_s"],
               "fp16_overlap_s": fp16 and fp16["iter_s"], "fp16_lo_s": fp16 and fp16["iter_lo_s"],
               "fp16_hi_s": fp16 and fp16["iter_hi_s"], "gain_over_fp16": won["gain"],
               **{k: won[k] for k in ("gain_lo", "gain_hi", "gain_within_noise")}}
        rec.update(rar_hiding(recs))
        out.append(rec)
    return out


def rar_hiding(recs: list[dict]) -> dict:
    """The hiding target for overlapped RAR at DDP's default buckets: exposed <= its last bucket + a tenth
    of the compute time (forward + backward).  None where it does not apply: post-backward RAR's
    aggregation is no shorter than backward alone (buckets exist only from backward on, so nothing
    longer can hide behind it)."""
    post = next((r for r in recs if r["setting"] == "rar" and r["variant"] == "post"), None)
    over = next((r for r in recs if r["setting"] == "rar" and r["variant"] == "overlap"), None)
    if post is None or over is None or post["aggregate_s"] >= post["backward_s"]:
        return {"rar_exposed_s": over["exposed_s"] if over else None, "rar_bound_s": None, "rar_hides": None}
    bound = over["last_bucket_s"] + HIDE_SLACK * post["compute_s"]
    return {"rar_exposed_s": over["exposed_s"], "rar_bound_s": bound, "rar_hides": over["exposed_s"] <= bound}


def run_cell(args, world: int, scale: float, bps: float) -> list[dict]:
    """One spawn for one cell: its ranks hold only this link's aggregators (memory, see the docstring)."""
    run = argparse.Namespace(**{**RUN_DEFAULTS, **vars(args), "net": {**args.net, "compute_scale": scale},
                                "compressed_only": True, "bandwidth": bps,
                                "specs": cell_specs([bps], args.aggregators, args.bucket_mb, args.variants,
                                                    args.set)})
    return mode_records(run_iterations(run, world), run.specs, world, scale)


def run_table(args) -> tuple[list[dict], list[dict]]:
    records, shown = [], Progress("overlap", len(args.world_size) * len(args.compute_scale) * len(args.bandwidth))
    shape = workload(args).sample_shape
    for world in args.world_size:
        for scale in args.compute_scale:
            recs = []
            for bps in args.bandwidth:      # one spawn a cell: its line as it ends (a grid runs for minutes)
                cell = run_cell(args, world, scale, bps)
                recs += cell
                shown.done(f"N={world}, compute x{scale:g}, {bps / 1e6:g} Mbit/s: {len(cell)} modes")
            print_markdown([{**r, "iter_ci": _interval(r).text()} for r in recs],
                           ["link_Mbps", "setting", "variant", "iter_s", "iter_ci", "aggregate_s", "comm_s",
                            "exposed_s", "last_bucket_s", "straggle_s", "alone_s"],
                           f"seconds per iteration, virtual time (compute x{scale:g}, codec x{args.codec_scale:g}), "
                           f"N={world}, model={args.model}, input {'x'.join(map(str, shape))}, "
                           f"batch {args.batch_size}/rank, median of {args.iters} iterations after "
                           f"{args.warmup} warm-up (iter_ci: {CONFIDENCE:.0%} bootstrap interval of the median), "
                           "compressed phase pinned, garbage collected between iterations only")
            records += recs
    cells = cell_summary(records)
    print_markdown([cell_row(c) for c in cells],
                   ["N", "link_Mbps", "compute_scale", "alone_s", "winner", "winner_s", "winner_ci",
                    "fp16_overlap_s", "fp16_ci", "gain_over_fp16", "gain_range", "rar_exposed_s", "rar_bound_s",
                    "rar_hides"],
                   f"per cell: the end-to-end winner where its {CONFIDENCE:.0%} interval lies below every other "
                   "mode's, else the tie (every mode whose interval overlaps the best's; winner_s: the best "
                   "median), its gain over overlapped fp16 (the range the intervals allow; 'within noise' where "
                   "they overlap), virtual time; and whether overlapped RAR's exposed communication <= its last "
                   f"bucket + {HIDE_SLACK:g} x compute, where post-backward RAR aggregates faster than backward "
                   "alone runs")
    return records, cells


def cell_row(cell: dict) -> dict:
    """One cell for the printed table: the intervals and the gain's range as text."""
    best = Interval(cell["winner_s"], cell["winner_lo_s"], cell["winner_hi_s"])
    row = {**cell, "winner_ci": best.text(), "fp16_ci": None, "gain_range": None}
    if cell["fp16_overlap_s"] is not None:
        row["fp16_ci"] = Interval(cell["fp16_overlap_s"], cell["fp16_lo_s"], cell["fp16_hi_s"]).text()
        gain = Interval(cell["gain_over_fp16"], cell["gain_lo"], cell["gain_hi"]).text(".3g")
        row["gain_range"] = gain + (" within noise" if cell["gain_within_noise"] else "")
    return row


def setting(args) -> dict:
    """What the figures were measured on, written beside them (``--out``): what a reader of the JSON
    (``python -m gvq.report tta``) shows and checks against its runs."""
    base = scoped(args.set)[0]
    return {"model": args.model, "input_shape": list(workload(args).sample_shape),
            "batch_per_rank": args.batch_size,
            # grid.set beyond the grid file's: what every run priced must have set too (gvq.report.tta)
            "num_classes": args.num_classes, "set": [o for o in args.set if o not in table_grid().set],
            # each family's default setting, which the report's gain over the family default is over
            "defaults": {o: Setting.parse(o, base).canonical for o in
                         sorted({Setting.parse(a).option for a in args.aggregators})},
            "aliases": aliases(args.aggregators, base), "iters": args.iters, "warmup": args.warmup,
            "interval": f"{CONFIDENCE:.0%} percentile bootstrap of the median, seed {SEED}",
            "codec_scale": args.codec_scale, "clock": "virtual", "net": args.net}


def run_wall(args) -> list[dict]:
    """Overlapped gvq RAR vs torch DDP, default buckets, wall clock, unshaped loopback."""
    from gvq.bench.train import print_iterations, summarize_iterations
    specs = [ModeSpec("torch_ddp", "torch_ddp"), ModeSpec("rar_overlap", "rar", OVERLAP)]
    run = argparse.Namespace(**{**RUN_DEFAULTS, **vars(args), "net": net_defaults(), "bandwidth": None,
                                "specs": specs})
    world = args.world_size[0]
    recs = summarize_iterations(run_iterations(run, world), run, world, "unshaped loopback")
    print_iterations(recs, f"overlapped gvq RAR vs torch DDP on DDP's default buckets, N={world}, wall clock")
    return recs


#: net keys the bench sets itself: the clock (virtual), the regime (grid.compute_scales), the links
OWN_NET = {"clock": "virtual", "compute_scale": 1.0, "bandwidth_bps": None, "latency_s": 0.0}


def overlap_args(cfg, paths) -> SimpleNamespace:
    """The composed keys as the namespace the table reads (``args.world_size`` ... from the grid), checked
    before any rank starts: a malformed setting, a bad size or a net key the bench sets is a ConfigError
    (one line naming it)."""
    args = namespace(cfg, paths)
    g = args.grid
    args.aggregators, args.world_size, args.bandwidth = g["settings"], g["world_sizes"], g["links_bps"]
    args.compute_scale, args.set, args.codec_scale = g["compute_scales"], g["set"], args.net["codec_scale"]
    _check_settings(args.aggregators, scoped(args.set)[0])
    choose("variants", args.variants, VARIANTS)
    if not (args.world_size and args.bandwidth and args.compute_scale) or min(args.world_size) < 1 or \
            min(args.bandwidth) <= 0 or min(args.compute_scale) <= 0 or args.bucket_mb <= 0:
        raise ConfigError("grid.world_sizes >= 1; grid.links_bps, grid.compute_scales and bucket_mb > 0")
    own = [k for k, v in OWN_NET.items() if args.net[k] != v] + [o for o in args.set if o.startswith("net.")]
    if own:
        raise ConfigError(f"{own[0] if '=' in own[0] else 'net.' + own[0]}: this benchmark sets it (virtual time; "
                          "grid.compute_scales, grid.links_bps; other net keys as net.KEY=VALUE)")
    return args


def _check_settings(entries, base) -> None:
    """Each entry well formed and a setting of its own: two entries that name one setting
    (``qsgd`` and ``qsgd:compressor.bits=4``, its default) would time it twice under one name."""
    seen: dict[str, str] = {}
    for entry in entries:
        try:
            name = Setting.parse(entry, base).canonical
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if name in seen:
            raise ConfigError(f"grid.settings {entry}: the same setting as {seen[name]} ({name!r})")
        seen[name] = entry


def bench_overlap(cfg, paths):
    """``python -m gvq.bench overlap [KEY=VALUE ...] [--out F]``: the per-mode table and the per-cell
    summary (or, ``wall=true``, the wall-clock check against torch DDP)."""
    args = overlap_args(cfg, paths)
    if args.wall:
        out = run_wall(args)
    else:
        records, cells = run_table(args)
        out = {"version": BENCH_VERSION, "setting": setting(args), "modes": records, "cells": cells}
    if args.out:
        write_json_atomic(args.out, out)
    return out
