"""Build a gvq aggregator for a user's own script, without Hydra's command line: an option of
``conf/aggregator/`` by name (``"qsgd"``, ``"gradiveq"``), optionally with overrides
(``{"compressor": {"bits": 2}}``), or a whole config dict with a ``_target_``."""
from __future__ import annotations

from pathlib import Path

from gvq.aggregators.base import FlatAggregator

CONF = Path(__file__).resolve().parents[2] / "conf" / "aggregator"
SCHEMA = "/schema/"   # a defaults entry naming an option's typed schema (the CLI's, gvq/run/options.py)


def option_config(name: str, overrides: dict | None = None) -> dict:
    """``conf/aggregator/<name>.yaml`` as a plain dict: its defaults list followed as the CLI
    composes it (a derived option such as ``gradiveq_pooled`` starts from ``gradiveq``), and its
    interpolations (GradiVeQ's ``${lambda}``, ``${L_t}``, ...) resolved against ``conf/config.yaml``'s
    top-level values.  The typed schemas belong to the CLI (gvq.run, a floor above this room): here
    the constructor refuses a misspelt key."""
    from omegaconf import OmegaConf
    option = _compose(name)
    if overrides:
        option = OmegaConf.merge(option, overrides)
    root = OmegaConf.load(CONF.parent / "config.yaml")
    root.pop("defaults", None)
    root.aggregator = option
    return OmegaConf.to_container(root.aggregator, resolve=True)


def hook_options() -> list[str]:
    """The options a hook can run: those whose class sums through gvq's ring (torch DDP's own, the
    ``ddp*`` options, are not offered)."""
    from hydra.utils import get_class
    names = sorted(p.stem for p in CONF.glob("*.yaml"))
    return [n for n in names if issubclass(get_class(_compose(n)["_target_"]), FlatAggregator)]


def _compose(name: str):
    """One option file merged over the other options its defaults list names, in order."""
    from omegaconf import OmegaConf
    path = CONF / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"gvq hook: no aggregator option {name!r} (one of: {', '.join(hook_options())})")
    option = OmegaConf.load(path)
    node = None
    for entry in option.pop("defaults", []):
        if entry == "_self_" or entry.startswith(SCHEMA):
            continue
        base = _compose(entry)
        node = base if node is None else OmegaConf.merge(node, base)
    return option if node is None else OmegaConf.merge(node, option)


def build_aggregator(config, **overrides) -> FlatAggregator:
    """The aggregator ``config`` names (see the module docstring); refused unless it sums through
    gvq's ring (torch DDP's own options are not gvq aggregators a hook can run)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    if isinstance(config, str):
        cfg = option_config(config, overrides)
    else:
        cfg = OmegaConf.to_container(OmegaConf.merge(dict(config), overrides))
    agg = instantiate(cfg, _convert_="object")
    if not isinstance(agg, FlatAggregator):
        raise ValueError(f"gvq hook: {cfg.get('_target_')} is not a gvq ring aggregator")
    return agg
