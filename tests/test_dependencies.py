"""Every third-party package gvq imports (anywhere: module level or inside a function) is declared in
pyproject.toml, as a dependency or in an extra; torch's exact build stays out of the metadata (it lives
in constraints-cpu.txt, which ``make setup`` installs with)."""
from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _declared() -> set[str]:
    project = _project()
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {_norm(re.match(r"[A-Za-z0-9_.-]+", r).group()) for r in reqs}


def _imported() -> set[str]:
    """Top-level names of the non-standard-library modules gvq and cli.py import."""
    names = set()
    for path in [ROOT / "cli.py", *sorted((ROOT / "gvq").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("gvq", "__future__")}


def test_every_imported_package_is_declared():
    dists = metadata.packages_distributions()          # import name -> the distributions providing it
    missing = {}
    for name in sorted(_imported()):
        provided_by = {_norm(d) for d in dists.get(name, [name])}
        if not provided_by & _declared():
            missing[name] = sorted(provided_by)
    assert missing == {}, f"imported but not declared in pyproject.toml: {missing}"


def test_metadata_states_a_torch_range_and_the_constraints_pin_the_cpu_build():
    torch_req = [r for r in _project()["dependencies"] if _norm(r).startswith("torch")]
    assert len(torch_req) == 1 and ">=" in torch_req[0] and "==" not in torch_req[0], torch_req
    pins = (ROOT / "constraints-cpu.txt").read_text()
    assert re.search(r"^torch==[\d.]+\+cpu; sys_platform == \"linux\"$", pins, re.M), pins
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^\$\(STAMP\):.*\$\(CONSTRAINTS\)", makefile, re.M)   # a new pin re-runs setup
    assert "CONSTRAINTS ?= constraints-cpu.txt" in makefile
