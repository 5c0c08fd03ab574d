"""Typed schemas of the composed config, registered in Hydra's ConfigStore.

See docs/design.md#gvqschemaconfigpy for how it works and why.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from omegaconf.nodes import AnyNode, BooleanNode, EnumNode, FloatNode, IntegerNode, StringNode

from gvq.schema.grid import GridSchema
from gvq.schema.options import OPTION_SCHEMAS, Choice

#: command-line overrides that do not make a setting (a run's seeds share one): the one list the run's
#: wandb ``setting`` and the report's groups both leave out
NOT_A_SETTING = ("seed=", "hydra.", "logger=", "logger.")


class Device(Choice):
    cpu = "cpu"                 # gloo
    cuda = "cuda"               # NCCL, one GPU per rank (or a shared GPU, host-staged)


class NanPolicy(Choice):
    error = "error"             # stop, naming rank and layer
    skip = "skip"               # skip the step on every rank


WandbMode = Choice("WandbMode", "offline online disabled", module=__name__)


@dataclass
class WandbSchema:
    enabled: bool = True
    mode: WandbMode = WandbMode.offline
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


#: top-level knobs that only some aggregators read, through an interpolation in their option file
#: (``lam: ${lambda}`` in conf/aggregator/gradiveq.yaml); top-level so sweeps can cross them with every
#: aggregator (``-m aggregator=rar,gradiveq lambda=0.01,0.05``), and a hook's overrides may name them
KNOBS = ("lambda", "K", "s", "L_t", "L_c", "warmup")

#: option groups whose options each name a schema of their own (``schema/<group>/<option>``)
TYPED_GROUPS = ("aggregator", "model", "dataset", "optim", "net", "method")


def build_schema() -> Any:
    schema = OmegaConf.create({
        "logger": OmegaConf.structured(LoggerSchema),
        "world_size": IntegerNode(2),
        "seed": IntegerNode(0),
        "device": EnumNode(Device, Device.cpu),
        "iterations": IntegerNode(300),
        "eval_every": IntegerNode(50),
        "batch_size": IntegerNode(32),
        "timeout_s": FloatNode(60.0),
        "nan_policy": EnumNode(NanPolicy, NanPolicy.error),
        "checkpoint": OmegaConf.structured(CheckpointSchema),
        "resume": StringNode(None),
        "restarts": IntegerNode(0),
        "aggregate_error": BooleanNode(False),
        "lambda": FloatNode(0.01),
        "K": AnyNode("auto"),           # auto | x<m> | an int: gvq.run.validate.check_k
        "s": FloatNode(float("inf")),
        "L_t": IntegerNode(100),
        "L_c": IntegerNode(400),
        "warmup": IntegerNode(0),
    })
    # struct on the fixed-shape groups only: a struct root would be inherited by Hydra's own ``hydra``
    # node and break presets that set ``hydra.sweeper.params``.  Unknown top-level keys are still
    # rejected: Hydra refuses overrides of absent keys, and gvq.run.validate checks the key set.  The
    # typed groups are absent here: an open node here would make their options' schemas non-struct.
    for group in ("logger", "checkpoint"):
        OmegaConf.set_struct(schema[group], True)
    return schema


TOP_LEVEL_KEYS = frozenset(build_schema().keys()) | frozenset(TYPED_GROUPS)


def register() -> None:
    """Store the schemas and the resolver, once a process: every in-process compose calls this, and
    storing anew costs about as much as the composition itself.  Stored again if either was cleared."""
    store = ConfigStore.instance()
    if "gvq_schema.yaml" in store.repo and OmegaConf.has_resolver("gvq_uid"):
        return
    store.store(name="gvq_schema", node=build_schema())
    for (group, option), schema in OPTION_SCHEMAS.items():
        store.store(group=f"schema/{group}", name=option, node=schema)
    store.store(group="schema", name="grid", node=GridSchema)     # conf/grid/*.yaml (gvq.schema.compose.grid)
    # ``${gvq_uid:}`` in the run / sweep dirs (conf/hydra/default.yaml): two runs started in the same
    # microsecond still get two dirs.  Cached like Hydra's ``now``, and Hydra copies the cache into every
    # job of a sweep, so a sweep's jobs share their sweep dir.
    OmegaConf.register_new_resolver("gvq_uid", lambda: uuid.uuid4().hex[:6], use_cache=True, replace=True)
