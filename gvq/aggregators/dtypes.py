"""What a ring aggregator does with its parameters' dtypes: each parameter keeps its own (float32, float64,
bfloat16, float16), averaged at its precision or finer, or the aggregator refuses it at ``setup`` in one
line.

Where values of several dtypes meet (a mixed-dtype model's one flat gradient, error memories laid out on
the whole gradient) they are held in the widest of them, so no parameter is rounded below its own
precision; codecs with fixed-precision wires (fp16, the quantizers' float32 side floats, GradiVeQ's
float32 payloads) compute in float32 at least.  Through the DDP hook every bucket has one dtype (DDP never
mixes them), and each is averaged in its own.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable

import torch


def widest_dtype(dtypes: Iterable[torch.dtype], at_least: torch.dtype | None = None) -> torch.dtype:
    """The dtype all of ``dtypes`` (and ``at_least``) convert to without loss, by torch's promotion:
    float32 with float64 -> float64, bfloat16 with float16 -> float32; float32 when there are none."""
    found = list(dtypes) + ([at_least] if at_least is not None else [])
    return functools.reduce(torch.promote_types, found) if found else torch.float32


def refuse_dtypes(name: str, params: Iterable[torch.Tensor],
                  refused: Iterable[tuple[torch.dtype, str]]) -> None:
    """A one-line ValueError naming the option, the first refused dtype among ``params``, why and what to
    do (``refused``: (dtype, that explanation) pairs)."""
    why = dict(refused)
    for dtype in dict.fromkeys(p.dtype for p in params):
        if dtype in why:
            short = str(dtype).removeprefix("torch.")
            raise ValueError(f"gvq: {name}: {short} parameters are not supported ({why[dtype]})")
