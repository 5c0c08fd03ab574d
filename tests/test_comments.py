"""Comments and docstrings keep the why, not a measured figure, and cite nothing outside the repository.

A measured figure rots with the host that printed it; the benchmarks print figures and docs/results.md keeps
them with their provenance. A reader has only the repository, so a comment cites a public paper or docs/*.md,
never a document they cannot open.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*(ROOT / "gvq").rglob("*.py"), ROOT / "cli.py"])
YAMLS = sorted((ROOT / "conf").rglob("*.yaml"))

# Word-bounded; bare words that are also ordinary English ("layout", "style", "GPU", "spec") count only
# as the file names they are, or, for SPEC, in capitals.
EXTERNAL = re.compile(
    r"\b((?i:the brief|brief\.md|spec\.md|performance\.md|layout\.md|style\.md|gpu\.md|the issue|"
    r"issue #?\d+)|SPEC)(?![\w-])|(?i:\bshared/)")
SESSION = re.compile(r"\b(this|previous|last|earlier) session\b", re.IGNORECASE)
TIMING = re.compile(r"\b\d+(\.\d+)?\s?(ms|us|µs|s|sec|secs|seconds|minutes)\b")
# a measured ratio ("~6.9x fewer bytes"; a design factor such as "2x" is spared) or a model's size in values
FIGURE = re.compile(r"~?\b\d+\.\d+\s?x\b|\b\d{1,3}(,\d{3})+\s(parameters|values)\b")

# (file relative to the repository, text around the hit): why that number is not a measured figure.
ALLOWED: dict[tuple[str, str], str] = {
    ("gvq/bench/netns_links.py", "tbf bucket of 1 ms at the rate"): "the tbf burst's design default, its reason "
    "given beside it",
    ("gvq/report/cycle.py", "(CPU: 650 s compute, 850 s vs 162 s aggregation per 500 iterations)"):
        "the GradiVeQ paper's published figures (sec. 4), printed beside ours as the paper's claims",
}


def allowed(rel: str, text: str, match: re.Match) -> bool:
    """Whether the hit lies inside an allow-listed phrase of its file."""
    for (path, phrase), _ in ALLOWED.items():
        start = text.find(phrase) if path == rel else -1
        while start >= 0:
            if start <= match.start() and match.end() <= start + len(phrase):
                return True
            start = text.find(phrase, start + 1)
    return False


def python_texts(path: Path):
    """Every comment (via tokenize) and docstring (via ast) of one Python file, with its line."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield getattr(node, "lineno", 1), doc


def yaml_texts(path: Path):
    """Every YAML comment: text after a '#' that opens a line or follows whitespace."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = re.search(r"(^|\s)#(.*)$", line)
        if match:
            yield number, match.group(2)


def texts():
    for path in SOURCES:
        for line, text in python_texts(path):
            yield path.relative_to(ROOT).as_posix(), line, text
    for path in YAMLS:
        for line, text in yaml_texts(path):
            yield path.relative_to(ROOT).as_posix(), line, text


def hits(pattern: re.Pattern) -> list[str]:
    found = []
    for rel, line, text in texts():
        for match in pattern.finditer(text):
            if not allowed(rel, text, match):
                found.append(f"{rel}:{line}: {match.group(0)!r}")
    return found


def test_the_scan_sees_comments_docstrings_and_yaml():
    rels = {rel for rel, _, _ in texts()}
    assert "cli.py" in rels and any(r.startswith("conf/") for r in rels) and any(r.startswith("gvq/") for r in rels)


@pytest.mark.parametrize("text", ["see the brief", "SPEC.md §3", "per the issue", "Issue 31 asks", "shared/notes",
                                  "the SPEC says"])
def test_the_external_pattern_catches_citations(text):
    assert EXTERNAL.search(text)


def test_the_timing_pattern_catches_a_figure_and_spares_a_design_word():
    assert TIMING.search("takes 0.34 s at N = 1") and TIMING.search("about 12ms per step")
    assert not TIMING.search("N workers, 2 rings") and not TIMING.search("ranks' rounds")


def test_no_comment_cites_a_document_outside_the_repository():
    assert hits(EXTERNAL) == []


def test_no_comment_speaks_of_a_session():
    assert hits(SESSION) == []


def test_no_comment_quotes_a_time():
    assert hits(TIMING) == []


def test_the_figure_pattern_catches_a_ratio_and_a_size_and_spares_a_design_factor():
    assert FIGURE.search("rank 6 => ~6.9x fewer bytes") and FIGURE.search("w=16 -> 15,338 parameters")
    assert not FIGURE.search("then 2x, 2x") and not FIGURE.search("images 1x28x28")
    assert not FIGURE.search("all 60,000 training images")          # a data set's size: a fact, not measured


def test_no_comment_quotes_a_ratio_or_a_model_size():
    assert hits(FIGURE) == []


def test_every_allow_list_entry_still_matches_and_gives_a_reason():
    for (rel, key), reason in ALLOWED.items():
        assert reason.strip(), (rel, key)
        assert any(r == rel and key in t for r, _, t in texts()), (rel, key)


def _anchor(title: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but '-' and '_' dropped, spaces '-'."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def test_every_docs_design_link_of_a_docstring_names_a_section():
    design = (ROOT / "docs" / "design.md").read_text()
    anchors = {_anchor(h) for h in re.findall(r"^## (.+)$", design, re.MULTILINE)}
    links = [(rel, a) for rel, _, text in texts() for a in re.findall(r"docs/design\.md#([\w-]+)", text)]
    assert len(links) >= 10
    assert [link for link in links if link[1] not in anchors] == []
    # one section per module, titled with its path: a section names a module that exists
    for title in re.findall(r"^## (.+)$", design, re.MULTILINE):
        assert (ROOT / title.strip()).is_file(), title
