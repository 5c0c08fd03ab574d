"""The tree shows the architecture: the folder is the role, the file is the variant,
imports run one way, and a helper has one copy.  Static checks on the source with ``ast``: nothing is
imported, so they hold for code paths no other test reaches.

Module size is a report, not a rule: a module over ``GUIDE_LINES`` (~300) is listed, largest first, in
pytest's warnings summary (``LargeModules``) and by ``make layout-report`` (``python -m tests.test_layout``),
for the developers to read and split by role when a module holds several.  A cap that fails the suite
bends classes to fit it (state reached from a second file, a codec's fields written from outside); only
``CEILING_LINES`` (~600, twice the guide) fails, where a module has plainly become the file that holds
everything.
"""
from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "gvq"
TOP_LEVEL = {"__init__.py"}   # every other module lives in a room

# room -> the rooms it may import (the import floors; a room may always import itself)
ALLOWED = {
    "compressors": set(),
    "data": set(),
    "models": set(),
    # a workload (loss, metrics, inputs) is the data's and the model's; every room that runs a model asks it
    "workloads": {"data", "models"},
    "comm": {"compressors"},
    "aggregators": {"comm", "compressors"},
    "schema": set(),                                  # the typed config: Hydra and OmegaConf only
    # a user's script runs a method through the hooks' public API (gvq/hooks/method.py), so hooks sit on methods
    "hooks": {"schema", "methods", "aggregators", "comm", "compressors"},
    # a method (every_step, local SGD, DiLoCo) moves what it sends through an aggregator; the loop uses it
    "methods": {"schema", "aggregators", "comm", "compressors"},
    "run": {"schema", "methods", "hooks", "aggregators", "comm", "compressors", "data", "models", "workloads"},
    "bench": {"run", "schema", "methods", "hooks", "aggregators", "comm", "compressors", "data", "models", "workloads",
              "report"},
    "analysis": {"bench", "schema", "aggregators", "comm", "compressors", "data", "models", "workloads"},
    "predict": {"bench", "schema", "aggregators", "comm", "compressors", "data", "models", "workloads"},
    "report": {"schema"},                             # run outputs and their declared columns, never the training code
    # (bench may import report: a table compares its figures with report.intervals, as the report does)
}
SHARED_NAMES = {"main"}   # each CLI module's entry point: always called qualified (module.main)


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(pkg: Path) -> dict[str, Path]:
    """Every module of the package at ``pkg``, by dotted name."""
    return {_module_name(p, pkg.parent): p for p in sorted(pkg.rglob("*.py"))}


MODULES = _modules(PKG)


def _imports(name: str, modules: dict[str, Path] = MODULES) -> set[str]:
    """The package's modules ``name`` imports anywhere in its body (function-level imports included)."""
    path = modules[name]
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from gvq.comm import ring`` imports the module gvq.comm.ring
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in modules and t != name}
    return out


def import_graph(pkg: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports, for the package at ``pkg``."""
    modules = _modules(pkg)
    return {m: _imports(m, modules) for m in modules}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (``[a, b, ..., a]``), or None: a depth-first search."""
    state: dict[str, int] = {}        # 1: on the DFS stack, 2: done

    def visit(m: str, stack: list[str]) -> list[str] | None:
        state[m] = 1
        for dep in sorted(graph[m]):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep, stack + [dep])):
                return cycle
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m, [m])):
            return cycle
    return None


GRAPH = import_graph(PKG)


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "gvq"


def test_no_top_level_module_outside_a_room():
    loose = sorted(p.name for p in PKG.glob("*.py") if p.name not in TOP_LEVEL)
    assert loose == [], f"top-level modules must move into a room (aggregators/, comm/, run/ ...): {loose}"
    assert {p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(ALLOWED)


def test_import_graph_has_no_cycle():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_imports_run_one_way():
    wrong = [f"{m} imports {d}" for m, deps in GRAPH.items() for d in deps
             if _room(m) in ALLOWED and _room(d) != _room(m) and _room(d) not in ALLOWED[_room(m)]]
    assert wrong == [], "imports against the floors:\n" + "\n".join(sorted(wrong))


def test_cycle_check_catches_a_cycle(tmp_path):
    """The checker the layout test runs (``import_graph`` + ``find_cycle``) on a scratch package: a cycle
    through a relative import and a function-level import is found; the same package without it is not."""
    pkg = tmp_path / "scratch"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("import scratch.c\n")
    (pkg / "c.py").write_text("def f():\n    from scratch import a\n")
    (pkg / "d.py").write_text("import scratch.a\n")              # reaches the cycle, not part of it
    assert find_cycle(import_graph(pkg)) == ["scratch.a", "scratch.sub.b", "scratch.c", "scratch.a"]
    (pkg / "c.py").write_text("def f():\n    return 1\n")
    assert find_cycle(import_graph(pkg)) is None


def test_no_two_functions_share_a_name_with_different_bodies():
    bodies: dict[str, dict[str, str]] = {}
    for name, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in SHARED_NAMES:
                bodies.setdefault(node.name, {})[name] = ast.dump(node)
    dup = {f: sorted(where) for f, where in bodies.items() if len(set(where.values())) > 1}
    assert dup == {}, f"same name, different bodies (give one a distinct name, or keep one copy): {dup}"


GUIDE_LINES = 300      # a module's size to aim for: above it, the report lists it
CEILING_LINES = 600    # twice the guide: above it, the suite fails


class LargeModules(UserWarning):
    """Modules over GUIDE_LINES: a report for the developers (pytest's warnings summary), never a failure."""


def module_sizes(modules: dict[str, Path] = MODULES) -> list[tuple[int, str]]:
    """(lines, module) of every module, largest first."""
    return sorted(((len(p.read_text().splitlines()), n) for n, p in modules.items()), key=lambda t: (-t[0], t[1]))


def size_report(guide: int = GUIDE_LINES) -> str:
    """The modules over ``guide`` lines, largest first, one a line ("" when none is)."""
    big = [f"{lines:6d}  {name}" for lines, name in module_sizes() if lines > guide]
    if not big:
        return ""
    return (f"{len(big)} modules over ~{guide} lines (split one by role where it holds several):\n"
            + "\n".join(big))


def test_large_modules_are_reported():
    report = size_report()
    if report:
        warnings.warn(LargeModules(report), stacklevel=1)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_below_the_ceiling(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= CEILING_LINES, f"{name}: {lines} lines (split by role; ~{GUIDE_LINES} is the guide)"


def test_tests_mirror_the_package():
    """tests/<room>/test_<variant>.py tests gvq/<room>/<variant>(.py or package; _<variant>.py for a
    room-private module); the few test files that check one property across a room's variants are
    named, with why, in MIRROR_EXCEPTIONS."""
    rooms = {p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__"}
    test_rooms = {p.name for p in (ROOT / "tests").iterdir() if (p / "__init__.py").exists()}
    assert rooms <= test_rooms, f"tests/ lacks a package for {sorted(rooms - test_rooms)}"
    orphans = []
    for room in sorted(rooms):
        for t in sorted((ROOT / "tests" / room).glob("test_*.py")):
            variant = t.stem[len("test_"):]
            home = PKG / room
            if not any((home / f).exists() for f in (f"{variant}.py", f"_{variant}.py", variant)) \
                    and f"{room}/{t.name}" not in MIRROR_EXCEPTIONS:
                orphans.append(f"tests/{room}/{t.name}")
    assert orphans == [], f"no gvq/<room>/<variant> to mirror: {orphans}"


MIRROR_EXCEPTIONS = {
    "bench/test_progress.py": "every bench's progress line (gvq/bench/__init__.py's Progress), side by side",
    "compressors/test_quantizers.py": "the scalar quantizers' shared properties, side by side",
    "compressors/test_devices.py": "every compressor on its input's device (meta; CUDA where visible)",
    "run/test_config.py": "every conf/ option composed through schema/ and run/validate.py",
    "report/test_report.py": "python -m gvq.report (report/__main__.py) on a real sweep",
    "report/test_report_smoke.py": "python -m gvq.report on failed / incomplete runs",
    "aggregators/test_every_aggregator.py": "contracts of every conf/aggregator/ option: trains (1, 3, 5 ranks, "
                                            "overlapped), resumes bitwise",
    "aggregators/test_bucket.py": "every ring option's per-bucket average (base.py's contract) against post-backward",
}


if __name__ == "__main__":          # make layout-report
    print(size_report() or f"no module over ~{GUIDE_LINES} lines")
