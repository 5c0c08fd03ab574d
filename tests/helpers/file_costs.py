"""Costliest test files first (a pytest plugin, registered by tests/conftest.py).

``make test``'s two workers take whole files (``--dist loadfile``) in collection order.  In alphabetical
order the run ended on one worker still inside a file of several minutes (the examples under real
launchers) while the other had nothing left: the longest files first, the short ones fill in at the end
(longest-processing-time-first, within a few percent of the best split for two workers).

``tests/file_costs.json`` holds each file's seconds in a whole run on a 2-core machine (setup, call and
teardown, module fixtures included): only the order is read from it, so a slower or busier machine
changes nothing but the run's length.  A file it does not name goes last, in collection order.
``make test-costs`` rewrites it (``--file-costs-out``).  The order within a file never changes.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from xdist import is_xdist_worker

COSTS = Path(__file__).resolve().parents[1] / "file_costs.json"
_SPENT: Counter = Counter()


def pytest_addoption(parser):
    parser.addoption("--file-costs-out", default=None, metavar="JSON",
                     help="write each test file's seconds in this run here (tests/file_costs.json's format)")


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def costliest_first(items: list, costs: dict[str, float]) -> list:
    """``items`` with whole files reordered by ``costs`` (seconds; unknown: last), each file's items kept
    together and in their own order."""
    order = {f: i for i, f in enumerate(dict.fromkeys(file_of(it.nodeid) for it in items))}
    return sorted(items, key=lambda it: (-costs.get(file_of(it.nodeid), -1.0), order[file_of(it.nodeid)]))


@pytest.hookimpl(trylast=True)                # after any other reordering: files are the unit scheduled
def pytest_collection_modifyitems(session, config, items):
    if COSTS.is_file():
        items[:] = costliest_first(items, json.loads(COSTS.read_text()))


def pytest_runtest_logreport(report):
    _SPENT[file_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session):
    out = session.config.getoption("file_costs_out")
    if out and not is_xdist_worker(session):          # the controller receives every worker's reports
        Path(out).write_text(json.dumps({f: round(s, 1) for f, s in sorted(_SPENT.items())}, indent=1) + "\n")
