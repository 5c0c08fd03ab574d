"""The scripts under examples/ run as a user runs them (a subprocess: plain python, torchrun) and do what
their docstrings say: examples/ddp_hook.py trains on 2 gloo ranks through DDP + the gvq hook, with the
loss of post-backward aggregation (the same aggregator after backward) over its 30 iterations, and the
same under torchrun; examples/accelerate_hook.py stopped, saved and resumed ends where the uninterrupted
run ends; examples/lightning_hook.py learns through the callback."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from tests.helpers.cli import ROOT
from tests.helpers.dist import env_without_hydra

pytestmark = pytest.mark.slow

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _run(script: str, *args: str, launcher=(sys.executable,)) -> str:
    out = subprocess.run([*launcher, str(ROOT / "examples" / script), *args], cwd=ROOT,
                         env=env_without_hydra(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _losses(*args: str, script="ddp_hook.py", launcher=(sys.executable,)) -> list[float]:
    return [float(v) for v in re.findall(r"^(?:iteration|epoch) \d+ loss (\S+)$",
                                         _run(script, *args, launcher=launcher), re.M)]


@pytest.mark.parametrize("option", ["rar", "qsgd", "gradiveq"])
def test_ddp_hook_example_trains_as_post_backward_aggregation(option):
    hooked, post = _losses(option), _losses(option, "--post-backward")
    assert len(hooked) == len(post) == 30
    # one DDP bucket holds this model, in the aggregator's parameter order: the same vector is summed
    # (and the same random draws made) as after backward; only the ring's addition order may differ
    torch.testing.assert_close(torch.tensor(hooked), torch.tensor(post), rtol=1e-5, atol=1e-6)
    assert sum(hooked[-5:]) < sum(hooked[:5])         # it learns


@pytest.mark.parametrize("option", ["qsgd", "powersgd", "gradiveq"])
def test_ddp_hook_example_under_torchrun_trains_as_spawned(option):
    torchrun = _losses(option, launcher=TORCHRUN)
    assert len(torchrun) == 30 and sum(torchrun[-5:]) < sum(torchrun[:5])
    torch.testing.assert_close(torch.tensor(torchrun), torch.tensor(_losses(option)), rtol=1e-5, atol=1e-6)


def test_ddp_hook_example_rar_under_torchrun_is_ddps_own_all_reduce_bitwise():
    # 2 ranks: a + b in either order, halved exactly; the checksum's 12 decimals and every loss agree
    assert _run("ddp_hook.py", "rar", launcher=TORCHRUN) == _run("ddp_hook.py", "--no-hook", launcher=TORCHRUN)


def test_accelerate_example_resumed_ends_where_the_uninterrupted_run_ends(tmp_path):
    whole = _run("accelerate_hook.py", "qsgd", launcher=TORCHRUN)
    _run("accelerate_hook.py", "qsgd", "--stop-at", "15", "--save", str(tmp_path / "ckpt"), launcher=TORCHRUN)
    resumed = _run("accelerate_hook.py", "qsgd", "--resume", str(tmp_path / "ckpt"), launcher=TORCHRUN)
    tail = re.findall(r"^iteration (\d+) loss (\S+)$", resumed, re.M)
    assert [int(i) for i, _ in tail] == list(range(15, 30))
    expected = dict(re.findall(r"^iteration (\d+) loss (\S+)$", whole, re.M))
    torch.testing.assert_close(torch.tensor([float(v) for _, v in tail]),
                               torch.tensor([float(expected[i]) for i, _ in tail]), rtol=1e-6, atol=1e-7)
    checksum = [float(re.search(r"^checksum (\S+)$", o, re.M).group(1)) for o in (whole, resumed)]
    assert abs(checksum[0] - checksum[1]) < 1e-6


def test_lightning_example_learns_through_the_callback():
    losses = _losses("qsgd", "--epochs", "3", script="lightning_hook.py")
    assert len(losses) == 3 and losses[-1] < 0.7 * losses[0]
