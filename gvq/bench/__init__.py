"""``python -m gvq.bench <command>``: the benchmarks (gvq/bench/__main__.py lists them).  What every bench
shares that needs no torch lives here: its failure type, which the dispatcher catches without importing any
bench (``--help`` stays light), and its progress line (benches that only start subprocesses import no torch).
"""
from __future__ import annotations

import sys
import time


class BenchError(Exception):
    """A benchmark that cannot run or conclude as asked: one line, which ``python -m gvq.bench`` exits with."""


class Progress:
    """A bench's progress: :meth:`done` after each of its ``total`` cells, modes or runs prints
    ``gvq.bench <bench>: <k>/<total> <what>: <seconds> s`` on stderr, flushed, so that a bench of minutes is
    never silent (``gvq.bench overlap`` once printed nothing for minutes); stdout keeps the tables."""

    def __init__(self, bench: str, total: int):
        self.bench, self.total, self.count = bench, total, 0
        self._since = time.perf_counter()

    def done(self, what: str, seconds: float | None = None) -> None:
        """One more done: ``seconds`` its wall time, by default since the last one (or the start); a bench
        running several at once gives each one's own."""
        now = time.perf_counter()
        self.count += 1
        took = now - self._since if seconds is None else seconds
        print(f"gvq.bench {self.bench}: {self.count}/{self.total} {what}: {took:.1f} s", file=sys.stderr, flush=True)
        self._since = now
