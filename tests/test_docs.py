"""The README and docs/ stand alone: nothing outside the repository is named, and every key of conf/ is
explained in docs/knobs.md."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _leaves(node: dict, prefix: str = ""):
    for key, value in node.items():
        if key in ("defaults", "_target_", "hydra"):
            continue
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def conf_keys() -> set[str]:
    keys = set()
    for path in (ROOT / "conf").rglob("*.yaml"):
        rel = path.relative_to(ROOT / "conf").parts
        if rel[0] in ("experiment", "hydra"):
            continue
        group = "" if len(rel) == 1 else f"{rel[0]}."
        keys |= {group + k for k in _leaves(yaml.safe_load(path.read_text()) or {})}
    from gvq.schema.options import NetSchema        # conf/net/*.yaml set only what differs from it
    return keys | {f"net.{f.name}" for f in dataclasses.fields(NetSchema)}


def test_docs_name_nothing_outside_the_repository():
    for doc in DOCS:
        text = doc.read_text()
        assert not re.search(r"\.\./|shared/|SPEC\.md|PERFORMANCE\.md|LAYOUT\.md", text), doc.name
        for target in re.findall(r"\]\(([^)#]+)\)", text):    # relative links resolve inside the repo
            if "://" not in target:
                assert (doc.parent / target).resolve().is_relative_to(ROOT), (doc.name, target)
                assert (doc.parent / target).exists(), (doc.name, target)


def test_every_conf_key_is_explained_in_docs_knobs():
    text = (ROOT / "docs" / "knobs.md").read_text()
    keys = conf_keys()
    assert {"world_size", "lambda", "aggregator.compressor.bits", "net.exclusive"} <= keys
    missing = sorted(k for k in keys if f"`{k}`" not in text)
    assert missing == [], f"docs/knobs.md lacks {missing}"


# -- the README is a guide; figures live in docs/results.md; the code maps are complete -------------------

README = ROOT / "README.md"
GVQ = ROOT / "gvq"


def rooms() -> list[Path]:
    """Every package directory under gvq/ (one with an __init__.py or any .py file), relative to gvq/."""
    return sorted(d.relative_to(GVQ) for d in GVQ.rglob("*")
                  if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")))


def top_modules() -> list[str]:
    return sorted(p.name for p in GVQ.glob("*.py") if p.name != "__init__.py")


def readme_map() -> dict[str, str]:
    """The README's code map: the first cell of each row (its paths) -> the whole row."""
    section = README.read_text().split("## Where the code lives", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `gvq/")]
    return {row.split("|")[1]: row for row in rows}


def init_map() -> dict[str, str]:
    """gvq/__init__.py's docstring map: each entry's name (its first word(s)) -> the entry with its
    continuation lines."""
    import gvq
    entries: dict[str, str] = {}
    key = None
    for line in gvq.__doc__.splitlines():
        if re.match(r"^    \S", line):
            key = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
            entries[key] = line
        elif key is not None and line.startswith("      ") and line.strip():
            entries[key] += " " + line.strip()
        else:
            key = None
    return entries


def _in_map(room: Path, entries: dict[str, str], spell) -> bool:
    """A top room must have its own entry; a nested room must be named in its top room's entry."""
    top, rest = room.parts[0], room.parts[1:]
    texts = [text for name, text in entries.items() if spell(top) in name]
    return bool(texts) and all(any(f"{part}/" in text for text in texts) for part in rest)


def test_every_room_and_top_module_is_in_both_code_maps():
    readme, init = readme_map(), init_map()
    assert len(readme) >= 9 and len(init) >= 9, (sorted(readme), sorted(init))
    missing_readme = [str(r) for r in rooms() if not _in_map(r, readme, lambda t: f"`gvq/{t}/`")]
    missing_init = [str(r) for r in rooms() if not _in_map(r, init, lambda t: f"{t}/")]
    missing_readme += [m for m in top_modules() if not any(f"`gvq/{m}`" in name for name in readme)]
    missing_init += [m for m in top_modules() if not any(m in name for name in init)]
    assert missing_readme == [], f"the README's code map lacks {missing_readme}"
    assert missing_init == [], f"gvq/__init__.py's map lacks {missing_init}"


def modules() -> list[Path]:
    """Every module file under gvq/ but a package's ``__init__.py``, relative to gvq/."""
    return sorted(p.relative_to(GVQ) for p in GVQ.rglob("*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


def unmapped(readme: dict[str, str], files: list[Path]) -> list[str]:
    """The files of ``files`` whose room's README row does not name them (`` `name.py` ``)."""
    rows = {name.strip().strip("`").removeprefix("gvq/").strip("/"): row for name, row in readme.items()}
    return [str(f) for f in files if len(f.parts) > 1 and f"`{f.name}`" not in rows.get(f.parts[0], "")]


def test_every_file_is_named_in_its_rooms_readme_row():
    assert unmapped(readme_map(), modules()) == []


def test_a_file_missing_from_its_row_is_caught():
    readme = readme_map()
    assert unmapped(readme, [Path("aggregators/nowhere.py"), Path("compressors/gradiveq/nowhere.py")]) == [
        "aggregators/nowhere.py", "compressors/gradiveq/nowhere.py"]
    assert unmapped(readme, [Path("aggregators/rar.py"), Path("compressors/gradiveq/codec.py")]) == []


def test_a_room_missing_from_a_map_is_caught():
    """The check above really parses the maps: a room no entry names is reported."""
    readme, init = readme_map(), init_map()
    assert not _in_map(Path("nowhere"), readme, lambda t: f"`gvq/{t}/`")
    assert not _in_map(Path("bench/nowhere"), init, lambda t: f"{t}/")
    assert _in_map(Path("bench/gpucheck"), init, lambda t: f"{t}/")


def test_readme_is_a_guide():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250: long sections go to docs/)"
    first_screen = "\n".join(lines[:15])
    assert "make run" in first_screen and "make test" in first_screen
    assert "**CUDA status.**" in text and "make gpu-check" in text and "ran on one H100" in text
    assert "constraints-cpu.txt" in text and "make test-fast" in text


def test_readme_links_every_docs_page():
    linked = set(re.findall(r"\]\(docs/([^)#]+\.md)", README.read_text()))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert linked <= pages, f"README links missing pages: {sorted(linked - pages)}"
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"


def test_no_session_talk_in_readme_or_docs():
    for doc in DOCS:
        text = doc.read_text().lower()
        for phrase in ("this session", "previous session", "measured here"):
            assert phrase not in text, (doc.name, phrase)


def test_every_result_says_when_where_and_how():
    """Each table of docs/results.md is headed by its date, commit, machine, clock and command."""
    sections = (ROOT / "docs" / "results.md").read_text().split("\n## ")[1:]
    measured = [s for s in sections if not s.startswith("Contents")]
    assert len(measured) >= 10
    for section in measured:
        head = section.split("\n\n", 2)[1]
        for field_ in ("- date: ", "commit", "- machine: ", "- clock: ", "- command: "):
            assert field_ in head, (section.splitlines()[0], field_)


def _hook_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return next(b for b in blocks if "GvqHookState" in b)


def test_the_readme_hook_snippet_calls_what_the_state_offers_and_names_declared_columns():
    """The README's hook section shows ``iteration_stats()``; each method it calls on the state is public on
    ``GvqHookState`` and each key its comment promises is a declared column (docs/columns.md)."""
    from gvq.hooks import GvqHookState
    from gvq.schema.columns import BY_NAME
    snippet = _hook_snippet()
    called = set(re.findall(r"state\.(\w+)\(", snippet))
    assert "iteration_stats" in called
    assert all(callable(getattr(GvqHookState, m, None)) and not m.startswith("_") for m in called), called
    promised = set(re.findall(r'"(\w+)": \.\.\.', snippet))
    assert promised and promised <= set(BY_NAME), promised - set(BY_NAME)


# what the README's "Status" paragraph says is not built yet, and the config file that would exist once it is
NOT_COVERED: dict[str, str] = {}
#: what the same paragraph says is built, and its option
BUILT = {"local SGD": "method/local_sgd.yaml", "DiLoCo": "method/diloco.yaml",
         "Streaming DiLoCo": "method/streaming_diloco.yaml", "DeMo": "method/demo.yaml",
         "top-k": "aggregator/topk.yaml", "random-k": "aggregator/randomk.yaml", "DGC": "aggregator/dgc.yaml",
         "natural compression": "aggregator/natural.yaml",
         "EF-SignSGD": "aggregator/efsignsgd.yaml", "1-bit SGD": "aggregator/onebit.yaml",
         "Signum": "aggregator/signum.yaml", "SparseLoCo": "aggregator/topk_chunk.yaml",
         "sparse ring": "aggregator/topk.yaml",     # its topology=sparse_ring
         "hierarchical": "net/nodes2x4.yaml", "qgZ": "aggregator/qgz.yaml",
         "method.workers=node": "method/diloco.yaml"}


def test_the_readme_says_what_is_not_built_yet_and_stops_once_it_is():
    """Each method the README lists as not covered has no option in conf/ yet; the day one lands, this fails
    until the README's list says so."""
    text = README.read_text()
    section = text.split("**Status.**", 1)[1].split("\n\n", 1)[0]
    for method, option in NOT_COVERED.items():
        assert method in section, method
        assert not (ROOT / "conf" / option).exists(), f"{option} exists: take {method} off the README's list"
    for method, option in BUILT.items():                 # said built, and built
        assert method in section and (ROOT / "conf" / option).exists(), method
