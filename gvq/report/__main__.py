"""Report of a sweep (or of any runs):
``python -m gvq.report [DIR ...] [--target-acc 0.9 | --target-loss 1.6] [--out DIR]``.

Finds every run dir under the given dirs (one holding ``metrics.csv``, ``summary.json`` or ``.hydra/``;
default: the latest sweep under ``runs/multirun/``, else the latest run under ``runs/``), groups runs by
their overrides minus ``seed`` (several seeds => mean +- std), and writes into ``<first DIR>/report/``:
``curves.png`` (test accuracy and train loss against iteration and wall-clock), ``breakdown.png``
(computation vs aggregation time per iteration, aggregation split into compress / wire / decompress
/ other, as GradiVeQ's Fig. 7b), ``table.csv`` / ``table.md`` and a self-contained ``report.html``.

``--tta BENCH_JSON``: instead, time to ``--target-acc`` per cell of a ``python -m gvq.bench overlap --out``
JSON: the runs' iterations to the target, per phase, times each phase's seconds per iteration in each cell
(:mod:`gvq.report.tta`): ``tta.md``, ``tta.csv``.

``--frontier``: instead, the accuracy-cost frontier over the settings (a setting: a group of seeds):
bytes per iteration against final accuracy and iterations to ``--target-acc``, seed bands, the
non-dominated settings marked (:mod:`gvq.report.frontier`): ``frontier.md``, ``frontier.csv``,
``frontier.png``; with ``--target-loss`` on a language model's runs, final validation bits per byte (lower
is better) in place of accuracy.

``--cycle``: instead, times per GradiVeQ cycle (``L_t + L_c`` iterations) counted as the paper counts them,
with the paper's claims beside (:mod:`gvq.report.cycle`): ``cycle.csv``, ``cycle.md``, ``cycle.png``.

Speed-ups and compression ratios compare a group with the uncompressed ``rar`` runs of the same setting:
the same resolved config except the aggregator, the seed, logging and the GradiVeQ knobs (which only
GradiVeQ reads).  Iteration time is ``compute_s + aggregate_s`` (evaluation excluded).  Failed and
incomplete runs (no ``summary.json``: killed, or still running) get rows of their own, with the reason,
and no final accuracy.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from gvq.report.runs import ReportError, default_dirs, find_runs, group_runs, load_run
from gvq.report.stats import build_table, group_stats
from gvq.report.target import Target


# -- command line ------------------------------------------------------------------------------------
def load_runs(dirs: list[Path]) -> list:
    """Every run under ``dirs``, loaded; ReportError in one line where there is none."""
    paths = find_runs(dirs)
    if not paths:
        raise ReportError(f"no run dirs (with metrics.csv, summary.json or .hydra/) under "
                          f"{', '.join(map(str, dirs))}")
    return [load_run(p) for p in paths]


def write_report(dirs: list[Path], out: Path, target: float) -> pd.DataFrame:
    from gvq.report import plots as rp  # matplotlib: only when a report is drawn
    runs = load_runs(dirs)
    groups = group_runs(runs)
    stats = {id(g): group_stats(g, target) for g in groups}
    title = f"gvq report: {', '.join(str(d) for d in dirs)}"
    return rp.render(out, title, runs, groups, lambda g: stats[id(g)], build_table(groups, stats), target)


def write_cycle(dirs: list[Path], out: Path) -> str:
    from gvq.report import cycle
    df = cycle.cycle_table(load_runs(dirs))
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "cycle.csv", index=False)
    shown = df.drop(columns=["clock", "cycle"]).round(3)
    claims = cycle.claims(df).round(3)
    text = (f"Seconds per {df['cycle'].iloc[0]} iterations; clock of each row: "
            f"{'; '.join(sorted(set(df['clock'])))}\n\n{shown.to_markdown(index=False)}\n\n"
            f"The paper's claims (GradiVeQ sec. 4) beside these runs:\n\n{claims.to_markdown(index=False)}\n")
    (out / "cycle.md").write_text(text)
    cycle.plot_cycle(df, out / "cycle.png")
    return text + f"-> {out}/cycle.md, cycle.csv, cycle.png"


def write_frontier(dirs: list[Path], out: Path, target: float) -> str:
    from gvq.report import frontier
    groups = group_runs(load_runs(dirs))
    stats = {id(g): group_stats(g, target) for g in groups}
    table = build_table(groups, stats)
    df = frontier.setting_frontier(table, frontier.score_axis(table, target))
    if df.empty:
        raise ReportError("--frontier: no setting with a completed run")
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "frontier.csv", index=False)
    text = frontier.frontier_markdown(df, target)
    (out / "frontier.md").write_text(text)
    frontier.plot_setting_frontier(df, out / "frontier.png", target)
    return text + f"-> {out}/frontier.md, frontier.csv, frontier.png"


def write_tta(dirs: list[Path], out: Path, target: float, bench_paths: list[Path]) -> str:
    import json
    from gvq.report import tta, workload
    # a run that diverged or collapsed trained, and never reached the target (or reached it first): it
    # counts; a failed or incomplete one says nothing about iterations to the target
    runs = [r for r in load_runs(dirs) if r.status in ("completed", "collapsed", "diverged")]
    benches = []
    for path in bench_paths:
        try:
            bench = json.loads(path.read_text())
            benches.append((str(path), {"setting": bench["setting"], "modes": bench["modes"]}))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ReportError(f"--tta {path}: not a gvq.bench overlap --out JSON ({e})") from None
    bench, bench_path = tta.merge_benches(benches), " + ".join(map(str, bench_paths))
    workload.check_bench(runs, bench["setting"], bench_path)      # the runs' model and input, or refused
    tta.check_setting(runs, bench["setting"])
    records = tta.tta_records(runs, bench, target)
    cells = tta.cell_table(records, bench["setting"].get("defaults"), bench["setting"].get("aliases"))
    tables = {"iterations": tta.iteration_table(runs, target), "cells": cells,
              "validation": tta.validation(runs, bench, target)}
    out.mkdir(parents=True, exist_ok=True)
    records.to_csv(out / "tta.csv", index=False)
    text = tta.markdown(tables, bench["setting"], target, bench_path)
    (out / "tta.md").write_text(text)
    return text + f"-> {out}/tta.md, tta.csv"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gvq.report", description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="*", type=Path, help="run or sweep dirs (default: the latest sweep)")
    p.add_argument("--target-acc", type=float, default=0.9, help="accuracy for 'time to target'")
    p.add_argument("--target-loss", type=float, help="instead: a test loss (lower is better; a language model's "
                   "nats per token) for 'time to target'")
    p.add_argument("--out", type=Path, help="output dir (default: <first dir>/report)")
    p.add_argument("--cycle", action="store_true", help="times per L_t + L_c iterations, as the GradiVeQ paper")
    p.add_argument("--frontier", action="store_true",
                   help="accuracy (with --target-loss on LM runs: validation bpb) and iterations to the target "
                        "against bytes per iteration, per setting")
    p.add_argument("--tta", type=Path, nargs="+", metavar="BENCH_JSON",
                   help="time to --target-acc per cell of `gvq.bench overlap --out` JSONs (gvq/report/tta.py; "
                        "several: one bench run in parts, read as one)")
    args = p.parse_args(argv)
    target = Target.loss(args.target_loss) if args.target_loss is not None else Target(args.target_acc)
    try:
        skipped: list[Path] = []
        dirs = args.dirs or default_dirs(skipped=skipped)
        for sweep in skipped:
            print(f"gvq.report: skipped {sweep}: a sweep dir with no run in it", file=sys.stderr)
        out = args.out or dirs[0] / "report"
        if args.cycle:
            print(write_cycle(dirs, out))
            return 0
        if args.tta:
            print(write_tta(dirs, out, target, args.tta))
            return 0
        if args.frontier:
            print(write_frontier(dirs, out, target))
            return 0
        display = write_report(dirs, out, target)
    except ReportError as e:
        print(f"gvq.report: error: {e}", file=sys.stderr)
        return 2
    print(display.to_markdown(index=False))
    others = ", ".join(sorted(p.name for p in out.iterdir() if p.name != "report.html"))
    print(f"-> {out}/report.html ({others})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
