"""Coverage of ``gvq/`` per room (the folder is the role: ``gvq/comm``, ``gvq/aggregators``, ...), read
from ``coverage json``'s report; ``make coverage`` prints it.  ``python -m tests.helpers.coverage_rooms
COVERAGE.json [BEFORE.json]``: one Markdown table, and with a second report each room's change beside it
(a room whose line or branch coverage fell is named on stderr, exit 1)."""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import PurePath

KEYS = ("covered_lines", "num_statements", "covered_branches", "num_branches")


def room(path: str) -> str:
    """``gvq/comm/ring.py`` -> ``gvq/comm``; a module at the top (``gvq/__init__.py``) -> ``gvq``.  The
    path may be absolute or relative to any checkout: its last ``gvq`` folder anchors it."""
    parts = PurePath(path).parts
    at = len(parts) - 1 - parts[::-1].index("gvq")
    return "/".join(parts[at:at + 2]) if len(parts) - at > 2 else "gvq"


def by_room(report: dict) -> dict[str, dict[str, int]]:
    """``{room: {covered_lines, num_statements, covered_branches, num_branches}}``, with ``all`` summed."""
    rooms: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(KEYS, 0))
    for path, entry in report["files"].items():
        for name in (room(path), "all"):
            for k in KEYS:
                rooms[name][k] += entry["summary"].get(k, 0)
    return dict(sorted(rooms.items(), key=lambda kv: (kv[0] == "all", kv[0])))


def percent(covered: int, total: int) -> float:
    return 100.0 * covered / total if total else 100.0


def rates(counts: dict[str, int]) -> tuple[float, float]:
    """(line %, branch %)."""
    return (percent(counts["covered_lines"], counts["num_statements"]),
            percent(counts["covered_branches"], counts["num_branches"]))


def table(after: dict, before: dict | None = None) -> tuple[str, list[str]]:
    """The Markdown table, and the rooms whose line or branch coverage is lower than ``before``'s (a
    change under 0.05 points is rounding, not a fall)."""
    head = "| room | lines | line % | branches | branch % |"
    rule = "|---|---:|---:|---:|---:|"
    if before is not None:
        head, rule = head + " line % before | branch % before |", rule + "---:|---:|"
    rows, fell = [head, rule], []
    for name, c in after.items():
        line, branch = rates(c)
        row = (f"| {name} | {c['covered_lines']}/{c['num_statements']} | {line:.1f} | "
               f"{c['covered_branches']}/{c['num_branches']} | {branch:.1f} |")
        if before is not None:
            was = rates(before[name]) if name in before else (float("nan"), float("nan"))
            row += f" {was[0]:.1f} | {was[1]:.1f} |"
            if line < was[0] - 0.05 or branch < was[1] - 0.05:
                fell.append(name)
        rows.append(row)
    return "\n".join(rows), fell


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m tests.helpers.coverage_rooms COVERAGE.json [BEFORE.json]", file=sys.stderr)
        return 2
    after, *before = (by_room(json.loads(open(p).read())) for p in argv)
    text, fell = table(after, before[0] if before else None)
    print(text)
    if fell:
        print(f"coverage fell in: {', '.join(fell)}", file=sys.stderr)
    return 1 if fell else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
