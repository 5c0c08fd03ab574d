"""A session fixture's product made once per test run, not once per pytest-xdist worker.

A ``scope="session"`` fixture is per process: under ``make test``'s two workers each one that asks computes
it (a calibration: tens of seconds of loopback timing, twice).  ``once_per_run`` builds it in the folder the
workers share (the parent of each worker's base temp dir), under a file lock: the first worker to ask builds
it, a second waits for it and reads the same files.  A build that failed (or ran past its test's timeout)
leaves a ``failed`` mark with its error, and every later asker fails at once naming it: a calibration that
timed out under load used to be rebuilt, and time out again, by each of the 25 tests that read it."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from filelock import FileLock


def once_per_run(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """``build(folder)`` run once in this test run (by whichever worker asks first); returns the folder."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if _is_worker_dir(base) else base
    folder, done, failed = (shared / f"shared-{name}{end}" for end in ("", ".done", ".failed"))
    with FileLock(str(shared / f"shared-{name}.lock")):
        if failed.exists():
            pytest.fail(f"the shared {name} fixture failed in an earlier test: {failed.read_text()}")
        if not done.exists():
            folder.mkdir(exist_ok=True)
            try:
                build(folder)
            except BaseException as e:       # pytest-timeout's Failed included: the next asker must not rebuild
                failed.write_text(f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
                raise
            done.touch()
    return folder


def _is_worker_dir(base: Path) -> bool:
    """xdist gives each worker ``<run's base>/popen-gwN``; one process uses the run's base itself."""
    return base.name.startswith("popen-gw")
