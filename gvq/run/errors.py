"""Hydra's composition errors as one line: the key or option at fault, and what is allowed.

Hydra prints a composition error over several lines (the override, the OmegaConf node, a search path, a
hint about ``HYDRA_FULL_ERROR``).  :func:`one_line_errors` runs the CLI with Hydra re-raising instead
(``HYDRA_FULL_ERROR=1``, unless the user set it: then they get Hydra's full report) and reduces what it
raises to ``gvq: config error: <key>: <what is wrong>; <allowed values or the closest match>``, exit 2.
Everything else propagates unchanged (a bug keeps its traceback).
"""
from __future__ import annotations

import difflib
import os
import re
import sys
import traceback

from hydra.errors import (
    ConfigCompositionException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gvq.run.schema import TOP_LEVEL_KEYS, build_schema


def one_line_errors(main) -> None:
    """Run Hydra's ``main`` with composition errors as one line on stderr (exit 2)."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":      # the user asked for Hydra's own report
        return main()
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        return main()
    except (ConfigCompositionException, MissingConfigException, OverrideParseException,
            OmegaConfBaseException) as e:
        _exit(describe(e))
    except ValueError as e:                            # Hydra's own checks of an override's shape
        if not _raised_in_hydra(e):
            raise
        keyless = [a for a in sys.argv[1:] if a.startswith("=")]
        _exit(f"{keyless[0]!r}: an override needs a key (key=value)" if keyless else _first_line(e))


def _exit(line: str) -> None:
    print(f"gvq: config error: {line}", file=sys.stderr)
    sys.exit(2)


def _raised_in_hydra(e: BaseException) -> bool:
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and f"{os.sep}hydra{os.sep}" in frames[-1].filename


def describe(e: BaseException) -> str:
    """One line for a composition error: which key or option, what is wrong, what is allowed."""
    if isinstance(e, MissingConfigException) and e.options is not None:
        return _missing_option(e)
    cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else e
    key = getattr(cause, "full_key", None)
    text = _first_line(cause)
    if key and re.search(r"not in|is not in struct", text):
        return _unknown_key(str(key))
    if key and ("could not be converted" in text or "is not a valid" in text):
        value = re.search(r"Value '(.*?)'", text)
        want = re.search(r"(?:converted to|is not a valid) (\w+)", text)
        given = f"={value.group(1)}" if value else ""
        return f"{key}{given}: expected {want.group(1).lower() if want else 'another type'}"
    if key:
        return f"{key}: {text}"
    return _first_line(e)


def _missing_option(e: MissingConfigException) -> str:
    found = re.search(r"Could not find '(.+)/([^/']+)'", str(e))
    group, name = (found.group(1), found.group(2)) if found else ("option", "?")
    near = difflib.get_close_matches(name, e.options, n=1)
    hint = f"did you mean {group}={near[0]}? " if near else ""
    return f"{group}={name}: no such option; {hint}options: {', '.join(e.options)}"


def _unknown_key(full_key: str) -> str:
    parent, _, key = full_key.rpartition(".")
    allowed = sorted(TOP_LEVEL_KEYS) if not parent else _keys_under(parent)
    near = difflib.get_close_matches(key, allowed, n=1)
    hint = f"did you mean {f'{parent}.' if parent else ''}{near[0]}? " if near else ""
    listed = f"allowed: {', '.join(allowed)}" if allowed else "see conf/"
    return f"{full_key}: unknown key; {hint}{listed}"


def _keys_under(path: str) -> list[str]:
    node = OmegaConf.select(build_schema(), path, default=None)
    return sorted(node.keys()) if OmegaConf.is_dict(node) else []


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__
