"""A setting's name as the report writes it, found among the names a calibration priced.

The report names a run by the overrides it was given (``qsgd bits=4`` for a sweep that wrote
``aggregator.compressor.bits=4`` out); a calibration names a setting by its own entry (``qsgd`` for the
option at its defaults).  :func:`calibrated_name` takes the one to the other: the overrides that only
restate the option's default (its composed config's value) are dropped, so the calibrated default is
found under its report name and never left out as "not calibrated".
"""
from __future__ import annotations

from omegaconf import OmegaConf

from gvq.schema.compose import compose
from gvq.schema.setting import Setting, setting_value, split_name


def _default_of(cfg, key: str):
    """The option's default of a short key (``bits``: ``aggregator.compressor.bits``), or None."""
    for node in ("aggregator", "aggregator.compressor"):
        value = OmegaConf.select(cfg, f"{node}.{key}", default=None)
        if value is not None:
            return value
    return None


def calibrated_name(name: str, have, common=()) -> str:
    """``name`` (``OPTION KEY=VALUE ...``, the report's) as ``have`` (a calibration's names) calls it: itself
    where priced, else without the pairs that restate the option's defaults (its config with ``common``,
    the calibration's ``settings``, applied) where that is priced, else itself (the caller says it is not
    calibrated)."""
    if name in have:
        return name
    option, pairs = split_name(name)
    try:
        cfg = compose([f"aggregator={option}", *Setting.parse(option, common).overrides])
    except ValueError:                     # not an option (ConfigError): nothing to find it under
        return name
    own = [f"{k}={v}" for k, v in pairs if setting_value(_default_of(cfg, k)) != v]
    short = " ".join([option, *own])
    return short if short in have else name
