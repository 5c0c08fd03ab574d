"""The scripts under examples/ run as a user runs them (a subprocess, plain python) and do what their
docstrings say: examples/ddp_hook.py trains on 2 gloo ranks through DDP + the gvq hook, with the loss
of post-backward aggregation (the same aggregator after backward) over its 30 iterations."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from tests.helpers.cli import ROOT
from tests.helpers.dist import env_without_hydra

pytestmark = pytest.mark.slow

def _losses(*args: str) -> list[float]:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "ddp_hook.py"), *args], cwd=ROOT,
                         env=env_without_hydra(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [float(v) for v in re.findall(r"^iteration \d+ loss (\S+)$", out.stdout, re.M)]


@pytest.mark.parametrize("option", ["rar", "qsgd", "gradiveq"])
def test_ddp_hook_example_trains_as_post_backward_aggregation(option):
    hooked, post = _losses(option), _losses(option, "--post-backward")
    assert len(hooked) == len(post) == 30
    # one DDP bucket holds this model, in the aggregator's parameter order: the same vector is summed
    # (and the same random draws made) as after backward; only the ring's addition order may differ
    torch.testing.assert_close(torch.tensor(hooked), torch.tensor(post), rtol=1e-5, atol=1e-6)
    assert sum(hooked[-5:]) < sum(hooked[:5])         # it learns
