"""Report of a sweep (or of any runs):
``python -m gvq.report [table|frontier|tta|cycle] [DIR ...] [target_acc=0.9 | target_loss=1.6] [--out DIR]``
(keys: :class:`ReportKeys`; ``--cfg`` prints them composed, ``--help`` with their defaults).

Finds every run dir under the given dirs (one holding ``metrics.csv``, ``summary.json`` or ``.hydra/``;
default: the latest sweep under ``runs/multirun/``, else the latest run under ``runs/``), groups runs by
their overrides minus ``seed`` (several seeds => mean +- std), and writes into ``<first DIR>/report/``:
``curves.png`` (test accuracy and train loss against iteration and wall-clock), ``breakdown.png``
(computation vs aggregation time per iteration, aggregation split into compress / wire / decompress
/ other, as GradiVeQ's Fig. 7b), ``table.csv`` / ``table.md`` and a self-contained ``report.html``.

``tta --bench BENCH_JSON``: instead, time to ``target_acc`` per cell of a ``python -m gvq.bench overlap --out``
JSON: the runs' iterations to the target, per phase, times each phase's seconds per iteration in each cell
(:mod:`gvq.report.tta`): ``tta.md``, ``tta.csv``.

``frontier``: instead, the accuracy-cost frontier over the settings (a setting: a group of seeds):
bytes per iteration against final accuracy and iterations to ``target_acc``, seed bands, the
non-dominated settings marked (:mod:`gvq.report.frontier`): ``frontier.md``, ``frontier.csv``,
``frontier.png``; with ``target_loss`` on a language model's runs, final validation bits per byte (lower
is better) in place of accuracy.

``cycle``: instead, times per GradiVeQ cycle (``L_t + L_c`` iterations) counted as the paper counts them,
with the paper's claims beside (:mod:`gvq.report.cycle`): ``cycle.csv``, ``cycle.md``, ``cycle.png``.

Speed-ups and compression ratios compare a group with the uncompressed ``rar`` runs of the same setting:
the same resolved config except the aggregator, the seed, logging and the GradiVeQ knobs (which only
GradiVeQ reads).  Iteration time is ``compute_s + aggregate_s`` (evaluation excluded).  Failed and
incomplete runs (no ``summary.json``: killed, or still running) get rows of their own, with the reason,
and no final accuracy.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pandas as pd

from gvq.report.runs import ReportError, default_dirs, find_runs, group_runs, load_run
from gvq.report.stats import build_table, group_stats
from gvq.report.target import Target, default_target
from gvq.schema.tool import Arg, Command, exit_status


# -- command line ------------------------------------------------------------------------------------
def load_runs(dirs: list[Path]) -> list:
    """Every run under ``dirs``, loaded; ReportError in one line where there is none."""
    paths = find_runs(dirs)
    if not paths:
        raise ReportError(f"no run dirs (with metrics.csv, summary.json or .hydra/) under "
                          f"{', '.join(map(str, dirs))}")
    return [load_run(p) for p in paths]


def write_report(dirs: list[Path], out: Path, target: Target | None) -> pd.DataFrame:
    from gvq.report import plots as rp  # matplotlib: only when a report is drawn
    runs = load_runs(dirs)
    target = _resolved(target, runs)
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


def write_frontier(dirs: list[Path], out: Path, target: Target | None) -> str:
    from gvq.report import frontier
    runs = load_runs(dirs)
    target = _resolved(target, runs)
    groups = group_runs(runs)
    stats = {id(g): group_stats(g, target) for g in groups}
    table = build_table(groups, stats)
    df = frontier.setting_frontier(table, frontier.score_axis(table, target))
    if df.empty:
        raise ReportError("frontier: no setting with a completed run")
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "frontier.csv", index=False)
    text = frontier.frontier_markdown(df, target)
    (out / "frontier.md").write_text(text)
    frontier.plot_setting_frontier(df, out / "frontier.png", target)
    return text + f"-> {out}/frontier.md, frontier.csv, frontier.png"


def write_tta(dirs: list[Path], out: Path, target: Target | None, bench_paths: list[Path]) -> str:
    import json
    from gvq.report import tta, tta_markdown, workload
    # a run that diverged or collapsed trained, and never reached the target (or reached it first): it
    # counts; a failed or incomplete one says nothing about iterations to the target
    runs = [r for r in load_runs(dirs) if r.status in ("completed", "collapsed", "diverged")]
    target = _resolved(target, runs)
    benches = []
    for path in bench_paths:
        try:
            bench = json.loads(path.read_text())
            benches.append((str(path), {"setting": bench["setting"], "modes": bench["modes"]}))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ReportError(f"--bench {path}: not a gvq.bench overlap --out JSON ({e})") from None
    bench, bench_path = tta.merge_benches(benches), " + ".join(map(str, bench_paths))
    workload.check_bench(runs, bench["setting"], bench_path)      # the runs' model and input, or refused
    tta.check_setting(runs, bench["setting"])
    records = tta.tta_records(runs, bench, target)
    cells = tta.cell_table(records, bench["setting"].get("defaults"), bench["setting"].get("aliases"))
    tables = {"iterations": tta.iteration_table(runs, target), "cells": cells,
              "validation": tta.validation(runs, bench, target)}
    out.mkdir(parents=True, exist_ok=True)
    records.to_csv(out / "tta.csv", index=False)
    text = tta_markdown.markdown(tables, bench["setting"], target, bench_path)
    (out / "tta.md").write_text(text)
    return text + f"-> {out}/tta.md, tta.csv"


@dataclass
class ReportKeys:
    # "reaching the target": test accuracy at least this (time and iterations to it); higher => fewer
    # runs reach it; unset (and no target_loss): 0.9, or for a language model's runs target_loss 2.4
    target_acc: Optional[float] = None
    # instead, where set: a validation loss at most this (a language model's nats per token); lower =>
    # fewer runs reach it
    target_loss: Optional[float] = None


def _target_of(cfg) -> Target | None:
    """The target given on the command line; None: :func:`gvq.report.target.default_target` of the runs."""
    if cfg.target_loss is not None:
        return Target.loss(cfg.target_loss)
    return None if cfg.target_acc is None else Target(cfg.target_acc)


def _resolved(target: Target | None, runs) -> Target:
    """``target``, or the runs' default, said on stdout (a default is an answer the reader did not ask)."""
    if target is not None:
        return target
    chosen = default_target(runs)
    print(f"gvq.report: {chosen.said}")
    return chosen


def _dirs_and_out(paths) -> tuple[list[Path], Path]:
    skipped: list[Path] = []
    dirs = paths.dirs or default_dirs(skipped=skipped)
    for sweep in skipped:
        print(f"gvq.report: skipped {sweep}: a sweep dir with no run in it", file=sys.stderr)
    return dirs, paths.out or dirs[0] / "report"


def report_table(cfg, paths) -> pd.DataFrame:
    dirs, out = _dirs_and_out(paths)
    display = write_report(dirs, out, _target_of(cfg))
    print(display.to_markdown(index=False))
    others = ", ".join(sorted(p.name for p in out.iterdir() if p.name != "report.html"))
    print(f"-> {out}/report.html ({others})")
    return display


def report_frontier(cfg, paths) -> str:
    dirs, out = _dirs_and_out(paths)
    print(text := write_frontier(dirs, out, _target_of(cfg)))
    return text


def report_tta(cfg, paths) -> str:
    dirs, out = _dirs_and_out(paths)
    print(text := write_tta(dirs, out, _target_of(cfg), paths.bench))
    return text


def report_cycle(cfg, paths) -> str:
    dirs, out = _dirs_and_out(paths)
    print(text := write_cycle(dirs, out))
    return text


_DIRS = Arg("dirs", "run or sweep dirs (default: the latest sweep)", nargs="*")
_OUT = Arg("--out", "output dir (default: <first dir>/report)")
COMMANDS = {
    "table": Command(ReportKeys, "gvq.report.__main__:report_table",
                     "table, curves, breakdown and report.html of the runs (the default command)", (_DIRS, _OUT)),
    "frontier": Command(ReportKeys, "gvq.report.__main__:report_frontier",
                        "final accuracy (with target_loss: validation bpb) and iterations to the target against "
                        "bytes per iteration, per setting", (_DIRS, _OUT)),
    "tta": Command(ReportKeys, "gvq.report.__main__:report_tta",
                   "time to the target per cell of `gvq.bench overlap --out` JSONs (several: one bench run in "
                   "parts, read as one)", (_DIRS, _OUT, Arg("--bench", "the bench JSONs", nargs="+"))),
    "cycle": Command(ReportKeys, "gvq.report.__main__:report_cycle",
                     "times per L_t + L_c iterations, as the GradiVeQ paper counts them", (_DIRS, _OUT)),
}


def main(argv=None) -> int:
    """``python -m gvq.report [table|frontier|tta|cycle] [DIR ...] [KEY=VALUE ...]``; its exit status (2:
    refused, the reason one line on stderr)."""
    return exit_status("python -m gvq.report", COMMANDS, argv, default="table", errors=(ReportError,))


if __name__ == "__main__":
    sys.exit(main())
