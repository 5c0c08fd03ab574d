"""device=cuda placement (gvq/run/placement.py): one GPU per rank over NCCL, every impossible combination a
one-line error naming the fix.  The machine is passed in, so a GPU machine is stood in for here."""
from __future__ import annotations

import pytest

from gvq.run.placement import check_cuda_placement, local_world
from gvq.run.validate import ConfigError


def _err(**kw) -> str:
    args = dict(world_size=2, aggregator="qsgd", ddp=False, gpus=2, nccl=True, env={})
    args.update(kw)
    with pytest.raises(ConfigError) as e:
        check_cuda_placement(**args)
    msg = str(e.value)
    assert "\n" not in msg                                      # one line
    return msg


def test_one_gpu_per_rank_with_nccl_is_accepted():
    check_cuda_placement(2, "qsgd", False, gpus=2, nccl=True, env={})
    check_cuda_placement(1, "ddp", True, gpus=8, nccl=True, env={})


def test_no_gpu_and_a_hiding_cuda_visible_devices_are_told_apart():
    assert "no CUDA device is visible" in _err(gpus=0)
    msg = _err(gpus=0, env={"CUDA_VISIBLE_DEVICES": ""})
    assert "CUDA_VISIBLE_DEVICES=''" in msg and "hides every GPU" in msg and "device=cpu" in msg


def test_a_build_without_nccl_is_refused():
    assert "no NCCL" in _err(nccl=False)


def test_more_ranks_than_gpus_is_refused_naming_the_limit():
    msg = _err(world_size=6, gpus=1)
    assert "6 ranks on this machine, 1 visible GPU;" in msg and "world_size<=1" in msg


def test_ddp_sharing_a_gpu_is_refused_as_ddp():
    msg = _err(world_size=3, gpus=1, aggregator="ddp_powersgd", ddp=True)
    assert msg.startswith("aggregator=ddp_powersgd") and "torch DDP needs one GPU per rank" in msg


def test_torchrun_counts_the_ranks_of_this_machine_only():
    env = {"RANK": "5", "LOCAL_WORLD_SIZE": "2"}
    assert local_world(16, env) == 2 and local_world(16, {}) == 16
    check_cuda_placement(16, "qsgd", False, gpus=2, nccl=True, env=env)     # 8 nodes x 2 GPUs
    assert "4 ranks on this machine, 2 visible GPUs" in _err(world_size=16, env={"RANK": "0",
                                                                                 "LOCAL_WORLD_SIZE": "4"})
