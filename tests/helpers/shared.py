"""A session fixture's product made once per test run, not once per pytest-xdist worker.

A ``scope="session"`` fixture is per process: under ``make test``'s two workers each one that asks computes
it (a calibration: tens of seconds of loopback timing, twice).  ``once_per_run`` builds it in the folder the
workers share (the parent of each worker's base temp dir), under a file lock: the first worker to ask builds
it, a second waits for it and reads the same files.  A build that failed leaves no ``done`` mark, so the next
asker tries again and fails with its own traceback."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from filelock import FileLock


def once_per_run(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """``build(folder)`` run once in this test run (by whichever worker asks first); returns the folder."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if _is_worker_dir(base) else base
    folder, done = shared / f"shared-{name}", shared / f"shared-{name}.done"
    with FileLock(str(shared / f"shared-{name}.lock")):
        if not done.exists():
            folder.mkdir(exist_ok=True)
            build(folder)
            done.touch()
    return folder


def _is_worker_dir(base: Path) -> bool:
    """xdist gives each worker ``<run's base>/popen-gwN``; one process uses the run's base itself."""
    return base.name.startswith("popen-gw")
