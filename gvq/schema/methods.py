"""The schemas of ``conf/method/`` (what a rank does from "gradients computed" to "parameters updated":
gvq/methods/), merged into :data:`gvq.schema.options.OPTION_SCHEMAS`.  A new method adds its dataclass and
its entry here; what each value means is said in its option file.  No torch here.
"""
from __future__ import annotations

from dataclasses import dataclass

from gvq.schema.choices import Workers


@dataclass
class EveryStepSchema:
    _target_: str = "gvq.methods.every_step.EveryStep"


@dataclass
class LocalSGDSchema:
    _target_: str = "gvq.methods.local_sgd.LocalSGD"
    every: int = 4
    start_iter: int = 0
    workers: Workers = Workers.rank


@dataclass
class DiLoCoSchema:
    _target_: str = "gvq.methods.diloco.DiLoCo"
    every: int = 30
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    workers: Workers = Workers.rank


@dataclass
class StreamingDiLoCoSchema(DiLoCoSchema):       # DiLoCo's knobs, as StreamingDiLoCo is a DiLoCo
    _target_: str = "gvq.methods.streaming_diloco.StreamingDiLoCo"
    fragments: int = 3
    delay: int = 1
    alpha: float = 0.0


@dataclass
class DeMoSchema:
    _target_: str = "gvq.methods.demo.DeMo"
    k: int = 1
    chunk: int = 64
    beta: float = 0.999


#: ("method", option) -> dataclass
METHOD_SCHEMAS: dict[tuple[str, str], type] = {
    ("method", "every_step"): EveryStepSchema,
    ("method", "local_sgd"): LocalSGDSchema,
    ("method", "diloco"): DiLoCoSchema,
    ("method", "streaming_diloco"): StreamingDiLoCoSchema,
    ("method", "demo"): DeMoSchema,
}
