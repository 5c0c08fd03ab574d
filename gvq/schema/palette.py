"""A setting's colour, the same in every figure gvq draws: the report's curves and frontier, the projection's
heatmaps, their companions.  A colour is a function of the name alone (never of which other settings a
figure holds, nor of their order), so ``qsgd bits=2`` is one colour in every report and ``powersgd
(post)`` one colour in both heatmaps of a projection.

    colour_of("qsgd")                 # the family's base colour
    colour_of("qsgd bits=2")          # a shade of it, fixed by the pairs
    colour_of("qsgd", "overlap")      # the mode's shade of the setting's colour

Each option family has its own hue (:data:`FAMILY`); a setting's pairs move its lightness by a fixed step
picked from a stable hash of the pairs, and a variant other than ``post`` lightens it once more.  Pure:
strings in, ``#rrggbb`` out; matplotlib takes it as is.
"""
from __future__ import annotations

import colorsys
import hashlib

#: each family's hue (matplotlib's tab20 dark entries, then others): options of one family share one, so a
#: figure reads by family first.  A name not listed here is hashed onto :data:`SPARE`.
FAMILY = {
    "rar": "#000000", "ddp": "#000000",
    "fp16": "#17becf", "ddp_fp16": "#17becf",      # not grey: a heatmap draws its ties light grey
    "qsgd": "#1f77b4",
    "powersgd": "#2ca02c", "ddp_powersgd": "#2ca02c",
    "gradiveq": "#d62728", "gradiveq_bf16": "#d62728", "gradiveq_pooled": "#d62728",
    "terngrad": "#9467bd", "terngrad_unclipped": "#9467bd",
    "signsgd": "#8c564b",
    "orq": "#e377c2",
    "bingrad_b": "#ff7f0e", "bingrad_pb": "#ff7f0e",
    "linear": "#bcbd22",
}
SPARE = ("#7b4173", "#aec7e8", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")

#: lightness steps a setting's pairs may take (0: the family's own colour, the option at its defaults)
_SHADES = (0.0, 0.16, -0.12, 0.28, -0.22, 0.38, 0.08, -0.06)
_VARIANT_LIFT = 0.22         # how much lighter a non-``post`` variant (``overlap``) draws than ``post``


def _stable(text: str) -> int:
    """An integer from ``text`` that is the same in every process (``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big")


def _base(option: str) -> str:
    if option in FAMILY:
        return FAMILY[option]
    return SPARE[_stable(option) % len(SPARE)]


def _shifted(hex_colour: str, lift: float) -> str:
    """``hex_colour`` with its HLS lightness moved by ``lift`` (positive: lighter), kept inside (0.08, 0.88)."""
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    h, lum, s = colorsys.rgb_to_hls(r, g, b)
    lum = min(0.88, max(0.08, lum + lift))
    return "#" + "".join(f"{round(255 * c):02x}" for c in colorsys.hls_to_rgb(h, lum, s))


def colour_of(name: str, variant: str | None = None) -> str:
    """The colour of setting ``name`` (``OPTION KEY=VALUE ...``, :attr:`gvq.schema.setting.Setting.name`)
    drawn in ``variant`` (None or ``post``: its own; ``overlap``, ``overlap@0.25MB``: lighter)."""
    option, _, pairs = name.strip().partition(" ")
    colour = _base(option)
    if pairs:
        colour = _shifted(colour, _SHADES[1 + _stable(pairs) % (len(_SHADES) - 1)])
    if variant and variant != "post":
        colour = _shifted(colour, _VARIANT_LIFT)
    return colour


#: markers a figure may add beside the colour, so two settings whose shades meet still read apart
MARKERS = ("o", "s", "D", "^", "v", "<", ">", "p", "h", "X")


def marker_of(name: str) -> str:
    """A marker for setting ``name``, as stable as its colour (a function of the name alone)."""
    return MARKERS[_stable("marker:" + name.strip()) % len(MARKERS)]
