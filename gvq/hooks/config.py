"""Build a gvq aggregator for a user's own script, composed exactly as ``python cli.py aggregator=<name>
<overrides>`` composes it: the same option files (conf/aggregator/), typed schemas, knob names and
one-line errors (gvq/schema/), then instantiated::

    build_aggregator("qsgd", **{"compressor.bits": 2})
    GvqHookState.from_config("gradiveq", ddp, {"lambda": 0.05, "compressor.pool": True})

Overrides are ``{key: value}`` with the command line's keys: the knobs conf/config.yaml interpolates
into option files (``lambda``, ``K``, ``s``, ``L_t``, ``L_c``, ``warmup``) and the option's own keys,
``aggregator.`` optional (``compressor.bits`` is ``aggregator.compressor.bits``).  A value is a Python
value (``None`` is ``null``; a dict merges into the node it names).  A misspelt key, an ill-typed value
or an unknown option raises :class:`gvq.schema.errors.ConfigError`: the CLI's one line, the options
offered being those a hook can run (:func:`hook_options`).
"""
from __future__ import annotations

import difflib
import functools
import numbers
import re
from collections.abc import Mapping

from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from gvq.aggregators.base import Aggregator
from gvq.aggregators.flat import FlatAggregator
from gvq.schema.compose import compose, conf_dir
from gvq.schema.config import KNOBS, TOP_LEVEL_KEYS
from gvq.schema.errors import ConfigError, instantiation_line, keys_of, no_such_option, unknown_key
from gvq.schema.options import WRAPPING_KEYS

HOOK_ROOTS = (*KNOBS, "aggregator")    # the run config's keys a hook's overrides may reach


def option_config(name: str, overrides: dict | None = None):
    """The ``aggregator`` node ``python cli.py aggregator=<name> <overrides>`` composes: a typed
    DictConfig, its knobs' interpolations (``lam: ${lambda}``) resolving against that run config."""
    overrides = overrides or {}
    try:
        return compose([f"aggregator={name}", *(_override(k, v) for k, v in overrides.items())]).aggregator
    except ConfigError as e:
        raise ConfigError(_hook_line(e, name, overrides), source=e.source) from None


def build_aggregator(config, **overrides) -> FlatAggregator:
    """The aggregator ``config`` names (an option of conf/aggregator/, see the module docstring; or a
    whole config dict with a ``_target_``, ``overrides`` then keys of it), not yet bound; refused
    unless it sums through gvq's ring (torch DDP's own options are not aggregators a hook can run).
    Never wrapped: the caller's DDP is its wrapper (``overlap`` and ``bucket_cap_mb`` are dropped)."""
    from omegaconf import OmegaConf
    if not isinstance(config, (str, Mapping)):
        raise ConfigError(f"gvq hook: config={config!r}: give an option name ({', '.join(hook_options()[:4])}, "
                          "...) or a dict with a _target_")
    if isinstance(config, str):
        node = option_config(config, overrides)
        if not wrappable(node):
            raise ConfigError(f"aggregator={config}: {node._target_} is not a gvq ring aggregator (torch DDP "
                              f"overlaps by itself); a hook runs one of: {', '.join(hook_options())}")
        return instantiate_aggregator(node)[0]
    node = OmegaConf.create(dict(config))
    for key, value in overrides.items():
        OmegaConf.update(node, key.removeprefix("aggregator."), value, merge=True)
    if not wrappable(node):
        raise ConfigError(f"{node.get('_target_')} is not a gvq ring aggregator")
    return instantiate_aggregator(node)[0]


def instantiate_aggregator(node, **kwargs) -> tuple[Aggregator, dict]:
    """An ``aggregator`` config node (a DictConfig, resolved here, or a dict) instantiated without the
    run's keys (:data:`gvq.schema.options.WRAPPING_KEYS`: they never reach a ring aggregator's
    constructor; torch DDP's options keep ``bucket_cap_mb``, their own), and those keys, from which
    :func:`gvq.hooks.builder.aggregator_from` decides the wrapping.  ``kwargs``: instantiate's."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from hydra.errors import InstantiationException
    node = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
    keep = () if wrappable(node) else ("bucket_cap_mb",)     # torch DDP's options size their own buckets
    run = {k: node.pop(k) for k in WRAPPING_KEYS if k in node and k not in keep}
    try:
        return instantiate(node, **{"_convert_": "object", **kwargs}), run
    except (ValueError, TypeError, InstantiationException) as e:      # a knob out of range: its one line
        raise ConfigError(instantiation_line("aggregator", node, e), source=e) from None


def check_overrides(overrides) -> dict:
    """A hook's ``overrides``: a dict of the command line's keys (None: none)."""
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"gvq hook: overrides={overrides!r}: give a dict of the command line's keys, "
                          "e.g. {'compressor.bits': 2} or {'lambda': 0.05}")
    return dict(overrides)


def wrappable(node) -> bool:
    """An aggregator config node whose ``_target_`` can average any one DDP bucket (``any_bucket``, so a
    hook can run it); False where that cannot be told (instantiating it then names the bad target)."""
    from hydra.utils import get_class
    try:
        return bool(get_class(str(node.get("_target_", ""))).any_bucket)   # declared on Aggregator
    except (ImportError, AttributeError, ValueError):
        return False


def hook_options() -> list[str]:
    """The options a hook can run: those whose class sums through gvq's ring (torch DDP's own, the
    ``ddp*`` options, are not offered)."""
    return list(_ring_options())


@functools.cache
def _ring_options() -> tuple[str, ...]:
    names = sorted(p.stem for p in (conf_dir() / "aggregator").glob("*.yaml"))
    return tuple(n for n in names if wrappable(compose([f"aggregator={n}"]).aggregator))


def _override(key: str, value) -> str:
    """``key=value`` as the command line spells it: a knob, or a key of the aggregator."""
    head = key.split(".", 1)[0]
    if head in TOP_LEVEL_KEYS and head not in HOOK_ROOTS:
        raise ConfigError(f"{key}: a key of the run, not of its aggregator; a hook takes the aggregator's "
                          f"keys and the knobs {', '.join(KNOBS)}")
    return f"{key if head in HOOK_ROOTS else f'aggregator.{key}'}={hydra_value(value)}"


def hydra_value(value) -> str:
    """``value`` in Hydra's override grammar; a string quoted, so that it is never read as another type."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))                   # inf, nan and 1e-12 are Hydra floats too
    if isinstance(value, str):      # a quote escaped; so is a backslash before one or before the end
        return "'" + re.sub(r"(\\*)('|\Z)", lambda m: m[1] * 2 + ("\\'" if m[2] else ""), value) + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(hydra_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"{value!r}: a {type(value).__name__} is not a config value")


def _hook_line(e: ConfigError, name: str, overrides: dict) -> str:
    """The CLI's line, but an unknown option is offered only the options a hook runs, and a misspelt
    bare key closest to a knob (``lamda``) is named as given, the knobs offered beside the aggregator's keys."""
    from hydra.errors import MissingConfigException
    hydra_error = e.source
    if isinstance(hydra_error, MissingConfigException):
        return no_such_option("aggregator", name, hook_options())
    cause = hydra_error.__cause__ if hydra_error is not None else None
    if not isinstance(cause, (ConfigKeyError, ConfigAttributeError)) or cause.child_node is not None:
        return str(e)
    bare = str(cause.full_key).removeprefix("aggregator.")
    if bare in overrides and "." not in bare:
        allowed = sorted({*KNOBS, *keys_of(cause.object_type)})
        if set(difflib.get_close_matches(bare, allowed, n=1)) & set(KNOBS):
            return unknown_key(bare, allowed)
        deeper = nested_key(compose([f"aggregator={name}"]).aggregator, bare)
        if deeper:                      # {"bits": 2} for qsgd: the knob is the compressor's
            return f"{bare}: not a key of aggregator={name} itself; did you mean {deeper}?"
    return str(e)


def nested_key(node, key: str, prefix: str = "") -> str | None:
    """The dotted path of ``key`` inside one of ``node``'s sub-nodes (``compressor.bits``), or None.
    ``node``: a DictConfig, read unresolved (a ``???`` or an interpolation is a value, not an error)."""
    from omegaconf import OmegaConf
    tree = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node
    for k, child in tree.items():
        if isinstance(child, dict):
            if key in child:
                return f"{prefix}{k}.{key}"
            found = nested_key(child, key, f"{prefix}{k}.")
            if found:
                return found
    return None
