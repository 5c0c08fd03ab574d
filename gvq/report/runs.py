"""Runs on disk: find run dirs, load one (its summary.json, Hydra files and metrics.csv, never the
training code), and group runs into settings (several seeds of one setting => one group).

A run's ``summary.json`` lists the knobs its aggregator ignored (``inert_knobs``): grouping drops
overrides of those, so a ``-m aggregator=rar,gradiveq lambda=0.01,0.05`` sweep shows one ``rar`` group.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from gvq.schema.config import NOT_A_SETTING
from gvq.schema.setting import VARIANT_KEYS, canonical_name, method_name, short

NOT_SETTING = ("aggregator", "method", "seed", "logger", "resume", "checkpoint", "timeout_s", "nan_policy",
               "lambda", "K", "s", "L_t", "L_c", "warmup")    # config keys a rar baseline may differ in


class ReportError(Exception):
    """A problem with the input: printed as one line, exit status 2."""


@dataclass
class Run:
    path: Path
    status: str                       # completed | collapsed | diverged | failed | incomplete | ...
    reason: str
    aggregator: str
    overrides: list
    config: dict
    metrics: pd.DataFrame | None
    summary: dict = field(default_factory=dict)

    @property
    def setting(self) -> str:
        """The option and each ``aggregator.*`` override off the option's default
        (:func:`gvq.schema.setting.canonical_name`, the name the bench and the cost model key it by),
        inert knobs left out."""
        return canonical_name(self.aggregator, [o for o in self.overrides if not _inert(o, self)])

    @property
    def method(self) -> str:
        """Its ``method=`` and the ``method.*`` knobs off their defaults (``diloco every=10``;
        :func:`gvq.schema.setting.method_name`, the name the projection gives it); "" for ``every_step``."""
        chosen = next((o.split("=", 1)[1] for o in reversed(self.overrides) if o.startswith("method=")), "")
        return method_name(chosen or "every_step", [o for o in self.overrides if o.startswith("method.")])

    @property
    def named(self) -> str:
        """:attr:`setting`, then :attr:`method` where it is not the default: what a figure colours."""
        return " ".join(filter(None, (self.setting, self.method)))

    @property
    def variant(self) -> str:
        """How it reduced its gradients: ``overlap`` (inside backward, ``aggregator.overlap``) or ``post``."""
        return "overlap" if (self.config.get("aggregator") or {}).get("overlap") else "post"


@dataclass
class Group:
    label: str
    key: tuple
    runs: list

    @property
    def status(self) -> str:
        """A collapsed run (loss back at chance) trained every iteration: its seeds count with the others'."""
        return finished(self.runs[0].status)

    @property
    def collapsed(self) -> int:
        """How many of the group's runs ended at chance: the loss back there, or never out of it (the
        report marks them)."""
        return sum(r.status in AT_CHANCE for r in self.runs)

    @property
    def aggregator(self) -> str:
        return self.runs[0].aggregator

    @property
    def clock(self) -> str:
        return clock_of(self.runs[0])


def clock_of(run: Run) -> str:
    """The clock a run's times are on, as an axis names it: ``wall-clock`` or ``virtual time (compute
    x0.167, codec x1)`` (net.clock; runs from before virtual time were all wall-clock)."""
    net = (run.config or {}).get("net") or {}
    if net.get("clock", "wall") != "virtual":
        return "wall-clock"
    return f"virtual time (compute ×{net.get('compute_scale', 1):.3g}, codec ×{net.get('codec_scale', 1):.3g})"


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


def default_dirs(base: Path = Path("runs"), skipped: list | None = None) -> list[Path]:
    """The latest sweep under ``runs/multirun/`` that holds a run, else the latest single run under
    ``runs/``; newer sweep dirs with no run in them (a sweep interrupted before its first job, or one
    made by an older gvq, which refused a sweep after Hydra had made its dir) are appended to ``skipped``."""
    sweeps = sorted((p.parent for p in (base / "multirun").glob("**/multirun.yaml")),
                    key=lambda p: (p / "multirun.yaml").stat().st_mtime, reverse=True)
    for sweep in sweeps:
        if find_runs([sweep]):
            return [sweep]
        if skipped is not None:
            skipped.append(sweep)
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
def finished(status: str) -> str:
    """completed for a run that trained every iteration (collapsed and never-learned ones included),
    else its status."""
    return "completed" if status in AT_CHANCE else status


#: statuses of runs that trained every iteration and ended at chance: their seeds count with the
#: others' (dropping them would flatter the method), and the report says how many
AT_CHANCE = ("collapsed", "never_learned")


def group_runs(runs: list[Run]) -> list[Group]:
    """One setting under one method (:attr:`Run.named`), the same other overrides (minus seed, logging and inert knobs)
    and the same status => one group.  A label is the setting's whole name, then the other overrides
    that differ between groups: a value that names the setting is never dropped for being shared."""
    keyed: dict[tuple, list[Run]] = {}
    for r in runs:
        rest = tuple(sorted(o for o in r.overrides if not o.startswith(NOT_A_SETTING) and not _inert(o, r)
                            and not _names_setting(o) and not o.startswith("method")))
        keyed.setdefault((r.named, rest, r.aggregator, finished(r.status)), []).append(r)
    common = set.intersection(*(set(k[1]) for k in keyed)) if keyed else set()
    groups = []
    for (named, rest, agg, status), members in keyed.items():
        label = " ".join([named, *(short(o) for o in rest if o not in common)])
        groups.append(Group(label, (named, rest, agg, status), members))
    order = {"completed": 0, "failed": 1, "incomplete": 2}
    return sorted(groups, key=lambda g: (order.get(g.status, 3), g.aggregator != "rar", g.label))


def _names_setting(override: str) -> bool:
    """``aggregator=...`` or an ``aggregator.*`` key that :attr:`Run.setting` writes (the variant's keys,
    ``overlap`` and ``bucket_cap_mb``, are not in a setting's name: they stay in its group's key)."""
    if not override.startswith("aggregator"):
        return False
    return short(override).split("=", 1)[0] not in VARIANT_KEYS


def _inert(override: str, run: Run) -> bool:
    """An override of a knob the run's aggregator did not read (``lambda=0.05`` on a rar run)."""
    return override.split("=", 1)[0].lstrip("+~") in run.summary.get("inert_knobs", ())


def setting_key(config: dict) -> str:
    """What a rar baseline must share with a group: the resolved config minus ``NOT_SETTING``."""
    return json.dumps({k: v for k, v in config.items() if k not in NOT_SETTING}, sort_keys=True,
                      default=str)


