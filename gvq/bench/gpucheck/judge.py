"""What a check left behind, judged: table rows from a run's exit, its output (summary.json, pytest's JUnit
XML, the codec bench's records) and the line of its stderr that names the error."""
from __future__ import annotations

import json
import re
from collections import namedtuple
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Check:
    """One command and what counts as its passing (``expect``: cli ``plan`` or ``refusal``)."""
    part: str
    name: str
    setting: str
    argv: list[str]
    timeout_s: float
    expect: dict = field(default_factory=dict)
    path: str | None = None        # cli: the run dir; tests: the JUnit XML; codecs: the records' JSON


Proc = namedtuple("Proc", "rc out err seconds timed_out")     # a finished (or killed) subprocess


def outcome(check: Check, result: str, seconds: float, detail: str = "", setting: str | None = None) -> dict:
    """A table row; ``result``: passed | failed | skipped | timeout; ``detail``: the error's line, why skipped,
    or what passed."""
    return {"check": check.name, "setting": setting or check.setting, "result": result,
            "seconds": round(seconds, 2), "detail": detail}


def first_error(text: str) -> str:
    """The line that names the error: gvq's own one-line report, else the first exception line, else the
    first unindented line saying error (a traceback's code lines are indented), else the last line."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    tops = [ln for ln in lines if not ln[0].isspace() and not ln.startswith("Traceback")]
    for hit in ([ln for ln in tops if ln.startswith("gvq: ") and not ln.startswith("gvq: warning")],
                [ln for ln in tops if re.match(r"[\w.]*(Error|Exception)\b", ln)],
                [ln for ln in tops if "error" in ln.lower()], lines[-1:]):
        if hit:
            return hit[0][:200]
    return ""


def junit_outcomes(path: Path, check: Check) -> list[dict]:
    import xml.etree.ElementTree as ET
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        kids = {c.tag: c for c in case}
        why = kids.get("failure", kids.get("error", kids.get("skipped")))
        result = "passed" if why is None else "skipped" if why.tag == "skipped" else "failed"
        detail = "" if why is None else first_error(why.get("message") or why.text or "")
        rows.append(outcome(check, result, float(case.get("time") or 0), detail,
                            f"{case.get('classname')}::{case.get('name')}"))
    return rows


def judge_tests(check: Check, proc: Proc) -> list[dict]:
    rows = junit_outcomes(Path(check.path), check) if Path(check.path).exists() else []
    if not rows and proc.rc == 5:                  # -k deselected this file's CUDA tests
        rows.append(outcome(check, "skipped", proc.seconds, "no CUDA test selected"))
    elif not rows:
        rows.append(outcome(check, "failed", proc.seconds, first_error(proc.err or proc.out)))
    return rows


def judge_codec(check: Check, proc: Proc) -> list[dict]:
    if proc.rc != 0:
        return [outcome(check, "failed", proc.seconds, first_error(proc.err or proc.out))]
    row = json.loads(Path(check.path).read_text())["rows"][0]      # missing after exit 0: run_part fails it
    return [outcome(check, "passed", proc.seconds,
                    f"compress {row['compress_ms']:.3g} ms, decompress {row['decompress_ms']:.3g} ms")]


def judge_cli(check: Check, proc: Proc) -> list[dict]:
    """Passed: completed with identical replicas on the expected plan, or refused in one line as expected."""
    summary = Path(check.path) / "summary.json"
    s = json.loads(summary.read_text()) if summary.exists() else {}
    if "refusal" in check.expect:
        ok = proc.rc == 2 and check.expect["refusal"] in proc.err and "Traceback" not in proc.err
        why = ("refused as expected: " if ok else "expected a one-line refusal: ") + \
            (first_error(proc.err) if proc.rc else "it ran")
    elif proc.rc != 0 or s.get("status") != "completed":
        ok, why = False, first_error(proc.err) or f"exit {proc.rc}, status {s.get('status')}"
    else:
        ok = bool(s.get("replicas_identical")) and s.get("cuda_plan") == check.expect["plan"]
        why = "" if ok else f"replicas_identical={s.get('replicas_identical')}, cuda_plan={s.get('cuda_plan')}"
    return [outcome(check, "passed" if ok else "failed", proc.seconds, why)]
