"""Where ranks run with ``device=cuda``, decided by the launcher before any rank starts.

One GPU per rank is the supported placement: the ranks of a machine (``world_size``, or torchrun's
``LOCAL_WORLD_SIZE``) each take the GPU of their local rank, and every collective and the ring's
point-to-point messages go over NCCL.  Everything else is refused with one line, naming the fix:

* no GPU visible (none installed, no CUDA build, or ``CUDA_VISIBLE_DEVICES`` hiding them all);
* a torch build without NCCL;
* more ranks on a machine than it has GPUs: NCCL refuses two ranks on one GPU ("invalid usage"), and
  gloo cannot carry CUDA tensors (its send of one kills the process), so ranks sharing a GPU need a
  transport that stages every payload and collective through host memory -- gvq does not have it yet
  -- and torch DDP (``ddp*`` aggregators) cannot share a GPU at all.

The checks read the machine through arguments (``gpus``, ``nccl``, ``env``) so that the tests can
stand in for a GPU machine on this CPU-only one.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from gvq.run.validate import ConfigError


def local_world(world_size: int, env=None) -> int:
    """Ranks on this machine: torchrun's LOCAL_WORLD_SIZE when launched by it, else all of them."""
    env = os.environ if env is None else env
    return int(env["LOCAL_WORLD_SIZE"]) if "LOCAL_WORLD_SIZE" in env and "RANK" in env else world_size


def check_cuda_placement(world_size: int, aggregator: str, ddp: bool, gpus: int | None = None,
                         nccl: bool | None = None, env=None) -> None:
    """Raise a one-line ConfigError unless every rank of this machine gets a GPU of its own and NCCL."""
    env = os.environ if env is None else env
    gpus = (torch.cuda.device_count() if torch.cuda.is_available() else 0) if gpus is None else gpus
    nccl = dist.is_nccl_available() if nccl is None else nccl
    if gpus == 0:
        hidden = env.get("CUDA_VISIBLE_DEVICES")
        why = (f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU" if hidden is not None
               else "no CUDA device is visible here")
        raise ConfigError(f"device=cuda: {why}; use device=cpu")
    if not nccl:
        raise ConfigError("device=cuda: this torch build has no NCCL (torch.distributed.is_nccl_available() "
                          "is False); install a CUDA build of torch with NCCL, or use device=cpu")
    ranks = local_world(world_size, env)
    if ranks <= gpus:
        return
    where = f"{ranks} ranks on this machine, {gpus} visible GPU{'s' * (gpus != 1)}"
    if ddp:
        raise ConfigError(f"aggregator={aggregator} with device=cuda: {where}; torch DDP needs one GPU per "
                          f"rank (NCCL cannot hold two ranks on one GPU): use world_size<={gpus}")
    raise ConfigError(f"device=cuda: {where}; ranks sharing a GPU need a host-staged transport gvq does not "
                      f"have yet (NCCL refuses two ranks on one GPU): use world_size<={gpus}, or device=cpu")
