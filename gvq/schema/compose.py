"""Where the option files are, and the config ``python cli.py <overrides>`` composes, in-process.

    from gvq.schema.compose import compose
    cfg = compose(["aggregator=qsgd", "aggregator.compressor.bits=2"])    # a DictConfig, typed

The option files are ``conf/`` at the repository's top level (``cli.py``'s ``config_path``); a wheel
carries a copy inside the package as ``gvq/conf/`` (setup.py).  A bad override is refused as the CLI
refuses it: one line (:class:`gvq.schema.errors.ConfigError`), Hydra's exception as its cause.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from gvq.schema.config import register
from gvq.schema.errors import ConfigError, describe

PACKAGE = Path(__file__).resolve().parents[1]      # gvq/


def conf_dir() -> Path:
    """The option files: the copy installed inside the package (``gvq/conf/``, a wheel's), else the
    checkout's ``conf/`` beside the package (a clone with gvq on PYTHONPATH, or ``pip install -e``).
    The package's copy is looked at first: it exists only where an install put it, while a directory
    named ``conf`` beside an installed package may belong to anything else in site-packages."""
    for where in (PACKAGE / "conf", PACKAGE.parent / "conf"):
        if (where / "config.yaml").is_file():
            return where
    raise FileNotFoundError(f"gvq: no option files at {PACKAGE / 'conf'} (an install) or "
                            f"{PACKAGE.parent / 'conf'} (a checkout); reinstall gvq")


def compose(overrides: list[str]) -> DictConfig:
    """The run config ``python cli.py <overrides>`` would compose (schemas registered); a bad override
    raises :class:`ConfigError` with the CLI's one line."""
    from hydra import compose as hydra_compose
    register()
    with _own_hydra(conf_dir()):
        try:
            return hydra_compose("config", overrides=list(overrides))
        except (ConfigCompositionException, MissingConfigException, OverrideParseException,
                OmegaConfBaseException) as e:
            raise ConfigError(describe(e)) from e


@contextlib.contextmanager
def _own_hydra(conf: Path):
    """Hydra initialised on ``conf`` inside; a caller's own Hydra app (a script under ``@hydra.main``
    that builds a gvq hook) gets its state back after."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    outer = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            yield
    finally:
        GlobalHydra.instance().clear()
        if outer is not None:
            GlobalHydra.instance().initialize(outer)


def overrides_for(option: str, overrides, scoped_only: bool = False) -> list[str]:
    """The overrides that apply to the aggregator option ``option`` in the benches' ``--set`` syntax:
    ``key=value`` applies to every option, ``option:key=value`` to that one (returned without its scope);
    ``scoped_only``: just the latter, the ones that make a bench mode's setting.  The one reader of that
    syntax for the bench that applies it, the overlap bench that names its modes by it and the report
    that checks runs against it."""
    out = []
    for o in overrides:
        scope, colon, rest = o.partition(":")
        if not colon or "=" in scope:           # unscoped (a ':' inside the value is not a scope)
            if not scoped_only:
                out.append(o)
        elif scope == option:
            out.append(rest)
    return out
