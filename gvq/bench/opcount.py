"""Ops and host syncs per codec call, counted on any device: a ``TorchDispatchMode`` sees every aten op a
call dispatches (views included: each costs a dispatch even where it launches no kernel), and the ops that
make the host wait for the device (a value read back: ``.item()``, ``bool(t)``, ``nonzero``, ``.tolist()``).

On a GPU each op is a kernel launch plus Python dispatch, about the same few microseconds whatever its
size on a gradient-sized call, so the count is a proxy for a codec's GPU cost that any machine can measure
(``gvq.bench codecs`` prints it beside the times; ``tests/bench/test_opcount.py`` holds the budget).
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from gvq.comm.internals import torch_dispatch_mode

#: clipping to +-c*RMS of each bucket first (TernGrad's option default) adds a norm, the bound and a clamp
CLIP_OPS = 6
#: the issue-48 budget: ops per compress / decompress / add at most, by codec family (0 host syncs for all)
BUDGET = {"fp16": 16, "qsgd": 16, "terngrad_unclipped": 16, "terngrad": 16 + CLIP_OPS, "signsgd": 16,
          "orq": 32, "linear": 32, "bingrad_b": 32, "bingrad_pb": 32, "gradiveq": 32, "powersgd": 32}

#: aten ops that read a device value back to the host (the caller waits for every queued kernel)
SYNC_OPS = frozenset({"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.equal.default",
                      "aten.is_nonzero.default", "aten.masked_select.default", "aten.unique_consecutive.default",
                      "aten._unique2.default", "aten.item.default"})


@dataclass
class OpCount:
    """What one block dispatched: ``ops`` (every aten op), ``syncs`` (those that wait for the device) and
    the count per op name (for a diagnosis)."""
    ops: int = 0
    syncs: int = 0
    by_name: Counter = field(default_factory=Counter)


class _Counting(torch_dispatch_mode()):
    def __init__(self, tally: OpCount):
        super().__init__()
        self.tally = tally

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        self.tally.ops += 1
        self.tally.syncs += name in SYNC_OPS
        self.tally.by_name[name] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def count_ops():
    """``with count_ops() as c: codec.compress(x, seg)``; then ``c.ops``, ``c.syncs``."""
    tally = OpCount()
    with _Counting(tally):
        yield tally


def count_call(fn, before=None) -> OpCount:
    """Ops and syncs of one ``fn()``; a first, uncounted call warms caches (scratch, plans, generators),
    which a codec builds once, not per call.  ``before``: called, uncounted, before each call (a codec
    named a fresh iteration, so the counted call is not served from the warm call's cache)."""
    for counted in (False, True):
        if before is not None:
            before()
        with count_ops() if counted else nullcontext() as tally:
            fn()
    return tally
