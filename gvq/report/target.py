"""What "reaching the target" means for a report: test accuracy at least a value (``--target-acc``), or a
loss-like column at most one (``--target-loss``: a language model's validation loss in nats per token).
Formatted as its value (``f"{target:g}"``), so the tables that print the number print it either way."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Target:
    value: float
    column: str = "test_acc"
    lower_is_better: bool = False

    @classmethod
    def loss(cls, value: float) -> "Target":
        return cls(value, "test_loss", lower_is_better=True)

    @property
    def label(self) -> str:
        """``acc 0.8`` or ``loss 2.1``: the target as a table's header names it."""
        return f"{'loss' if self.lower_is_better else 'acc'} {self.value:g}"

    def reached(self, rows: pd.DataFrame) -> pd.Series:
        """Per row: at or beyond the target (an evaluation row that has the column; False elsewhere)."""
        if self.column not in rows:
            return pd.Series(False, index=rows.index)
        col = rows[self.column]
        return (col <= self.value) if self.lower_is_better else (col >= self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def as_target(target) -> Target:
    """A Target, or a bare number read as a test-accuracy target (the tools' long-standing meaning)."""
    return target if isinstance(target, Target) else Target(float(target))
