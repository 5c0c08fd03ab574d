"""Run ``cli.py`` as a user would: a subprocess from the repository root, wandb off."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_CONF = ROOT / "tests" / "conf"     # extra config options for tests (hydra.searchpath)


def cli(*args, timeout=300, env: dict | None = None):
    """``python cli.py *args`` from the repo root; ``tests.helpers.*`` targets import from there."""
    env = dict(os.environ if env is None else env, WANDB_MODE="disabled")
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
