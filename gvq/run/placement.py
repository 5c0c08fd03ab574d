"""Where ranks run with ``device=cuda``, decided by the launcher before any rank starts.

* ``nccl``: every rank of a machine (``world_size``, or torchrun's ``LOCAL_WORLD_SIZE``) has a GPU of its
  own (its local rank's), and collectives and the ring's messages go over NCCL.
* ``shared``: more ranks than GPUs (the paper's N on a workstation), or a torch build without NCCL.  Ranks
  take the GPUs round-robin (local rank mod GPUs): model, gradients and codecs stay on the GPU; the process
  group is gloo, and every payload and collective is copied through host memory (NCCL refuses two ranks
  on one GPU, and gloo's send of a CUDA tensor kills the process): :mod:`gvq.comm.staging`, ``stage_s``.
  Ranks sharing a GPU share its time too, so their compute times are contended as ranks sharing cores are.

Refused with one line, naming the fix: no GPU visible (none, no CUDA build, or ``CUDA_VISIBLE_DEVICES``
hiding them all), and the torch DDP aggregators (``ddp*``) without one GPU per rank and NCCL.  The
checks read the machine through arguments (``gpus``, ``nccl``, ``env``), so the tests can stand in for a
GPU machine on a CPU-only one.
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


def cuda_plan(world_size: int, aggregator: str, ddp: bool, gpus: int | None = None,
              nccl: bool | None = None, env=None) -> str:
    """``nccl`` or ``shared`` (see the module); a one-line ConfigError where neither can run."""
    env = os.environ if env is None else env
    gpus = (torch.cuda.device_count() if torch.cuda.is_available() else 0) if gpus is None else gpus
    nccl = dist.is_nccl_available() if nccl is None else nccl
    if gpus == 0:
        hidden = env.get("CUDA_VISIBLE_DEVICES")
        why = (f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU" if hidden is not None
               else "no CUDA device is visible here")
        raise ConfigError(f"device=cuda: {why}; use device=cpu")
    ranks = local_world(world_size, env)
    if ranks <= gpus and nccl:
        return "nccl"
    if ddp and not nccl:
        raise ConfigError(f"aggregator={aggregator} with device=cuda: this torch build has no NCCL, which torch "
                          "DDP on GPUs needs; use a non-DDP aggregator (gloo, staged through host memory)")
    if ddp:
        raise ConfigError(f"aggregator={aggregator} with device=cuda: {ranks} ranks on this machine, {gpus} "
                          f"visible GPU{'s' * (gpus != 1)}; torch DDP needs one GPU per rank (NCCL cannot "
                          f"hold two ranks on one GPU): use world_size<={gpus}, or a non-DDP aggregator")
    return "shared"


def group_backend(plan: str | None) -> str:
    """The process group's backend for a plan: a GPU per rank carries CUDA tensors over NCCL and host
    ones (clock headers, payloads staged under emulated links, bookkeeping) over gloo, in one group;
    shared GPUs and the host: gloo alone (device tensors host-staged)."""
    return "cuda:nccl,cpu:gloo" if plan == "nccl" else "gloo"
