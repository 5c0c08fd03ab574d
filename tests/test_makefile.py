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


def _composed_sweeps(target: str) -> list:
    """Every job of every ``cli.py -m`` line of ``target``, composed: its config and its overrides."""
    sweeps = [shlex.split(line) for line in _recipe(target) if " cli.py -m " in line]
    jobs = []
    for argv in sweeps:
        overrides = [a for a in argv[argv.index("-m") + 1:] if not a.startswith(("hydra.", "seed=", "world_size="))]
        choices = [[f"{k}={v}" for v in vals.split(",")] for k, vals in (o.split("=", 1) for o in overrides)]
        jobs += [(compose(list(combo)), dict(c.split("=", 1) for c in combo))
                 for combo in itertools.product(*choices)]
    return jobs


#: the families a frontier compares: quantizers, low rank, GradiVeQ, the biased 2-level with and without
#: error feedback, and the two baselines
FAMILIES = {"ErrorFeedbackAggregator", "CompressedAggregator", "PowerSGDAggregator", "GradiVeQAggregator",
            "RingAllReduce"}


def test_every_frontier_sweep_composes():
    jobs = _composed_sweeps("frontier")
    assert len({j[1]["aggregator"] for j in jobs}) >= 6
    assert FAMILIES <= {cfg.aggregator._target_.rsplit(".", 1)[1] for cfg, _ in jobs}
    assert any("gvq.report frontier " in line for line in _recipe("frontier"))


def test_every_lm_frontier_sweep_composes_the_gpt_and_the_report_ranks_bits_per_byte():
    """``make lm-frontier``: each family across the settings the LM questions ask (QSGD 2/4/8 bits, PowerSGD
    rank 1-16, GradiVeQ, SignSGD and BinGrad with and without error feedback, fp16, rar) on experiment=lm_tta's
    GPT and Austen, into a folder per family, then the frontier on a loss target (bits per byte)."""
    jobs = _composed_sweeps("lm-frontier")
    assert {(cfg.model._target_, cfg.dataset._target_) for cfg, _ in jobs} == {("gvq.models.GPT", "gvq.data.austen")}
    assert FAMILIES <= {cfg.aggregator._target_.rsplit(".", 1)[1] for cfg, _ in jobs}
    settings = {(o["aggregator"], o.get("aggregator.compressor.bits") or o.get("aggregator.rank")
                 or o.get("aggregator._target_", "").rsplit(".", 1)[-1]) for _, o in jobs}
    assert {("qsgd", b) for b in "248"} | {("powersgd", r) for r in ("1", "2", "4", "8", "16")} <= settings
    assert {(a, ef) for a in ("signsgd", "bingrad_b")
            for ef in ("CompressedAggregator", "ErrorFeedbackAggregator")} <= settings
    assert {("rar", ""), ("fp16", ""), ("gradiveq", "")} <= settings
    dirs = [re.search(r"hydra.sweep.dir=(\S+)", line).group(1) for line in _recipe("lm-frontier")
            if " cli.py -m " in line]
    assert len(set(dirs)) == len(dirs) and all(d.startswith("runs/multirun/lm_frontier/") for d in dirs)
    report = [line for line in _recipe("lm-frontier") if "gvq.report" in line]
    assert len(report) == 1 and "gvq.report frontier " in report[0] and "runs/multirun/lm_frontier" in report[0]
    assert float(report[0].split("target_loss=")[1].split()[0]) > 0


def test_every_tool_line_of_the_presets_composes():
    """Each ``python -m gvq.report`` / ``gvq.predict`` / ``gvq.bench`` line of ``make frontier``,
    ``lm-frontier``, ``projection``, ``paper-time``, ``bench`` and ``validate-clock`` names a command and keys
    its tool accepts (composed, not run): a renamed key fails here, not at the end of an hour's preset."""
    from gvq.bench.__main__ import COMMANDS as BENCH
    from gvq.predict.__main__ import COMMANDS as PREDICT
    from gvq.report.__main__ import COMMANDS as REPORT
    from gvq.schema.tool import parse_command
    checked = 0
    tools = (("gvq.report", REPORT, "table"), ("gvq.predict", PREDICT, "table"), ("gvq.bench", BENCH, None))
    for target in ("frontier", "lm-frontier", "projection", "paper-time", "bench", "validate-clock"):
        for line in _recipe(target):
            for tool, table, default in tools:
                if f"-m {tool} " not in line:
                    continue
                tail = line.split(f"-m {tool} ", 1)[1].replace("$$m", "cnn")
                tail = re.sub(r"\$+\([^)]*\)", "10", tail).split(" || ")[0]    # a shell substitution: a number
                argv = shlex.split(tail.split("#")[0])
                name = argv.pop(0) if argv[0] in table else default
                parse_command(tool, table[name], argv)
                checked += 1
    assert checked >= 10


def test_make_lm_frontier_counts_to_the_reports_own_lm_default():
    """``make lm-frontier``'s LM_TARGET is the loss ``gvq.report`` counts an LM's runs to when given none:
    the frontier and a plain report of the same runs answer for one target."""
    from gvq.report.target import LM_TARGET_LOSS
    made = re.search(r"^LM_TARGET \?= ([0-9.]+)$", (ROOT / "Makefile").read_text(), re.M)
    assert made and float(made.group(1)) == LM_TARGET_LOSS
