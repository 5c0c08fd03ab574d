"""Hydra's composition errors as one line: the key or option at fault, and what is allowed.

Hydra prints a composition error over several lines (the override, the OmegaConf node, a search path, a
hint about ``HYDRA_FULL_ERROR``).  :func:`one_line_errors` runs the CLI with Hydra re-raising instead
(``HYDRA_FULL_ERROR=1``, unless the user set it: then they get Hydra's full report) and reduces what it
raises to ``gvq: config error: <key>: <what is wrong>; <allowed values or the closest match>``, exit 2.
Everything else propagates unchanged (a bug keeps its traceback).
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import traceback

from hydra.errors import (
    ConfigCompositionException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError
from omegaconf.nodes import BooleanNode, EnumNode, FloatNode, IntegerNode, StringNode, ValueNode

from gvq.run.schema import TOP_LEVEL_KEYS


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
    """One line for a composition error, from the exception's fields (OmegaConf's carry the full key,
    the value and the node that refused it): which key or option, what is wrong, what is allowed."""
    if isinstance(e, MissingConfigException) and e.options is not None:
        return _missing_option(e)
    cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else e
    key = getattr(cause, "full_key", None)
    if not key:
        return _first_line(e)
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and cause.child_node is None:
        return _unknown_key(str(key), cause.object_type)
    if isinstance(cause, ValidationError) and isinstance(cause.child_node, ValueNode):
        return f"{key}={_shown(cause.value)}: expected {_expected(cause.child_node)}"
    return f"{key}: {_first_line(cause)}"


def _expected(node: ValueNode) -> str:
    if isinstance(node, EnumNode):
        return "one of " + ", ".join(m.name for m in node.enum_type)
    return _TYPE_WORDS.get(type(node), type(node).__name__.removesuffix("Node").lower())


_TYPE_WORDS = {IntegerNode: "integer", FloatNode: "float", BooleanNode: "boolean (true or false)",
               StringNode: "string"}


def _shown(value) -> str:
    return ",".join(map(str, value)).join("[]") if isinstance(value, (list, tuple)) else str(value)


def _missing_option(e: MissingConfigException) -> str:
    group, _, name = (e.missing_cfg_file or "option/?").rpartition("/")
    near = difflib.get_close_matches(name, e.options, n=1)
    hint = f"did you mean {group}={near[0]}? " if near else ""
    return f"{group}={name}: no such option; {hint}options: {', '.join(e.options)}"


def _unknown_key(full_key: str, object_type) -> str:
    parent, _, key = full_key.rpartition(".")
    allowed = sorted(TOP_LEVEL_KEYS) if not parent else _keys_of(object_type)
    near = difflib.get_close_matches(key, allowed, n=1)
    hint = f"did you mean {f'{parent}.' if parent else ''}{near[0]}? " if near else ""
    listed = (f"allowed: {', '.join(allowed)}" if allowed else
              "this option takes no keys" if dataclasses.is_dataclass(object_type) else "see conf/")
    return f"{full_key}: unknown key; {hint}{listed}"


def _keys_of(object_type) -> list[str]:
    """The keys a schema dataclass allows (``_target_`` is not a knob)."""
    if not dataclasses.is_dataclass(object_type):
        return []
    return sorted(f.name for f in dataclasses.fields(object_type) if f.name != "_target_")


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__
