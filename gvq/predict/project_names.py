"""A setting's name as a report or a frontier writes it, found among the names a calibration priced.

Both sides are :func:`gvq.schema.setting.canonical` names (the option and every value that differs from
its composed defaults): the report's ``qsgd bits=4`` (QSGD's default written out) is the calibration's
``qsgd``, and a report's ``powersgd`` (rank 2) is never the calibration's ``powersgd rank=6``: iterations
measured for one setting are never paired with another's seconds.
"""
from __future__ import annotations

from gvq.schema.setting import canonical, split_name


def calibrated_name(name: str) -> str:
    """``name`` (``OPTION KEY=VALUE ...``) under the key a calibration prices it by; a name with a word that
    is no ``KEY=VALUE`` (a method's setting, ``topk_chunk diloco every=1``, as a frontier names it) is no
    aggregator's: kept as written, so no calibration holds it (a frontier's: left out, said so)."""
    if any("=" not in word for word in name.split(" ")[1:]):
        return name
    return canonical(name)


def priced_of(name: str, have) -> list[str]:
    """The names among ``have`` (a calibration's) of ``name``'s option: what it priced instead."""
    option = split_name(name)[0]
    return [h for h in have if split_name(h)[0] == option]


def uncalibrated(name: str, have) -> str:
    """Why ``name`` is not among ``have`` (a calibration's names), one clause naming the settings of its
    option the calibration did price, if any."""
    family = priced_of(name, have)
    if not family:
        return f"{name}: not calibrated (have {', '.join(have)})"
    return f"{name}: not calibrated (the calibration priced {', '.join(family)})"
