"""Typed schema of the composed config, registered in Hydra's ConfigStore as ``gvq_schema``.

It sits first in ``conf/config.yaml``'s defaults list, so Hydra rejects unknown keys (struct mode) and
ill-typed values (``world_size=abc``) at compose time.  The top level cannot be a dataclass: ``lambda``
is a Python keyword and no dataclass may hold it, so the top level is a DictConfig of typed nodes; the
fixed-shape groups (``optim``, ``net``, ``logger``) are dataclasses.  ``aggregator``, ``model`` and
``dataset`` are open: their keys are constructor kwargs checked by ``hydra.utils.instantiate``.
Ranges (``world_size >= 1``, ``0 <= lambda < 1`` ...) are checked in code by :mod:`gvq.run.validate`.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from omegaconf.nodes import AnyNode, FloatNode, IntegerNode, StringNode


@dataclass
class OptimSchema:
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    nesterov: bool = False
    schedule: str = "cosine"
    milestones: List[float] = field(default_factory=lambda: [0.5, 0.75])
    gamma: float = 0.1
    warmup_iters: int = 0


@dataclass
class NetSchema:
    bandwidth_bps: Optional[float] = None
    latency_s: float = 0.0
    clock: str = "wall"
    compute_scale: float = 1.0
    codec_scale: float = 1.0
    exclusive: bool = True


@dataclass
class WandbSchema:
    enabled: bool = True
    mode: str = "offline"
    project: str = "gvq"
    entity: Optional[str] = None
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)


@dataclass
class CheckpointSchema:
    every: int = 0
    keep: int = 2


@dataclass
class LoggerSchema:
    csv: bool = True
    wandb: WandbSchema = field(default_factory=WandbSchema)
    progress: bool = True


def _open_group() -> Any:
    """A group whose keys are constructor kwargs: must name a ``_target_``, anything else is free."""
    node = OmegaConf.create({"_target_": StringNode(None)})
    OmegaConf.set_struct(node, False)
    return node


def build_schema() -> Any:
    schema = OmegaConf.create({
        "aggregator": _open_group(),
        "model": _open_group(),
        "dataset": _open_group(),
        "optim": OmegaConf.structured(OptimSchema),
        "net": OmegaConf.structured(NetSchema),
        "logger": OmegaConf.structured(LoggerSchema),
        "world_size": IntegerNode(2),
        "seed": IntegerNode(0),
        "device": StringNode("cpu"),
        "iterations": IntegerNode(300),
        "eval_every": IntegerNode(50),
        "batch_size": IntegerNode(32),
        "timeout_s": FloatNode(60.0),
        "nan_policy": StringNode("error"),
        "checkpoint": OmegaConf.structured(CheckpointSchema),
        "resume": StringNode(None),
        "lambda": FloatNode(0.01),
        "K": AnyNode("auto"),
        "s": FloatNode(float("inf")),
        "L_t": IntegerNode(100),
        "L_c": IntegerNode(400),
        "warmup": IntegerNode(0),
    })
    # struct on the fixed-shape groups only: a struct root would be inherited by Hydra's own ``hydra``
    # node and break presets that set ``hydra.sweeper.params``.  Unknown top-level keys are still
    # rejected: Hydra refuses overrides of absent keys, and gvq.run.validate checks the key set.
    for group in ("optim", "net", "logger"):
        OmegaConf.set_struct(schema[group], True)
    return schema


TOP_LEVEL_KEYS = frozenset(build_schema().keys())


def register() -> None:
    ConfigStore.instance().store(name="gvq_schema", node=build_schema())
    # ``${gvq_uid:}`` in the run / sweep dirs (conf/hydra/default.yaml): two runs started in the same
    # microsecond still get two dirs.  Cached like Hydra's ``now``, and Hydra copies the cache into every
    # job of a sweep, so a sweep's jobs share their sweep dir.
    OmegaConf.register_new_resolver("gvq_uid", lambda: uuid.uuid4().hex[:6], use_cache=True, replace=True)
