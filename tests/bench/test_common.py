"""gvq/bench/common.py: garbage collected only where the bench says, never on the interpreter's own."""
from __future__ import annotations

import gc

from gvq.bench.common import collections_untimed


class _Node:
    def __init__(self):
        self.me = self                          # a reference cycle: only a collection frees it


def _collections_while(fn) -> int:
    """How many collections the interpreter ran while ``fn`` ran (gc's own callbacks count them)."""
    starts = []

    def seen(phase, info):
        if phase == "start":
            starts.append(info["generation"])
    gc.callbacks.append(seen)
    try:
        fn()
    finally:
        gc.callbacks.remove(seen)
    return len(starts)


def _garbage():
    """Far more cyclic objects than a young collection waits for: with collection on, one runs."""
    for _ in range(10 * max(gc.get_threshold()[0], 1)):
        _Node()


def test_no_collection_runs_inside_only_the_one_the_bench_calls_and_the_state_is_restored():
    assert gc.isenabled()
    assert _collections_while(_garbage) > 0                            # the probe does see collections
    with collections_untimed() as collect:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        assert _collections_while(_garbage) == 0
        assert _collections_while(collect) == 1
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_disabled_collector_stays_disabled_after():
    gc.disable()
    try:
        with collections_untimed():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
