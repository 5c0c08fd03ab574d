"""Which ranks a hook state averages among, and the channel it does it on.

DDP averages each replica's gradients over its own process group (``DistributedDataParallel(...,
process_group=pg)``: the data-parallel group of a hybrid data / model-parallel job), so the hook must run
its ring among that group's ranks only, by their global ids (:class:`gvq.comm.p2p.P2P` translates).  And
every state sends on a process group of its own (:func:`own_group`, over the same ranks): two hooked
models in one process (a GAN, teacher and student, several towers) each have a communication thread, and
on one shared group their messages would cross (gloo matches messages by peer and tag, NCCL by order).
"""
from __future__ import annotations

import gc
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gvq.comm import clock
from gvq.comm.p2p import P2P, peer_timeout_s


def hook_parameters(params) -> tuple[list[torch.nn.Parameter], object | None]:
    """(the parameters, DDP's process group or None) of what a caller hands a state: parameters, a module,
    or the ``DistributedDataParallel`` wrapper (whose group is then the one averaged over)."""
    if isinstance(params, DistributedDataParallel):
        return list(params.module.parameters()), params.process_group
    if isinstance(params, torch.nn.Module):
        return list(params.parameters()), None
    if params is None or isinstance(params, (str, bytes, torch.Tensor)) or not hasattr(params, "__iter__"):
        raise ValueError(f"gvq hook: params={type(params).__name__}: pass the model's parameters "
                         "(model.parameters()), the model, or its DistributedDataParallel wrapper")
    params = list(params)
    bad = next((p for p in params if not isinstance(p, torch.Tensor)), None)
    if not params or bad is not None:
        what = "no parameters" if not params else f"a {type(bad).__name__}"
        raise ValueError(f"gvq hook: params holds {what}: pass the model's parameters (model.parameters()), "
                         "the model, or its DistributedDataParallel wrapper")
    return params, None


def owning_ddp(param: torch.Tensor) -> DistributedDataParallel | None:
    """The live ``DistributedDataParallel`` whose module holds ``param``, for a caller that handed the
    parameters rather than the wrapper (one scan of the interpreter's objects, once per state); None
    where there is none (yet)."""
    for obj in gc.get_objects():
        if isinstance(obj, DistributedDataParallel) and any(p is param for p in obj.module.parameters()):
            return obj
    return None


def ddp_group(params: list[torch.Tensor], group):
    """The process group to average ``params`` over: ``group`` if given, else that of the DDP wrapping
    them if one exists, else the default group (None without a process group)."""
    if group is not None or not (dist.is_available() and dist.is_initialized()):
        return group
    ddp = owning_ddp(params[0]) if params else None
    return ddp.process_group if ddp is not None else dist.group.WORLD


def check_registered(ranks: list[int] | None, param: torch.Tensor) -> None:
    """At a state's first bucket: the DDP handing it must average over the state's ranks (a wrapper made
    after the state, over another group, would otherwise be averaged over the wrong ranks, silently)."""
    ddp = owning_ddp(param) if ranks is not None else None
    if ddp is not None and ring_ranks(ddp.process_group) != ranks:
        raise ValueError(f"gvq hook: the DDP this state is registered on averages over global ranks "
                         f"{ring_ranks(ddp.process_group)}, the state over {ranks}: build it with "
                         "GvqHookState.from_config(option, ddp) (the wrapper) or group=ddp.process_group")


def ring_ranks(group) -> list[int] | None:
    """The global ranks of ``group`` (None: the default group's) in group order; None without a process
    group (a state built for a test or a checkpoint, never run)."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError("gvq hook: a process group was given but torch.distributed is not initialized")
        return None
    return dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)


def place_in(ranks: list[int] | None, rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world size) of this process in the ring of ``ranks``, checked against any given: the
    rank must be in [0, world size) and, with a process group, this process's place in it."""
    if ranks is not None:
        me = dist.get_rank()
        if me not in ranks:
            raise ValueError(f"gvq hook: this process (global rank {me}) is not in the process group "
                             f"{ranks} it was asked to average over")
        place = (ranks.index(me), len(ranks))
        if (rank, world_size) not in ((None, None), place):
            raise ValueError(f"gvq hook: rank={rank}, world_size={world_size} given, but this process is "
                             f"rank {place[0]} of {place[1]} in the process group averaged over (its global "
                             f"ranks {ranks}); leave both out")
        return place
    if rank is None or world_size is None:
        raise ValueError("gvq hook: no process group: give rank and world_size (or init_process_group first)")
    for key, v in (("rank", rank), ("world_size", world_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"gvq hook: {key}={v!r}: must be an integer")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"gvq hook: rank={rank}, world_size={world_size}: need world_size >= 1 and "
                         f"0 <= rank < world_size")
    return rank, world_size


def own_group(ranks: list[int] | None, timeout_s: float):
    """A process group of the state's own over ``ranks`` (a collective among them only: every member
    builds its states in the same order, as SPMD code does); None where nothing is sent (no process
    group, or one rank)."""
    if ranks is None or len(ranks) < 2:
        return None
    with clock.get().blocked():              # its members meet: a wait, never while holding a core
        return dist.new_group(ranks, timeout=timedelta(seconds=timeout_s), use_local_synchronization=True)


def connect(agg, ranks: list[int] | None):
    """``agg``'s transport (bound: ``agg.ctx`` set) moved onto a process group of its own over ``ranks``
    (:func:`own_group`), once per process; returns that group."""
    c = agg.ctx
    group = own_group(ranks, peer_timeout_s(c.timeout_s))
    if agg.p2p is not None:
        agg.p2p.close()
    agg.p2p = P2P(c.rank, c.world_size, c.timeout_s, c.bandwidth_bps, c.latency_s, group=group, cluster=c.cluster)
    return group
