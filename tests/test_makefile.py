"""The Makefile's presets compose: every sweep line of ``make frontier``, each combination of its values,
is a config the CLI accepts (a renamed key or option fails here, not hours into the preset)."""
from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

from gvq.schema.compose import compose

ROOT = Path(__file__).resolve().parents[1]


def _recipe(target: str) -> list[str]:
    """The recipe lines of ``target``, make's variables expanded from their ``?=`` / ``:=`` defaults."""
    text = (ROOT / "Makefile").read_text()
    defaults = dict(re.findall(r"^(\w+)\s*[?:]?=\s*(.*)$", text, re.MULTILINE))
    body = text.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]

    def expand(line: str) -> str:
        for _ in range(3):
            line = re.sub(r"\$\((\w+)\)", lambda m: defaults.get(m.group(1), m.group(0)), line)
        return line
    return [expand(line.strip()) for line in body if line.startswith("\t")]


def test_every_frontier_sweep_composes():
    sweeps = [shlex.split(line) for line in _recipe("frontier") if " cli.py -m " in line]
    assert len(sweeps) >= 6
    seen = set()
    for argv in sweeps:
        overrides = [a for a in argv[argv.index("-m") + 1:] if not a.startswith(("hydra.", "seed=", "world_size="))]
        choices = [[f"{k}={v}" for v in vals.split(",")] for k, vals in (o.split("=", 1) for o in overrides)]
        for combo in itertools.product(*choices):
            cfg = compose(list(combo))
            seen.add((cfg.aggregator._target_.rsplit(".", 1)[1], dict(c.split("=", 1) for c in combo)["aggregator"]))
    # the families the frontier compares: quantizers, low rank, GradiVeQ, the biased 2-level with and
    # without error feedback, and the two baselines
    assert {"ErrorFeedbackAggregator", "CompressedAggregator", "PowerSGDAggregator", "GradiVeQAggregator",
            "RingAllReduce"} <= {t for t, _ in seen}
    assert any("gvq.report" in line and "--frontier" in line for line in _recipe("frontier"))
