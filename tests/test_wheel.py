"""gvq installs like a library: a wheel built from this checkout (conf/ inside it as gvq/conf/, setup.py),
installed with --no-deps into a fresh venv that sees this venv's dependencies but not its editable gvq,
composes an option through the hook and runs examples/ddp_hook.py from a directory outside the checkout."""
from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.helpers.cli import ROOT

pytestmark = pytest.mark.slow

SOURCES = ("pyproject.toml", "setup.py", "README.md", "gvq", "conf", "hydra_plugins")   # what the wheel is built from
CHECK = """
import gvq, torch
import hydra_plugins.gvq_sweeper.gvq_sweeper   # the -m sweeper ships in the wheel (Hydra scans that namespace)
from gvq.hooks import GvqHookState
from gvq.schema.compose import conf_dir
with GvqHookState.from_config("gradiveq", torch.nn.Linear(4, 2).parameters(), {"lambda": 0.05},
                              rank=0, world_size=2) as state:
    print(gvq.__file__, conf_dir(), state.aggregator.compressor.lam)
"""


def _run(cmd: list, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"WANDB_MODE": "disabled"}
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{cmd}: {out.stdout[-2000:]}{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The fresh venv's python, gvq installed there from a wheel of this checkout."""
    pytest.importorskip("setuptools", reason="built offline without build isolation: needs setuptools here")
    tmp = tmp_path_factory.mktemp("wheel")
    for name in SOURCES:                     # a copy: building leaves build/ and *.egg-info behind
        src, dst = ROOT / name, tmp / "src" / name
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(exist_ok=True)
            shutil.copy(src, dst)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp / "dist",
          tmp / "src"], tmp)
    venv.create(tmp / "venv", with_pip=False)
    python = tmp / "venv" / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp).strip())
    # this venv's packages as plain path entries: their .pth files (the editable gvq's finder) do not run
    (purelib / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index",
          *(tmp / "dist").glob("gvq-*.whl")], tmp)
    return python


def test_an_installed_wheel_composes_options_from_its_own_conf(installed):
    where, conf, lam = _run([installed, "-c", CHECK], installed.parents[2]).split()
    venv_dir = installed.parents[1]
    assert Path(where).is_relative_to(venv_dir) and Path(conf).is_relative_to(venv_dir)
    assert Path(conf).name == "conf" and Path(conf).parent.name == "gvq" and float(lam) == 0.05
    assert len(list(Path(conf).rglob("*.yaml"))) == len(list((ROOT / "conf").rglob("*.yaml")))


def test_the_ddp_hook_example_runs_against_the_installed_wheel(installed):
    here = installed.parents[2]
    shutil.copy(ROOT / "examples" / "ddp_hook.py", here)
    losses = re.findall(r"^iteration \d+ loss (\S+)$", _run([installed, "ddp_hook.py", "qsgd"], here), re.M)
    assert len(losses) == 30 and sum(map(float, losses[-5:])) < sum(map(float, losses[:5]))
