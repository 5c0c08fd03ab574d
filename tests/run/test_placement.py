"""device=cuda placement (gvq/run/placement.py): a GPU per rank over NCCL, ranks sharing GPUs over host-staged
gloo, and every impossible combination a one-line error naming the fix.  The machine is passed in, so a
GPU machine is stood in for here; the staged transport itself is tested in tests/comm/test_staging.py."""
from __future__ import annotations

import pytest

from gvq.run.placement import cuda_plan, local_world
from gvq.run.validate import ConfigError

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
