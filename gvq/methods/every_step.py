"""Every step: the gradients averaged by the aggregator, then the optimizer steps (plain data parallel;
the default).  ``python cli.py method=every_step``."""
from __future__ import annotations

from gvq.methods.base import Method


class EveryStep(Method):
    """The contract's defaults: sync every iteration, on the gradients."""

    name = "every_step"
