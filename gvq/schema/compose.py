"""Where the option files are, and the config ``python cli.py <overrides>`` composes, in-process.

    from gvq.schema.compose import compose
    cfg = compose(["aggregator=qsgd", "aggregator.compressor.bits=2"])    # a DictConfig, typed
    g = load_grid("overlap", ["grid.world_sizes=[4]"])    # conf/grid/overlap.yaml, a GridSchema

The option files are ``conf/`` at the repository's top level (``cli.py``'s ``config_path``); a wheel
carries a copy inside the package as ``gvq/conf/`` (setup.py).  A bad override is refused as the CLI
refuses it: one line (:class:`gvq.schema.errors.ConfigError`), unchained, Hydra's exception its ``source``.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from pathlib import Path

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gvq.schema.config import register
from gvq.schema.errors import ConfigError, describe
from gvq.schema.grid import GridSchema

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
    raises :class:`ConfigError` with the CLI's one line.  Each distinct list is composed once a process
    (the tools and the hook compose the same options over and over; conf/ does not change under a
    running process) and every caller gets its own copy; a refusal is raised every time."""
    return copy.deepcopy(_composed(conf_dir(), tuple(overrides)))


@functools.lru_cache(maxsize=256)
def _composed(conf: Path, overrides: tuple[str, ...]) -> DictConfig:
    from hydra import compose as hydra_compose
    register()
    with _own_hydra(conf):
        try:
            return hydra_compose("config", overrides=list(overrides))
        except (ConfigCompositionException, MissingConfigException, OverrideParseException,
                OmegaConfBaseException) as e:
            raise ConfigError(describe(e), source=e) from None


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


@functools.lru_cache(maxsize=None)
def _grid(name: str, overrides: tuple[str, ...]) -> GridSchema:
    from hydra import compose as hydra_compose
    register()
    with _own_hydra(conf_dir()):
        try:
            cfg = hydra_compose(f"grid/{name}", overrides=list(overrides))
        except (ConfigCompositionException, MissingConfigException, OverrideParseException,
                OmegaConfBaseException) as e:
            where = conf_dir() / "grid" / f"{name}.yaml"
            if where.is_file():     # Hydra drops the cause of a key refused inside a file: typed again, named
                _typed_grid(name, {k: v for k, v in OmegaConf.load(where).items() if k != "defaults"})
            raise ConfigError(f"grid {name}: {describe(e)}", source=e) from None
    return GridSchema(**_typed_grid(name, cfg.grid))


def _typed_grid(name: str, node) -> dict:
    """``node``'s keys through the schema as plain data (so a ``+grid.key=`` added past Hydra's check is
    refused too); a ConfigError naming the key it refuses."""
    schema = OmegaConf.create({"grid": OmegaConf.structured(GridSchema)})
    OmegaConf.set_struct(schema, True)
    try:
        typed = OmegaConf.merge(schema, {"grid": OmegaConf.to_container(OmegaConf.create(node))})
    except OmegaConfBaseException as e:
        raise ConfigError(f"grid {name}: {describe(e)}", source=e) from None
    return OmegaConf.to_container(typed.grid, resolve=True)


def load_grid(name: str, overrides=()) -> GridSchema:
    """The grid ``conf/grid/<name>.yaml`` (settings, world sizes, links, compute scales), typed by
    :class:`gvq.schema.grid.GridSchema`, with ``overrides`` applied (``grid.world_sizes=[4,8]``); an unknown
    or ill-typed key raises :class:`ConfigError`, one line naming it.  Composed once per process."""
    g = _grid(name, tuple(overrides))
    return dataclasses.replace(g, **{f.name: list(getattr(g, f.name)) for f in dataclasses.fields(g)})  # a copy
