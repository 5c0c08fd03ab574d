"""The scripts under examples/ run as a user runs them (a subprocess: plain python, torchrun) and do what
their docstrings say: examples/ddp_hook.py trains on 2 gloo ranks through DDP + the gvq hook, with the
loss of post-backward aggregation (the same aggregator after backward) over its 30 iterations, and the
same under torchrun; examples/accelerate_hook.py under accelerate's launcher is the same run as under
torchrun, and stopped, saved and resumed ends where the uninterrupted run ends; examples/lightning_hook.py
learns through the callback; examples/gpt_hook.py trains a small GPT on bytes under torchrun with the hook;
examples/method_hook.py's local SGD under torchrun trains as torch's own PeriodicModelAverager on the same batches,
its DiLoCo resumed from each rank's checkpoint taken mid-period ends where the uninterrupted run ends, and
examples/accelerate_hook.py's --method line under accelerate is the same local SGD.
Every launch line an example's docstring gives is run as written."""
from __future__ import annotations

import ast
import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.cli import ROOT
from tests.helpers.dist import env_without_hydra

pytestmark = pytest.mark.slow

def documented(script: str) -> list[str]:
    """The launch lines ``examples/<script>``'s docstring gives (indented lines starting with a launcher),
    without their comments: the tests below run exactly these."""
    doc = ast.get_docstring(ast.parse((ROOT / "examples" / script).read_text()))
    lines = [ln.split("  #")[0].strip() for ln in doc.splitlines() if ln.startswith("    ")]
    return [ln for ln in lines if ln.split()[0] in ("python", "torchrun", "accelerate")]


def _argv(line: str) -> list[str]:
    """A documented line as this interpreter runs it: ``python``, ``torchrun``, ``accelerate`` of this
    environment; an ``examples/`` path from the repository (the command may run in another directory)."""
    head, *rest = shlex.split(line)
    launcher = {"python": [sys.executable], "torchrun": [sys.executable, "-m", "torch.distributed.run"],
                "accelerate": [str(Path(sys.executable).parent / "accelerate")]}[head]
    return launcher + [str(ROOT / a) if a.startswith("examples/") else a for a in rest]


def _run(line: str, cwd=ROOT) -> str:
    """The line's stdout; a line run from the repository writes nothing and is deterministic, so it runs once
    per module and the tests that compare against it share its output."""
    if cwd == ROOT:
        return _run_in_root(line)
    return _launch(line, cwd)


@functools.cache
def _run_in_root(line: str) -> str:
    return _launch(line, ROOT)


def _launch(line: str, cwd) -> str:
    out = subprocess.run(_argv(line), cwd=cwd, env=env_without_hydra(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, f"{line}\n{out.stderr[-3000:]}"
    return out.stdout


def _losses(line: str) -> list[float]:
    return [float(v) for v in re.findall(r"^(?:iteration|epoch) \d+ loss (\S+)$", _run(line), re.M)]


#: how many launch lines each example documents; every one is run below (a new line needs a test here)
RUN_HERE = {"ddp_hook.py": 4, "accelerate_hook.py": 5, "lightning_hook.py": 2, "gpt_hook.py": 2, "method_hook.py": 4}
DDP = documented("ddp_hook.py")       # gradiveq, --post-backward, --no-hook, torchrun


def _with(line: str, option: str) -> str:
    return line.replace(" gradiveq", f" {option}")


def test_every_documented_launch_line_is_one_these_tests_run():
    for script, n in RUN_HERE.items():
        assert len(documented(script)) == n, f"examples/{script}: {documented(script)}"


# the documented lines as written (GradiVeQ); rar: in the test below (its hooked run is the torchrun one, which
# DDP's own all-reduce matches bit for bit); every other option's hook against post-backward:
# tests/hooks/test_state.py::test_each_bucket_equals_the_post_backward_result, and qsgd through this script
# against an installed wheel: tests/test_wheel.py
def test_ddp_hook_example_trains_as_post_backward_aggregation():
    hooked, post = _losses(DDP[0]), _losses(DDP[1])
    assert len(hooked) == len(post) == 30
    # one DDP bucket holds this model, in the aggregator's parameter order: the same vector is summed
    # (and the same random draws made) as after backward; only the ring's addition order may differ
    torch.testing.assert_close(torch.tensor(hooked), torch.tensor(post), rtol=1e-5, atol=1e-6)
    assert sum(hooked[-5:]) < sum(hooked[:5])         # it learns


# the launcher, not the option, is what differs here: GradiVeQ (stateful across iterations) and rar (in the
# test below) under torchrun; every option's hook is checked against post-backward in tests/hooks/test_state.py
def test_ddp_hook_example_under_torchrun_trains_as_spawned():
    torchrun = _losses(DDP[3])
    assert len(torchrun) == 30 and sum(torchrun[-5:]) < sum(torchrun[:5])
    torch.testing.assert_close(torch.tensor(torchrun), torch.tensor(_losses(DDP[0])),
                               rtol=1e-5, atol=1e-6)


def test_ddp_hook_example_rar_under_torchrun_is_ddps_own_all_reduce_bitwise():
    # 2 ranks: a + b in either order, halved exactly; the checksum's 12 decimals and every loss agree
    assert _run(_with(DDP[3], "rar")) == _run(DDP[3].replace(" gradiveq", " --no-hook"))
    assert _run(DDP[2]).splitlines()[-1] == _run(_with(DDP[3], "rar")).splitlines()[-1]   # spawned, the same
    torch.testing.assert_close(torch.tensor(_losses(_with(DDP[1], "rar"))),       # and rar after backward
                               torch.tensor(_losses(_with(DDP[3], "rar"))), rtol=1e-5, atol=1e-6)


def test_accelerate_example_resumed_ends_where_the_uninterrupted_run_ends(tmp_path):
    whole_line, accelerate_line, stop_line, resume_line, _ = documented("accelerate_hook.py")
    whole = _run(whole_line)
    assert _run(accelerate_line) == whole              # accelerate's launcher: the same two processes
    _run(stop_line, cwd=tmp_path)
    resumed = _run(resume_line, cwd=tmp_path)
    tail = re.findall(r"^iteration (\d+) loss (\S+)$", resumed, re.M)
    assert [int(i) for i, _ in tail] == list(range(15, 30))
    expected = dict(re.findall(r"^iteration (\d+) loss (\S+)$", whole, re.M))
    torch.testing.assert_close(torch.tensor([float(v) for _, v in tail]),
                               torch.tensor([float(expected[i]) for i, _ in tail]), rtol=1e-6, atol=1e-7)
    checksum = [float(re.search(r"^checksum (\S+)$", o, re.M).group(1)) for o in (whole, resumed)]
    assert abs(checksum[0] - checksum[1]) < 1e-6


def test_lightning_example_learns_through_the_callback():
    hooked, plain = documented("lightning_hook.py")
    losses = _losses(hooked + " --epochs 3")
    assert len(losses) == 3 and losses[-1] < 0.7 * losses[0]
    baseline = _losses(plain + " --epochs 3")
    assert len(baseline) == 3 and baseline[-1] < 0.7 * baseline[0]


def test_gpt_example_learns_bytes_under_torchrun_through_the_hook():
    for line in documented("gpt_hook.py"):
        out = _run(line)
        losses = [float(v) for v in re.findall(r"^iteration \d+ loss (\S+)$", out, re.M)]
        assert len(losses) == 40 and sum(losses[-5:]) < 0.8 * sum(losses[:5]), (line, losses)
        bpb = float(re.search(r"^held-out bits per byte (\S+)$", out, re.M).group(1))
        assert bpb < 6.5, (line, bpb)                  # uniform bytes are 8 bits


METHOD = documented("method_hook.py")       # local SGD every 4, torch's averager, DiLoCo saving, resumed


def _tail(out: str) -> tuple[dict, float, tuple[int, int]]:
    """{iteration: loss}, the checksum, and (syncs, bytes sent) of one run of examples/method_hook.py."""
    losses = {int(i): float(v) for i, v in re.findall(r"^iteration (\d+) loss (\S+)$", out, re.M)}
    syncs, sent = re.search(r"^syncs (\d+) bytes sent (\d+)$", out, re.M).groups()
    return losses, float(re.search(r"^checksum (\S+)$", out, re.M).group(1)), (int(syncs), int(sent))


def test_method_example_local_sgd_trains_as_torchs_periodic_model_averager():
    """The same 30 batches: gvq's local SGD (rar's ring on the parameters, DDP's no_sync between) against
    torch's all-reduce of them every 4 steps: losses within 1e-5, the checksum within 1e-5 (float32 sums
    in another order); 8 syncs (steps 0, 4, ... 28) and gvq's bytes at them, none sent by DDP between."""
    (ours, ours_sum, (syncs, sent)), (theirs, theirs_sum, (t_syncs, _)) = (_tail(_run(line)) for line in METHOD[:2])
    assert sorted(ours) == sorted(theirs) == list(range(30))
    torch.testing.assert_close(torch.tensor(list(ours.values())), torch.tensor(list(theirs.values())),
                               rtol=1e-5, atol=1e-6)
    assert abs(ours_sum - theirs_sum) < 1e-5 and syncs == t_syncs == 8 and sent > 0
    assert sum(list(ours.values())[-5:]) < sum(list(ours.values())[:5])           # it learns


def test_method_example_diloco_resumed_mid_period_ends_where_the_uninterrupted_run_ends(tmp_path):
    save_line, resume_line = METHOD[2:]
    whole = _tail(_run(save_line, cwd=tmp_path))          # 30 steps, each rank's checkpoint after step 11
    assert sorted(p.name for p in tmp_path.glob("ckpt.rank*.pt")) == ["ckpt.rank0.pt", "ckpt.rank1.pt"]
    losses, checksum, _ = _tail(_run(resume_line, cwd=tmp_path))
    assert sorted(losses) == list(range(12, 30))          # from step 12: DiLoCo syncs after 9 and 14
    assert losses == {i: whole[0][i] for i in losses} and checksum == whole[1]    # as printed: bit for bit


def test_accelerate_example_with_a_method_is_the_torchrun_scripts_local_sgd():
    out = _run(documented("accelerate_hook.py")[4])
    losses = [float(v) for v in re.findall(r"^iteration \d+ loss (\S+)$", out, re.M)]
    theirs, checksum, _ = _tail(_run(METHOD[0]))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(list(theirs.values())), rtol=1e-6, atol=1e-7)
    assert abs(float(re.search(r"^checksum (\S+)$", out, re.M).group(1)) - checksum) < 1e-6
