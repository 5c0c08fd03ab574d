"""device=cuda placement (gvq/run/placement.py): a GPU per rank over NCCL, ranks sharing GPUs over host-staged
gloo, and every impossible combination a one-line error naming the fix.  The machine is passed in, so a
GPU machine is stood in for here; the staged transport itself is tested in tests/comm/test_staging.py.
The end-to-end CUDA tests at the bottom run only where a GPU is visible (they skip on CPU machines)."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from gvq.run.placement import cuda_plan, group_backend, local_world
from gvq.run.validate import ConfigError
from tests.helpers.cli import ROOT, TEST_CONF, cli

MACHINE = dict(gpus=2, nccl=True, env={})


def _plan(world=2, agg="qsgd", ddp=False, **kw) -> str:
    return cuda_plan(world, agg, ddp, **{**MACHINE, **kw})


def _err(**kw) -> str:
    with pytest.raises(ConfigError) as e:
        _plan(**kw)
    msg = str(e.value)
    assert "\n" not in msg                                      # one line
    return msg


def test_a_gpu_per_rank_with_nccl_is_the_nccl_plan():
    assert _plan(world=2) == "nccl"
    assert _plan(world=1, agg="ddp", ddp=True, gpus=8) == "nccl"


def test_more_ranks_than_gpus_share_them_over_staged_gloo():
    assert _plan(world=6, gpus=1) == "shared"                   # the paper's N = 6 on one GPU
    assert _plan(world=2, nccl=False) == "shared"               # no NCCL: gloo, staged


def test_no_gpu_and_a_hiding_cuda_visible_devices_are_told_apart():
    assert "no CUDA device is visible" in _err(gpus=0)
    msg = _err(gpus=0, env={"CUDA_VISIBLE_DEVICES": ""})
    assert "CUDA_VISIBLE_DEVICES=''" in msg and "hides every GPU" in msg and "device=cpu" in msg


def test_ddp_without_a_gpu_per_rank_or_nccl_is_refused_as_ddp():
    msg = _err(world=3, gpus=1, agg="ddp_powersgd", ddp=True)
    assert msg.startswith("aggregator=ddp_powersgd") and "3 ranks on this machine, 1 visible GPU;" in msg
    assert "torch DDP needs one GPU per rank" in msg and "world_size<=1" in msg
    assert "no NCCL" in _err(agg="ddp", ddp=True, nccl=False)


def test_torchrun_counts_the_ranks_of_this_machine_only():
    env = {"RANK": "5", "LOCAL_WORLD_SIZE": "2"}
    assert local_world(16, env) == 2 and local_world(16, {}) == 16
    assert _plan(world=16, env=env) == "nccl"                     # 8 nodes x 2 GPUs
    assert _plan(world=16, env={"RANK": "0", "LOCAL_WORLD_SIZE": "4"}) == "shared"


def test_a_gpu_per_rank_groups_nccl_with_gloo_for_host_tensors():
    assert group_backend("nccl") == "cuda:nccl,cpu:gloo"       # CUDA over NCCL, host tensors over gloo
    assert group_backend("shared") == group_backend(None) == "gloo"


# ---- on a GPU machine: every aggregator end to end (skipped where no CUDA device is visible) ---------
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")
ALL = sorted(p.stem for p in (ROOT / "conf" / "aggregator").glob("*.yaml"))
SHORT = ["device=cuda", "iterations=8", "eval_every=8", "logger=csv", "logger.progress=false", "batch_size=16",
         "warmup=1", "L_t=3", "L_c=3"]


def _sweep(tmp_path, world: int, names: list[str]) -> list[dict]:
    r = cli("-m", f"aggregator={','.join(names)}", f"world_size={world}", *SHORT,
            f"hydra.sweep.dir={tmp_path}", timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*/summary.json"))]


@pytest.mark.slow
@pytest.mark.cuda
@CUDA
@pytest.mark.parametrize("world", [1, 3])
def test_every_aggregator_trains_on_cuda_with_identical_replicas(tmp_path, world):
    """world 1: NCCL (DDP aggregators included); world 3: a GPU per rank where there are 3, else ranks
    sharing GPUs over host-staged gloo (DDP refused there: tested below)."""
    gpus = torch.cuda.device_count()
    names = ALL if world <= gpus else [n for n in ALL if not n.startswith("ddp")]
    summaries = _sweep(tmp_path, world, names)
    assert len(summaries) == len(names)
    for s in summaries:
        assert s["status"] == "completed" and s["replicas_identical"], (s["config"]["aggregator"], s.get("error"))
        assert s["cuda_plan"] == ("nccl" if world <= gpus else "shared")


@pytest.mark.slow
@pytest.mark.cuda
@CUDA
def test_ddp_on_shared_gpus_is_one_line_and_writes_no_run(tmp_path):
    world = torch.cuda.device_count() + 1
    r = cli("aggregator=ddp", f"world_size={world}", *SHORT, f"hydra.run.dir={tmp_path / 'run'}")
    assert r.returncode == 2 and "torch DDP needs one GPU per rank" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "metrics.csv").exists()


@pytest.mark.slow
@pytest.mark.cuda
@CUDA
def test_a_cuda_run_resumes_from_its_checkpoint(tmp_path):
    """qsgd_dies (tests/conf) kills rank 1 at iteration 13; the resumed run continues from iteration 10 on
    the GPU (states moved to the device) and ends with identical replicas.  GPU kernels (cuDNN) need not
    be bitwise reproducible, so the losses are compared to a tolerance, not bit for bit."""
    common = ["logger=csv", "iterations=24", "eval_every=6", "world_size=2", "batch_size=16", "device=cuda",
              f"hydra.searchpath=[file://{TEST_CONF}]"]
    full, broken, resumed = tmp_path / "full", tmp_path / "broken", tmp_path / "resumed"
    assert cli(*common, "aggregator=qsgd", f"hydra.run.dir={full}").returncode == 0
    assert cli(*common, "aggregator=qsgd_dies", "checkpoint.every=5", f"hydra.run.dir={broken}").returncode != 0
    r = cli(*common, "aggregator=qsgd", f"resume={broken}", f"hydra.run.dir={resumed}")
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = pd.read_csv(full / "metrics.csv"), pd.read_csv(resumed / "metrics.csv")
    assert list(b.iteration) == list(range(24))
    assert b.train_loss.to_numpy() == pytest.approx(a.train_loss.to_numpy(), rel=1e-2)
    assert json.loads((resumed / "summary.json").read_text())["replicas_identical"]
