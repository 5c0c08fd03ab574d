"""The habits the code keeps, checked over the whole tree: ruff's rules (pyproject.toml's ``[tool.ruff]``, the
check ``make test`` runs before pytest), every ``# noqa`` saying on its line why, and no gvq module reaching
a private (``_name``) name of another gvq module.  Private names of torch, Python, OmegaConf and Hydra:
tests/comm/test_internals.py.

    .venv/bin/python -m pytest -q tests/test_lint.py
"""
from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the code a user or a run imports; tests may reach the private helpers of the module they test
SHIPPED = sorted([*(ROOT / "gvq").rglob("*.py"), *(ROOT / "examples").glob("*.py"), ROOT / "cli.py"])
#: every Python file of the repository that ruff checks
CHECKED = sorted([*SHIPPED, *(ROOT / "tests").rglob("*.py"), ROOT / "setup.py"])


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing():
    out = ruff(".")
    assert "No module named ruff" not in out.stderr, "ruff is not installed: make setup (the test extra pins it)"
    assert out.returncode == 0, f"ruff check . (pyproject.toml's [tool.ruff]):\n{out.stdout[-6000:]}{out.stderr[-999:]}"


def test_ruff_applies_the_projects_rules(tmp_path):
    """The configuration is the one read: a planted unused import, long line and bare except are found."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nx = 1  # " + "y" * 120 + "\ntry:\n    pass\nexcept:\n    pass\n")
    out = ruff("--config", str(ROOT / "pyproject.toml"), str(bad))
    assert out.returncode == 1 and {"F401", "E501", "E722"} <= set(re.findall(r": ([A-Z]+\d+) ", out.stdout)), \
        out.stdout + out.stderr


NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)", re.IGNORECASE)
#: ``: CODE[, CODE]`` then the reason, after an optional ``-`` or inside ``( )``
SAYS_WHY = re.compile(r":\s*[A-Z]+\d+(?:\s*,\s*[A-Z]+\d+)*\s*[-(:;,]*\s*(?P<why>.*)")


def unjustified_noqa(text: str) -> list[str]:
    """The ``# noqa`` comments of ``text`` that name no rule or give no reason of two words or more."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        m = NOQA.search(tok.string) if tok.type == tokenize.COMMENT else None
        if m is None:
            continue
        why = SAYS_WHY.match(m.group("rest"))
        if why is None or len(re.findall(r"[A-Za-z]{2,}", why.group("why"))) < 2:
            found.append(f"{tok.start[0]}: {tok.string.strip()}")
    return found


def test_every_noqa_names_its_rule_and_says_why():
    found = [f"{p.relative_to(ROOT)}:{hit}" for p in CHECKED for hit in unjustified_noqa(p.read_text())]
    assert found == [], "a noqa names its rule and says why on its line (`# noqa: E402 - why`), or goes: " \
                        + "; ".join(found)


def test_the_noqa_check_refuses_a_bare_or_unexplained_noqa():
    text = ("import a  # noqa\nimport b  # noqa: F401\nimport c  # NOQA: F401 -\ns = '# noqa'\n"
            "import d  # noqa: F401 - re-exported for the hooks\nimport e  # noqa: E402 (after the environment)\n")
    assert unjustified_noqa(text) == ["1: # noqa", "2: # noqa: F401", "3: # NOQA: F401 -"]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str, root: Path) -> bool:
    base = root.joinpath(*dotted.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def _bindings(tree: ast.AST, me: str, pkg: str, top: str, root: Path) -> tuple[dict[str, str], list[tuple[int, str]]]:
    """Each local name bound to a ``top`` module or one of its names (dotted), and every ``from ... import
    _name`` of another module's private name."""
    bound, reaches = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            src = node.module or ""
            if node.level:
                base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                src = ".".join(base + ([node.module] if node.module else []))
            if src.split(".")[0] != top:
                continue
            for a in node.names:
                bound[a.asname or a.name] = f"{src}.{a.name}"
                if _private(a.name) and src != me and not _is_module(f"{src}.{a.name}", root):
                    reaches.append((node.lineno, f"from {src} import {a.name}"))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == top:
                    bound[a.asname or top] = a.name if a.asname else top
    return bound, reaches


def private_reaches(path: Path, root: Path = ROOT, top: str = "gvq") -> list[str]:
    """Where ``path`` reaches a private name of another ``top`` module: ``from gvq.x import _f`` or
    ``x._f`` on an imported gvq module or name.  A room-private module (``gvq.compressors._bucketing``) is
    the room's to import; its public names are anyone's."""
    me = _module_name(path, root)
    pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    bound, reaches = _bindings(tree, me, pkg, top, root)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        chain, v = [node.attr], node.value
        while isinstance(v, ast.Attribute):
            chain.append(v.attr)
            v = v.value
        if isinstance(v, ast.Name) and v.id in bound:
            dotted = ".".join([bound[v.id], *reversed(chain)])
            if dotted.rpartition(".")[0] != me and not _is_module(dotted, root):
                reaches.append((node.lineno, dotted))
    return [f"{n}: {what}" for n, what in sorted(reaches)]


def test_no_module_reaches_a_private_name_of_another_gvq_module():
    found = [f"{p.relative_to(ROOT)}:{hit}" for p in SHIPPED for hit in private_reaches(p)]
    assert found == [], f"make the name public (and say what it is) or keep it in its module: {found}"


def test_the_private_scan_finds_reaches_however_they_are_spelt(tmp_path):
    pkg = tmp_path / "scratch"
    (pkg / "room").mkdir(parents=True)
    for f in ("__init__.py", "room/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "room" / "_shared.py").write_text("def _inner():\n    pass\n\n\ndef helper():\n    pass\n")
    (pkg / "room" / "a.py").write_text("class A:\n    def _own(self):\n        return _top()\n\n\n"
                                       "def _top():\n    return A()._own()\n")
    user = pkg / "room" / "b.py"
    user.write_text("import scratch.room.a\nfrom scratch.room import a as mod, _shared\nfrom . import a\n"
                    "from ._shared import _inner, helper\nfrom scratch.room.a import A\n\n"
                    "x = scratch.room.a._top\ny = mod._top()\nz = a._top\nw = A._own\nok = _shared.helper()\n"
                    "ok = helper()\nok = self._mine\n")
    assert private_reaches(user, tmp_path, "scratch") == [
        "4: from scratch.room._shared import _inner", "7: scratch.room.a._top", "8: scratch.room.a._top",
        "9: scratch.room.a._top", "10: scratch.room.a.A._own"]
    assert private_reaches(pkg / "room" / "a.py", tmp_path, "scratch") == []
