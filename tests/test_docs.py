"""The README and docs/ stand alone: nothing outside the repository is named, and every key of conf/ is
explained in docs/knobs.md."""
from __future__ import annotations

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
    return keys


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
