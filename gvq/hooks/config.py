"""Build a gvq aggregator for a user's own script, without Hydra's command line: an option of
``conf/aggregator/`` by name (``"qsgd"``, ``"gradiveq"``), optionally with overrides
(``{"compressor": {"bits": 2}}``), or a whole config dict with a ``_target_``."""
from __future__ import annotations

from pathlib import Path

from gvq.aggregators.base import FlatAggregator

CONF = Path(__file__).resolve().parents[2] / "conf" / "aggregator"


def option_config(name: str) -> dict:
    """``conf/aggregator/<name>.yaml`` as a plain dict (its schema defaults list left out), its
    interpolations (GradiVeQ's ``${lambda}``, ``${L_t}``, ...) resolved against ``conf/config.yaml``'s
    top-level values, as the CLI resolves them."""
    from omegaconf import OmegaConf
    path = CONF / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CONF.glob("*.yaml")))
        raise ValueError(f"gvq hook: no aggregator option {name!r} (one of: {known})")
    root = OmegaConf.load(CONF.parent / "config.yaml")
    option = OmegaConf.load(path)
    option.pop("defaults", None)
    root.pop("defaults", None)
    root.aggregator = option
    return OmegaConf.to_container(root.aggregator, resolve=True)


def build_aggregator(config, **overrides) -> FlatAggregator:
    """The aggregator ``config`` names (see the module docstring); refused unless it sums through
    gvq's ring (torch DDP's own options are not gvq aggregators a hook can run)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    cfg = option_config(config) if isinstance(config, str) else dict(config)
    if overrides:
        cfg = OmegaConf.to_container(OmegaConf.merge(cfg, overrides))
    agg = instantiate(cfg, _convert_="object")
    if not isinstance(agg, FlatAggregator):
        raise ValueError(f"gvq hook: {cfg.get('_target_')} is not a gvq ring aggregator")
    return agg
