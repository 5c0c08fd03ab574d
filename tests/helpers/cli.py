"""Run ``cli.py`` as a user would: a subprocess from the repository root, wandb off (``cli``); or its
``main`` in this process (``cli_in_process``), for what happens before any rank starts: a refusal's one
line and exit status, a warning.  A subprocess only where the process is the point (signals, exit
codes of a real interpreter, sweeps, the README's commands)."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
TEST_CONF = ROOT / "tests" / "conf"     # extra config options for tests (hydra.searchpath)


def cli(*args, timeout=300, env: dict | None = None):
    """``python cli.py *args`` from the repo root; ``tests.helpers.*`` targets import from there."""
    env = dict(os.environ if env is None else env, WANDB_MODE="disabled")
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def _restored():
    """What Hydra's ``main`` changes in the process it runs in, put back: argv, the environment (the CLI
    sets ``HYDRA_FULL_ERROR``), the root logger (Hydra configures job logging), Hydra's singletons."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    argv, env, root = list(sys.argv), dict(os.environ), logging.getLogger()
    handlers, level = list(root.handlers), root.level
    GlobalHydra.instance().clear()
    try:
        yield
    finally:
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None
        for h in root.handlers:
            if h not in handlers:
                h.close()
        root.handlers[:], root.level = handlers, level
        os.environ.clear()
        os.environ.update(env)
        sys.argv[:] = argv


def cli_in_process(*args):
    """``python cli.py *args`` as its ``main`` in this process: cli.py's exit status (``cli_status``) and
    what it printed.  Returns an object with ``returncode``, ``stdout`` and ``stderr``, as ``cli`` does."""
    import cli as entry                               # the repository's cli.py (its root is on sys.path)
    from gvq.run.errors import cli_status
    out, err = io.StringIO(), io.StringIO()
    with _restored(), contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        os.environ["WANDB_MODE"] = "disabled"
        os.environ.pop("HYDRA_FULL_ERROR", None)       # as a user runs it: one-line errors, not Hydra's report
        os.environ["HYDRA_MAIN_MODULE"] = "__main__"   # conf/ found beside cli.py, as when it is the script
        sys.argv[:] = [str(ROOT / "cli.py"), *args]
        code = cli_status(entry.main)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def refusal(main, argv: list[str], capsys) -> str:
    """What a tool's ``main(argv)`` printed refusing ``argv``: it must exit with status 2 and one line."""
    import pytest
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err
