"""Report of a sweep (or of any runs): ``python -m gvq.report [DIR ...] [--target-acc 0.9] [--out DIR]``.

Finds every run dir under the given dirs (one holding ``metrics.csv``, ``summary.json`` or ``.hydra/``;
default: the latest sweep under ``runs/multirun/``, else the latest run under ``runs/``), groups runs by
their overrides minus ``seed`` (several seeds => mean +- std), and writes into ``<first DIR>/report/``:
``curves.png`` (test accuracy and train loss against iteration and wall-clock), ``breakdown.png``
(computation vs aggregation time per 500 iterations, aggregation split into compress / wire / decompress
/ other, as GradiVeQ's Fig. 7b), ``table.csv`` / ``table.md`` and a self-contained ``report.html``.

Speed-ups and compression ratios compare a group with the uncompressed ``rar`` runs of the same setting:
the same resolved config except the aggregator, the seed, logging and the GradiVeQ knobs (which only
GradiVeQ reads).  Iteration time is ``compute_s + aggregate_s`` (evaluation excluded).  Failed and
incomplete runs (no ``summary.json``: killed, or still running) get rows of their own, with the reason,
and no final accuracy.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

UNGROUPED = ("seed=", "hydra.", "logger=", "logger.")         # overrides that do not make a setting
NOT_SETTING = ("aggregator", "seed", "logger", "resume", "checkpoint", "timeout_s", "nan_policy",
               "lambda", "K", "s", "L_t", "L_c", "warmup")    # config keys a rar baseline may differ in
TIMES = ("compute_s", "aggregate_s", "compress_s", "wire_s", "decompress_s")


class ReportError(Exception):
    """A problem with the input: printed as one line, exit status 2."""


@dataclass
class Run:
    path: Path
    status: str                       # completed | failed | incomplete
    reason: str
    aggregator: str
    overrides: list
    config: dict
    metrics: pd.DataFrame | None
    summary: dict = field(default_factory=dict)


@dataclass
class Group:
    label: str
    key: tuple
    runs: list

    @property
    def status(self) -> str:
        return self.runs[0].status

    @property
    def aggregator(self) -> str:
        return self.runs[0].aggregator


# -- finding and reading runs -------------------------------------------------------------------------
def is_run_dir(p: Path) -> bool:
    return (p / "metrics.csv").is_file() or (p / "summary.json").is_file() or (p / ".hydra").is_dir()


def find_runs(roots: list[Path]) -> list[Path]:
    """Run dirs at or below ``roots`` (not below a run dir: its subfolders are its own files)."""
    found = []
    for root in roots:
        if not root.is_dir():
            raise ReportError(f"{root}: not a directory")
        stack = [root]
        while stack:
            d = stack.pop()
            if is_run_dir(d):
                found.append(d)
                continue
            stack.extend(c for c in d.iterdir() if c.is_dir() and c.name not in ("report", "wandb"))
    return sorted(set(found), key=lambda p: (str(p.parent), _natural(p.name)))


def _natural(name: str):
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def default_dirs(base: Path = Path("runs")) -> list[Path]:
    """The latest sweep under ``runs/multirun/``, else the latest single run under ``runs/``."""
    sweeps = [p.parent for p in (base / "multirun").glob("**/multirun.yaml")]
    if sweeps:
        return [max(sweeps, key=lambda p: (p / "multirun.yaml").stat().st_mtime)]
    runs = [p.parent for p in base.glob("**/.hydra") if "multirun" not in p.parts]
    if runs:
        return [max(runs, key=lambda p: p.stat().st_mtime)]
    raise ReportError(f"no runs under {base}/ (give a run or sweep dir: python -m gvq.report DIR)")


def _yaml(path: Path):
    try:
        return yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return None


def read_metrics(path: Path) -> pd.DataFrame | None:
    """``metrics.csv`` as numbers; a truncated last line (a run killed mid-write) is dropped."""
    try:
        df = pd.read_csv(path, on_bad_lines="skip")
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return None
    for col in df.columns:
        if col != "phase":
            df[col] = pd.to_numeric(df[col], errors="coerce")
    if "wall_s" not in df or "iteration" not in df:
        return None
    return df.dropna(subset=["iteration", "wall_s"]).reset_index(drop=True)


def _aggregator(summary: dict, hydra_cfg, overrides: list, config: dict) -> str:
    if summary.get("job_type"):
        return summary["job_type"]
    runtime = (hydra_cfg or {}).get("hydra", {}).get("runtime", {})
    choice = (runtime.get("choices") or {}).get("aggregator")
    if choice:
        return choice
    for o in overrides:
        if o.startswith("aggregator="):
            return o.split("=", 1)[1]
    target = (config.get("aggregator") or {}).get("_target_", "?")
    return target.rsplit(".", 1)[-1]


def _status(summary: dict | None, metrics, config: dict) -> tuple[str, str]:
    if summary is not None:
        return summary.get("status", "unknown"), summary.get("reason") or ""
    done = 0 if metrics is None else len(metrics)
    total = config.get("iterations", "?")
    return "incomplete", f"no summary.json (killed, or still running): {done}/{total} iterations logged"


def load_run(path: Path) -> Run:
    summary = None
    if (path / "summary.json").is_file():
        try:
            summary = json.loads((path / "summary.json").read_text())
        except (OSError, json.JSONDecodeError):
            summary = {"status": "failed", "reason": "summary.json unreadable"}
    hydra_cfg = _yaml(path / ".hydra" / "hydra.yaml")
    overrides = (summary or {}).get("overrides") or _yaml(path / ".hydra" / "overrides.yaml") or []
    config = (summary or {}).get("config") or _yaml(path / ".hydra" / "config.yaml") or {}
    metrics = read_metrics(path / "metrics.csv")
    status, reason = _status(summary, metrics, config)
    return Run(path, status, reason, _aggregator(summary or {}, hydra_cfg, overrides, config),
               [str(o) for o in overrides], config, metrics, summary or {})


# -- grouping ------------------------------------------------------------------------------------------
def group_runs(runs: list[Run]) -> list[Group]:
    """Same overrides (minus seed) and same status => one group; labels keep what differs."""
    keyed: dict[tuple, list[Run]] = {}
    for r in runs:
        key = tuple(sorted(o for o in r.overrides if not o.startswith(UNGROUPED)))
        keyed.setdefault((key, r.aggregator, r.status), []).append(r)
    common = set.intersection(*(set(k[0]) for k in keyed)) if keyed else set()
    groups = []
    for (key, agg, status), members in keyed.items():
        shown = sorted((o for o in key if o not in common), key=lambda o: not o.startswith("aggregator="))
        label = " ".join(_short(o) for o in shown) or agg
        groups.append(Group(label, (key, agg, status), members))
    order = {"completed": 0, "failed": 1, "incomplete": 2}
    return sorted(groups, key=lambda g: (order.get(g.status, 3), g.aggregator != "rar", g.label))


def _short(override: str) -> str:
    """``aggregator=orq`` -> ``orq``; ``aggregator.compressor.levels=5`` -> ``levels=5``."""
    if override.startswith("aggregator="):
        return override.split("=", 1)[1]
    for prefix in ("aggregator.compressor.", "aggregator."):
        if override.startswith(prefix):
            return override[len(prefix):]
    return override


def setting_key(config: dict) -> str:
    """What a rar baseline must share with a group: the resolved config minus ``NOT_SETTING``."""
    return json.dumps({k: v for k, v in config.items() if k not in NOT_SETTING}, sort_keys=True,
                      default=str)


# -- numbers -------------------------------------------------------------------------------------------
def run_stats(run: Run, target: float) -> dict:
    """One run's numbers, straight from its metrics.csv (summary.json where there is no CSV)."""
    m, s = run.metrics, run.summary
    if m is None or m.empty:
        return {"final_acc": s.get("final_test_acc", np.nan),
                "aggregate_s": s.get("mean_aggregate_s", np.nan)}
    out = {k: m[k].mean() for k in TIMES + ("bytes_sent",) if k in m}
    out["iter_s"] = (m["compute_s"] + m["aggregate_s"]).mean()
    evals = m.dropna(subset=["test_acc"]) if "test_acc" in m else m.iloc[:0]
    out["final_acc"] = evals["test_acc"].iloc[-1] if len(evals) else np.nan
    hit = evals[evals["test_acc"] >= target]
    out["target_s"] = hit["wall_s"].iloc[0] if len(hit) else np.nan
    for col in ("compression_error", "compression_ratio"):
        if col in m and m[col].notna().any():
            out[col] = m[col].mean()
    if "compression_error" in out:          # heavy-tailed (GradiVeQ's Eq. 7 loss): the median too
        out["error_median"] = m["compression_error"].median()
    return out


def _mean_std(values: list) -> tuple[float, float]:
    v = np.array([x for x in values if x is not None and not np.isnan(x)], dtype=float)
    if not len(v):
        return np.nan, np.nan
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else np.nan


def group_stats(g: Group, target: float) -> dict:
    per = [run_stats(r, target) for r in g.runs]
    keys = sorted({k for p in per for k in p})
    out = {}
    for k in keys:
        out[k], out[k + "_std"] = _mean_std([p.get(k, np.nan) for p in per])
    out["reached"] = sum(not np.isnan(p.get("target_s", np.nan)) for p in per)
    return out


def baseline_for(g: Group, groups: list[Group], stats: dict) -> dict | None:
    """Pooled means of the completed rar runs sharing ``g``'s setting (None if there are none)."""
    want = {setting_key(r.config) for r in g.runs}
    rar = [h for h in groups if h.aggregator == "rar" and h.status == "completed"
           and {setting_key(r.config) for r in h.runs} == want]
    if not rar:
        return None
    weights = [len(h.runs) for h in rar]
    return {k: np.average([stats[id(h)].get(k, np.nan) for h in rar], weights=weights)
            for k in ("aggregate_s", "iter_s", "bytes_sent")}


def build_table(groups: list[Group], stats: dict) -> pd.DataFrame:
    """The numeric table (one row per group; ``stats``: id(group) -> group_stats): ``table.csv``."""
    rows = []
    for g in groups:
        s, base = stats[id(g)], baseline_for(g, groups, stats)
        done = g.status == "completed"
        ratio = (base["bytes_sent"] / s["bytes_sent"] if base and s.get("bytes_sent", 0) > 0
                 else s.get("compression_ratio", np.nan))
        rows.append({
            "group": g.label, "aggregator": g.aggregator, "runs": len(g.runs), "status": g.status,
            "reason": "; ".join(sorted({r.reason for r in g.runs if r.reason})),
            "final_top1": s.get("final_acc") if done else np.nan,
            "final_top1_std": s.get("final_acc_std") if done else np.nan,
            "time_to_target_s": s.get("target_s", np.nan), "reached": f"{s['reached']}/{len(g.runs)}",
            "aggregate_s_per_iter": s.get("aggregate_s", np.nan),
            "aggregation_speedup": base["aggregate_s"] / s["aggregate_s"] if base else np.nan,
            "iteration_s": s.get("iter_s", np.nan),
            "iteration_speedup": base["iter_s"] / s["iter_s"] if base and "iter_s" in s else np.nan,
            "bytes_per_iter": s.get("bytes_sent", np.nan), "compression_ratio": ratio,
            "compression_error": s.get("compression_error", np.nan),
            "compression_error_median": s.get("error_median", np.nan),
            "run_dirs": " ".join(str(r.path) for r in g.runs)})
    return pd.DataFrame(rows)


# -- command line ------------------------------------------------------------------------------------
def write_report(dirs: list[Path], out: Path, target: float) -> pd.DataFrame:
    from . import report_plots as rp
    paths = find_runs(dirs)
    if not paths:
        raise ReportError(f"no run dirs (with metrics.csv, summary.json or .hydra/) under "
                          f"{', '.join(map(str, dirs))}")
    runs = [load_run(p) for p in paths]
    groups = group_runs(runs)
    stats = {id(g): group_stats(g, target) for g in groups}
    title = f"gvq report: {', '.join(str(d) for d in dirs)}"
    return rp.render(out, title, runs, groups, lambda g: stats[id(g)], build_table(groups, stats), target)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gvq.report", description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="*", type=Path, help="run or sweep dirs (default: the latest sweep)")
    p.add_argument("--target-acc", type=float, default=0.9, help="accuracy for 'time to target'")
    p.add_argument("--out", type=Path, help="output dir (default: <first dir>/report)")
    args = p.parse_args(argv)
    try:
        dirs = args.dirs or default_dirs()
        out = args.out or dirs[0] / "report"
        display = write_report(dirs, out, args.target_acc)
    except ReportError as e:
        print(f"gvq.report: error: {e}", file=sys.stderr)
        return 2
    print(display.to_markdown(index=False))
    others = ", ".join(sorted(p.name for p in out.iterdir() if p.name != "report.html"))
    print(f"-> {out}/report.html ({others})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
