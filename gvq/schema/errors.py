"""A composition error as one line: the key or option at fault, what is wrong, what is allowed.

Hydra reports a composition error over several lines (the override, the OmegaConf node, a search path, a
hint about ``HYDRA_FULL_ERROR``).  :func:`describe` reduces what it raises to ``<key>: <what is wrong>;
<allowed values or the closest match>``, from the exception's fields.  The CLI prints that line
(gvq/run/errors.py); a library call raises it as :class:`ConfigError` (gvq/schema/compose.py), never
chained: a user's script (under torchrun, every rank's) ends in the line, not in Hydra's report above it.
"""
from __future__ import annotations

import dataclasses
import difflib

from hydra.errors import MissingConfigException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError
from omegaconf.nodes import BooleanNode, EnumNode, FloatNode, IntegerNode, StringNode, ValueNode

from gvq.schema.config import TOP_LEVEL_KEYS


class ConfigError(ValueError):
    """A bad config value; its message is the single line shown to the user.  Raised ``from None``: a
    chained cause would print OmegaConf's and Hydra's reports (with Hydra's ``+key=`` advice, which does
    not work on typed keys) above the line.  ``source``: the exception the line was read from, kept for a
    caller that words it for its own users (the hook offers only the options a hook runs)."""

    def __init__(self, line: str, source: BaseException | None = None):
        super().__init__(line)
        self.source = source


#: options a Hydra plugin brings, and the extra of pyproject.toml that installs it
PLUGIN_OPTIONS = {"hydra/launcher/joblib": "joblib", "hydra/launcher/submitit_local": "slurm",
                  "hydra/launcher/submitit_slurm": "slurm"}


def describe(e: BaseException) -> str:
    """One line for a composition error, from the exception's fields (OmegaConf's carry the full key,
    the value and the node that refused it): which key or option, what is wrong, what is allowed."""
    if isinstance(e, MissingConfigException) and e.missing_cfg_file in PLUGIN_OPTIONS:
        group, _, name = e.missing_cfg_file.rpartition("/")
        return (f"{group}={name}: its Hydra plugin is not installed "
                f"(pip install -e '.[{PLUGIN_OPTIONS[e.missing_cfg_file]}]')")
    if isinstance(e, MissingConfigException) and e.options is not None:
        group, _, name = (e.missing_cfg_file or "option/?").rpartition("/")
        return no_such_option(group, name, e.options)
    cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else e
    key = cause.full_key if isinstance(cause, OmegaConfBaseException) else None
    if not key:
        return first_line(e)
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and cause.child_node is None:
        parent = str(key).rpartition(".")[0]
        return unknown_key(str(key), sorted(TOP_LEVEL_KEYS) if not parent else keys_of(cause.object_type),
                           dataclasses.is_dataclass(cause.object_type))
    if isinstance(cause, ValidationError) and isinstance(cause.child_node, ValueNode):
        return f"{key}={_shown(cause.value)}: expected {_expected(cause.child_node)}"
    return f"{key}: {first_line(cause)}"


def _expected(node: ValueNode) -> str:
    if isinstance(node, EnumNode):
        return "one of " + ", ".join(m.name for m in node.enum_type)
    return _TYPE_WORDS.get(type(node), type(node).__name__.removesuffix("Node").lower())


_TYPE_WORDS = {IntegerNode: "integer", FloatNode: "float", BooleanNode: "boolean (true or false)",
               StringNode: "string"}


def _shown(value) -> str:
    return ",".join(map(str, value)).join("[]") if isinstance(value, (list, tuple)) else str(value)


def no_such_option(group: str, name: str, options) -> str:
    """``<group>=<name>: no such option; did you mean <group>=<closest>? options: ...``."""
    near = difflib.get_close_matches(name, options, n=1)
    hint = f"did you mean {group}={near[0]}? " if near else ""
    return f"{group}={name}: no such option; {hint}options: {', '.join(options)}"


def unknown_key(full_key: str, allowed: list[str], typed: bool = True) -> str:
    """``<key>: unknown key; did you mean <closest>? allowed: ...`` (``allowed``: the keys beside it;
    ``typed``: whether they come from a schema, so that none allowed means the node takes no keys)."""
    parent, _, key = full_key.rpartition(".")
    near = difflib.get_close_matches(key, allowed, n=1)
    hint = f"did you mean {f'{parent}.' if parent else ''}{near[0]}? " if near else ""
    listed = (f"allowed: {', '.join(allowed)}" if allowed else
              "this option takes no keys" if typed else "see conf/")
    return f"{full_key}: unknown key; {hint}{listed}"


def keys_of(object_type) -> list[str]:
    """The keys a schema dataclass allows (``_target_`` is not a knob)."""
    if not dataclasses.is_dataclass(object_type):
        return []
    return sorted(f.name for f in dataclasses.fields(object_type) if f.name != "_target_")


def first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def instantiation_line(group: str, node, e: BaseException) -> str:
    """One line for an option that composed but refused to be built (Hydra wraps the constructor's
    ValueError in a several-line ``InstantiationException``): the constructor's own first line (it names
    the key: ``aggregator.rank=-1: must be >= 1``), or, for an unknown keyword, the keys given."""
    from hydra.errors import InstantiationException
    inner = e.__cause__ if isinstance(e, InstantiationException) and e.__cause__ else e
    text = (str(inner).strip() or type(inner).__name__).splitlines()
    if isinstance(inner, TypeError):   # an unknown kwarg, e.g. aggregator.foo=1
        keys = ", ".join(k for k in node if k != "_target_")
        return f"{group}: {text[-1]} (keys given: {keys or 'none'}; see conf/{group}/)"
    return text[0]

