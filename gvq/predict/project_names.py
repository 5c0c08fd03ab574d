"""A setting's name as the report writes it, found among the names a calibration priced.

The report names a run by the overrides it was given (``qsgd bits=4`` for a sweep that wrote
``aggregator.compressor.bits=4`` out); a calibration names a setting by its own entry (``qsgd`` for the
option at its defaults).  :func:`calibrated_name` takes the one to the other: the overrides that only
restate the option's default (its composed config's value) are dropped, so the calibrated default is
found under its report name and never left out as "not calibrated".
"""
from __future__ import annotations

from omegaconf import OmegaConf


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
    from gvq.bench.common import compose
    from gvq.bench.overlap import setting_value, with_common
    if name in have:
        return name
    option, *pairs = name.split(" ")
    try:
        cfg = compose([f"aggregator={option}", *with_common(option, common)[1]])
    except ValueError:                     # not an option (ConfigError): nothing to find it under
        return name
    own = [kv for kv in pairs if setting_value(_default_of(cfg, kv.split("=", 1)[0])) != kv.split("=", 1)[1]]
    short = " ".join([option, *own])
    return short if short in have else name
