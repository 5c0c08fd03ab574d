"""What "reaching the target" means for a report: test accuracy at least a value (``target_acc``), or a
loss-like column at most one (``target_loss``: a language model's validation loss in nats per token).
Formatted as its value (``f"{target:g}"``), so the tables that print the number print it either way.
Time to a target leaves out iteration 0's one-off start-up (:func:`startup_s`)."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


#: the defaults where a report is given no target: a language model's validation loss (nats per token) is the
#: Makefile's LM_TARGET (``make lm-frontier``; docs/results.md's transformer frontier: rar is below it well
#: inside experiment=lm_tta's budget); any other run's test accuracy
LM_TARGET_LOSS = 2.4
ACC_TARGET = 0.9


@dataclass(frozen=True)
class Target:
    value: float
    column: str = "test_acc"
    lower_is_better: bool = False
    chosen: str = ""           # why this target where none was given ("": given on the command line)

    @classmethod
    def loss(cls, value: float, chosen: str = "") -> "Target":
        return cls(value, "test_loss", lower_is_better=True, chosen=chosen)

    @property
    def said(self) -> str:
        """The target in the report's own words, with why it was chosen where no one gave it."""
        return f"target: {self.describe}" + (f" ({self.chosen})" if self.chosen else "")

    @property
    def label(self) -> str:
        """``acc 0.8`` or ``loss 2.1``: the target as a table's header names it."""
        return f"{'loss' if self.lower_is_better else 'acc'} {self.value:g}"

    @property
    def describe(self) -> str:
        """``test accuracy 0.8`` or ``validation loss 2.4``: the target in a sentence.  A loss target is the
        held-out split's, which every table and figure of the report calls validation."""
        return f"validation loss {self.value:g}" if self.lower_is_better else f"test accuracy {self.value:g}"

    def reached(self, rows: pd.DataFrame) -> pd.Series:
        """Per row: at or beyond the target (an evaluation row that has the column; False elsewhere)."""
        if self.column not in rows:
            return pd.Series(False, index=rows.index)
        col = rows[self.column]
        return (col <= self.value) if self.lower_is_better else (col >= self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def typical_first_step(metrics: pd.DataFrame) -> float | None:
    """What iteration 0 would cost without its one-off start-up (the first forward and backward, the
    first contact between ranks, allocations, kernels compiled): the median ``compute_s + aggregate_s``
    of the later iterations of its phase (GradiVeQ's warm-up is dearer than its compressed phase), of all
    later ones where the log has no phase.  None where the log does not start at iteration 0 (a resumed
    run's rows) or has nothing to compare with."""
    if not {"compute_s", "aggregate_s"} <= set(metrics.columns):
        return None
    first, rest = metrics[metrics["iteration"] == 0], metrics[metrics["iteration"] > 0]
    if first.empty or rest.empty:
        return None
    if "phase" in metrics and (rest["phase"] == first["phase"].iloc[0]).any():
        rest = rest[rest["phase"] == first["phase"].iloc[0]]
    return float((rest["compute_s"] + rest["aggregate_s"]).median())


def startup_s(metrics: pd.DataFrame) -> float:
    """Iteration 0's one-off start-up, which time to a target leaves out: the seconds up to its end
    (``wall_s``) beyond :func:`typical_first_step`, so time to a target counts iteration 0 as a typical
    iteration (0 where there is no typical one)."""
    typical = typical_first_step(metrics)
    if typical is None:
        return 0.0
    return max(0.0, float(metrics.loc[metrics["iteration"] == 0, "wall_s"].iloc[0]) - typical)


def as_target(target) -> Target:
    """A Target, or a bare number read as a test-accuracy target (the tools' long-standing meaning)."""
    return target if isinstance(target, Target) else Target(float(target))


def is_language_model(runs) -> bool:
    """Whether the runs trained a language model: one of them logged validation bits per byte (``test_bpb``
    in its metrics.csv, or ``final_test_bpb`` in a CSV-less summary)."""
    return any((r.metrics is not None and "test_bpb" in r.metrics and r.metrics["test_bpb"].notna().any())
               or "final_test_bpb" in r.summary for r in runs)


def default_target(runs) -> Target:
    """The target where neither ``target_acc`` nor ``target_loss`` was given: :data:`LM_TARGET_LOSS` for a
    language model's runs (an accuracy target means nothing to them), else :data:`ACC_TARGET`."""
    if is_language_model(runs):
        return Target.loss(LM_TARGET_LOSS, "the default for a language model's runs, nats per token; "
                                           "set target_loss=... or target_acc=...")
    return Target(ACC_TARGET, chosen="the default; set target_acc=... or, for a language model, target_loss=...")


def bpb_per_nat(runs) -> float | None:
    """Bits per byte per nat of validation loss, as the runs converted it (``test_bpb = test_loss / ln 2 /
    bytes per token``, gvq.run.train): read back from their evaluation rows, the one place the report finds
    a text's bytes per token; None where no run logged both columns."""
    ratios = [r.metrics["test_bpb"] / r.metrics["test_loss"] for r in runs if r.metrics is not None
              and {"test_bpb", "test_loss"} <= set(r.metrics.columns)]
    ratios = pd.concat(ratios).dropna() if ratios else pd.Series(dtype=float)
    return float(ratios.median()) if len(ratios) else None


def in_panel(target, column: str, runs) -> float | None:
    """``target`` in the unit of a panel showing ``column`` (``test_acc``; ``test_bpb``: a loss target in nats
    converted by :func:`bpb_per_nat`); None where that panel does not show the target's quantity."""
    t = as_target(target)
    if column == t.column:
        return t.value
    if column == "test_bpb" and t.column == "test_loss":
        factor = bpb_per_nat(runs)
        return None if factor is None else t.value * factor
    return None
