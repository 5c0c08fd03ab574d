"""What the suite starts, counted in the test process and printed at the end of ``make test`` beside the
slowest tests (a pytest plugin, registered by tests/conftest.py): groups of ranks (every
``torch.multiprocessing.start_processes``: ``tests.helpers.dist``'s groups, the launcher's, the benches'),
``python cli.py`` interpreters, and other interpreters of this Python.  A process a subprocess starts in
turn is that process's, not counted here.  Under pytest-xdist (``make test`` runs two workers) each worker
counts its own and hands its counts to the controller, which prints their sum."""
from __future__ import annotations

import importlib
import subprocess
import sys
from collections import Counter

import pytest
import torch.multiprocessing as mp
from xdist import is_xdist_worker

mp_spawn = importlib.import_module("torch.multiprocessing.spawn")    # the package's ``spawn`` is its function

COUNTS: Counter = Counter()
_start_processes = mp_spawn.start_processes
_popen_init = subprocess.Popen.__init__


def _counted_start_processes(*args, **kwargs):
    COUNTS["rank groups"] += 1
    return _start_processes(*args, **kwargs)


def kind(argv) -> str | None:
    """``cli.py`` for ``python cli.py ...``, ``python`` for another interpreter of this Python, else None."""
    if isinstance(argv, (str, bytes)) or not argv or str(argv[0]) != sys.executable:
        return None
    return "cli.py" if any(str(a).endswith("cli.py") for a in argv[1:2]) else "python"


def _counted_popen_init(self, args, *rest, **kwargs):
    name = kind(args)
    if name:
        COUNTS[{"cli.py": "`python cli.py` processes", "python": "other Python processes"}[name]] += 1
    return _popen_init(self, args, *rest, **kwargs)


def pytest_configure(config):
    mp.start_processes = mp_spawn.start_processes = _counted_start_processes
    subprocess.Popen.__init__ = _counted_popen_init


def pytest_unconfigure(config):
    mp.start_processes = mp_spawn.start_processes = _start_processes
    subprocess.Popen.__init__ = _popen_init


def pytest_sessionfinish(session):
    if is_xdist_worker(session):                          # an xdist worker: its counts go to the controller
        session.config.workeroutput["launches"] = dict(COUNTS)


@pytest.hookimpl(optionalhook=True)                       # a hook of pytest-xdist's: the controller's side
def pytest_testnodedown(node, error):
    COUNTS.update(node.workeroutput.get("launches", {}))


def pytest_terminal_summary(terminalreporter):
    names = ("rank groups", "`python cli.py` processes", "other Python processes")
    terminalreporter.write_line("started by the tests: " + ", ".join(f"{COUNTS[n]} {n}" for n in names))
