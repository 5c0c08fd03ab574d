"""One dataclass schema per constructor an option file of ``aggregator/``, ``model/``, ``dataset/``, ``optim/``,
``net/`` or ``method/`` builds, stored by :func:`gvq.schema.config.register` as ``schema/<group>/<name>``.

Each option file names its schema first in its defaults list (``/schema/aggregator/qsgd@_here_``), so
OmegaConf refuses a misspelt key (``aggregator.rnk=4``), an ill-typed value (``model.width=abc``) or a
choice outside its enum (``aggregator.topology=rng``) at compose time.  A schema's fields are its
``_target_``'s keyword arguments, but for :data:`WRAPPING_KEYS` and :data:`SCHEDULE_KEYS` (the run's); an
aggregator's knobs have their default here only (its constructor takes what it is given: :func:`knobs`
builds one from the schema), every other constructor's defaults equal these (``tests/schema/test_options.py``
holds both to the signatures); what a constructor's value means is said in the option files.  The
compressors' schemas are in :mod:`gvq.schema.codecs`, the string knobs' choices in :mod:`gvq.schema.choices`.
No torch here: the CLI imports this before Hydra composes.
"""
from __future__ import annotations

import enum
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import List, Optional

from gvq.schema.choices import (Choice, Clock, CommCore, EFUnits, Hook, Hop, IntraDtype, Kernels, LabelSplit, Norm,
                                OneSource, QgzGather, QgzWire, RarTopology, Sampling, SourceSplit, Tokenizer,
                                Topology)
from gvq.schema.codecs import (BinGradBSchema, BinGradPBSchema, ChunkTopKSchema, DGCSchema, EFSignSGDSchema,
                               FP16Schema, GradiVeQSchema, LinearSchema, NaturalSchema, OneBitSchema, ORQSchema,
                               QSGDSchema, RandomKSchema, SignSGDSchema, SignVoteSchema, TernGradSchema, TopKSchema)
from gvq.schema.methods import METHOD_SCHEMAS

# -- links -------------------------------------------------------------------------------------------


@dataclass
class NetSchema:
    """An emulated per-rank link and the clock runs are timed on: the one home of every ``net.*``
    default (conf/net/*.yaml set only what differs; the benchmarks read them here too, and take any key
    as ``net.KEY=VALUE`` on their command lines); gvq.run.validate holds the clock's rules."""
    bandwidth_bps: Optional[float] = None    # bit/s per rank's outgoing link; lower => the wire dominates;
                                             # null: unshaped
    latency_s: float = 0.0                   # extra per-message latency (s) on top of the real transport's own
    # a two-level net: nodes of this many consecutive ranks; bandwidth_bps / latency_s are then the links
    # between nodes, these the links inside one (gvq/comm/links.py Cluster); 1: the flat net, one link class
    ranks_per_node: int = 1
    intra_bandwidth_bps: Optional[float] = None   # bit/s to a rank of the same node; higher => cheaper intra
                                                  # phases; null: unshaped (wall clock only)
    intra_latency_s: float = 0.0             # per-message latency inside a node (s)
    # what aggregator.topology=hierarchical's node phases (reduce-scatter, all-gather) carry: fp32 (the vector's
    # own dtype) | fp16 (half the intra-node bytes; each partial sum rounded to float16, |values| <= 65504)
    intra_dtype: IntraDtype = IntraDtype.fp32
    # wall | virtual: each rank's time = its own CPU time x the scales below + the link model, computed
    # (nothing sleeps): N ranks on fewer cores, or faster machines
    clock: Clock = Clock.wall
    compute_scale: float = 1.0               # virtual only: forward/backward/step CPU time x this (1/6 => a GPU)
    codec_scale: float = 1.0                 # virtual only: compress/decompress/PCA CPU time x this
                                             # (lower => cheaper codecs)
    exclusive: bool = True                   # virtual only: one timed phase per core at a time
                                             # (no co-runner contention)
    # virtual, aggregator.overlap=true: the communication thread's CPU on the rank's one core (shared: it
    # delays backward) or a core of its own (own: only waits couple them; faster)
    comm_core: CommCore = CommCore.shared


# -- aggregators ---------------------------------------------------------------------------------------


@dataclass
class _Overlap:
    """Every ring aggregator's two overlap knobs: the run's, not its constructor's (gvq.hooks.builder.
    aggregator_from takes them out of the node, then decides whether to wrap it in DDP + the gvq hook)."""
    overlap: bool = False
    bucket_cap_mb: Optional[float] = None


#: an aggregator node's keys that choose how the run drives it, not how it is built (torch DDP's options
#: take bucket_cap_mb themselves)
WRAPPING_KEYS = tuple(f.name for f in fields(_Overlap))


@dataclass
class _Compressed(_Overlap):
    _target_: str = "gvq.aggregators.compressed.CompressedAggregator"
    topology: Topology = Topology.ring
    hop: Hop = Hop.auto
    ef_decay: float = 1.0                 # error feedback's (ErrorFeedbackAggregator); refused without it
    ef_units: EFUnits = EFUnits.gradient


def _compressed(schema: type, base: type = _Compressed) -> type:
    """A CompressedAggregator (or ``base``'s aggregator) schema whose ``compressor`` node is ``schema``."""
    cls = dataclass(type(f"{base.__name__.strip('_')}{schema.__name__}", (base,), {
        "__annotations__": {"compressor": schema}, "compressor": field(default_factory=schema),
        "__module__": __name__}))
    globals()[cls.__name__] = cls       # importable by name: a pickled config finds its class
    return cls


@dataclass
class _ErrorFeedback(_Compressed):      # the biased codecs (1-bit, top-k): error feedback on, by allgather (their
                                        # scales or indices differ per rank: not additive)
    _target_: str = "gvq.aggregators.error_feedback.ErrorFeedbackAggregator"
    topology: Topology = Topology.allgather


@dataclass
class _Signum(_Compressed):
    _target_: str = "gvq.aggregators.signum.SignumAggregator"
    beta: float = 0.9


@dataclass
class _DGC(_Compressed):                # momentum, masking and clipping are the aggregator's (synxlin's memory)
    _target_: str = "gvq.aggregators.dgc.DGCAggregator"
    topology: Topology = Topology.allgather
    momentum: float = 0.9
    masking: bool = True
    clip: Optional[float] = None


@dataclass
class _QgZ(_Overlap):                   # ZeRO++'s qgZ (gvq/comm/alltoall_quant.py); its compressor: QSGD's
    _target_: str = "gvq.aggregators.qgz.QgZAggregator"
    intra: QgzWire = QgzWire.compressed
    gather: QgzGather = QgzGather.compressed


@dataclass
class RingAllReduceSchema(_Overlap):
    _target_: str = "gvq.aggregators.rar.RingAllReduce"
    topology: RarTopology = RarTopology.ring


@dataclass
class DDPSchema:
    _target_: str = "gvq.aggregators.ddp.DDPAggregator"
    hook: Hook = Hook.allreduce
    rank: int = 2
    start_iter: int = 10
    min_compression_rate: float = 2.0
    bucket_cap_mb: Optional[float] = None


@dataclass
class PowerSGDSchema(_Overlap):
    _target_: str = "gvq.aggregators.powersgd.PowerSGDAggregator"
    rank: int = 2
    start_iter: int = 10
    min_compression_rate: float = 2.0
    warm_start: bool = True
    kernels: Kernels = Kernels.auto       # the packing and residual steps between its GEMMs
    topology: RarTopology = RarTopology.ring


@dataclass
class GradiVeQAggregatorSchema(_Overlap):
    _target_: str = "gvq.aggregators.gradiveq.GradiVeQAggregator"
    compressor: GradiVeQSchema = field(default_factory=GradiVeQSchema)
    L_t: int = 100
    L_c: int = 400
    warmup: int = 0
    sampling: Sampling = Sampling.qsgd
    qsgd_bits: int = 4
    qsgd_bucket: Optional[int] = 2048
    qsgd_norm: Norm = Norm.max
    monitor_threshold: Optional[float] = None
    pieces: int = 4
    warmup_by: Sampling = Sampling.rar
    samples_in_warmup: bool = False
    error_feedback: bool = False
    topology: RarTopology = RarTopology.ring


# -- optimizers ----------------------------------------------------------------------------------------

Schedule = Choice("Schedule", "cosine step constant", module=__name__)


@dataclass
class _Schedule:
    """The learning-rate schedule and clipping every optimizer option shares: the run's keys
    (gvq.run.train.lr_lambda, step), not its builder's."""
    schedule: Schedule = Schedule.cosine
    milestones: List[float] = field(default_factory=lambda: [0.5, 0.75])
    gamma: float = 0.1
    warmup_iters: int = 0
    clip_norm: Optional[float] = None


#: an optimizer node's keys the run reads (schedule, clipping); the rest are its builder's arguments
SCHEDULE_KEYS = tuple(f.name for f in fields(_Schedule))


@dataclass
class SGDSchema(_Schedule):
    _target_: str = "gvq.run.optim.sgd"
    warmup_iters: int = 50         # the CNNs' first gradients are their largest (docs/results.md, "Defaults on
                                   # CIFAR-format data"): a full lr on them can kill the net
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    nesterov: bool = False


@dataclass
class AdamWSchema(_Schedule):
    _target_: str = "gvq.run.optim.adamw"
    lr: float = 1e-3
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1


# -- models and data sets ------------------------------------------------------------------------------


@dataclass
class DigitsCNNSchema:
    _target_: str = "gvq.models.DigitsCNN"
    width: int = 16


@dataclass
class ResNetSchema:
    _target_: str = "gvq.models.resnet20"      # resnet20 | resnet32 | resnet56 | resnet110: no knobs


@dataclass
class GPTSchema:
    _target_: str = "gvq.models.GPT"
    layers: int = 4
    heads: int = 4
    width: int = 128
    context: int = 64


@dataclass
class DigitsSchema:
    _target_: str = "gvq.data.digits"
    test_fraction: float = 0.2
    seed: int = 0
    split: LabelSplit = LabelSplit.pooled


@dataclass
class CifarSchema:
    _target_: str = "gvq.data.cifar10"         # cifar10 | cifar100
    root: str = "data"
    download: bool = False
    split: LabelSplit = LabelSplit.pooled


@dataclass
class FashionMNISTSchema:
    _target_: str = "gvq.data.fashion_mnist"
    root: Optional[str] = None
    n_train: Optional[int] = None
    seed: int = 0
    n_test: Optional[int] = None
    split: LabelSplit = LabelSplit.pooled


@dataclass
class SyntheticSchema:
    _target_: str = "gvq.data.synthetic"
    num_classes: int = 100
    n_train: int = 2048
    n_test: int = 512
    image_size: int = 32
    channels: int = 3
    seed: int = 0
    split: LabelSplit = LabelSplit.pooled


@dataclass
class _TextWindows:
    """What every text data set takes: its window length, the held-out windows scored, its tokens."""
    context: int = 64
    n_test: Optional[int] = 256
    tokenizer: Tokenizer = Tokenizer.bytes
    vocab_size: int = 1024      # bpe only


@dataclass
class AustenSchema(_TextWindows):
    _target_: str = "gvq.data.austen"
    root: Optional[str] = None
    split: SourceSplit = SourceSplit.pooled


@dataclass
class TextFileSchema(_TextWindows):
    _target_: str = "gvq.data.text_file"
    path: str = "???"
    test_fraction: float = 0.1
    split: OneSource = OneSource.pooled


#: (group, schema name) -> dataclass; an option file names one as ``/schema/<group>/<name>@_here_``
OPTION_SCHEMAS: dict[tuple[str, str], type] = {
    ("aggregator", "rar"): RingAllReduceSchema,
    ("aggregator", "fp16"): _compressed(FP16Schema),
    ("aggregator", "qsgd"): _compressed(QSGDSchema),
    ("aggregator", "linear"): _compressed(LinearSchema),
    ("aggregator", "orq"): _compressed(ORQSchema),
    ("aggregator", "bingrad_b"): _compressed(BinGradBSchema),
    ("aggregator", "bingrad_pb"): _compressed(BinGradPBSchema),
    ("aggregator", "signsgd"): _compressed(SignSGDSchema),
    ("aggregator", "terngrad"): _compressed(TernGradSchema),
    ("aggregator", "randomk"): _compressed(RandomKSchema),
    ("aggregator", "natural"): _compressed(NaturalSchema),
    ("aggregator", "efsignsgd"): _compressed(EFSignSGDSchema, _ErrorFeedback),
    ("aggregator", "onebit"): _compressed(OneBitSchema, _ErrorFeedback),
    ("aggregator", "signum"): _compressed(SignVoteSchema, _Signum),
    ("aggregator", "topk"): _compressed(TopKSchema, _ErrorFeedback),
    ("aggregator", "topk_chunk"): _compressed(ChunkTopKSchema, _ErrorFeedback),
    ("aggregator", "dgc"): _compressed(DGCSchema, _DGC),
    ("aggregator", "qgz"): _compressed(QSGDSchema, _QgZ),
    ("aggregator", "gradiveq"): GradiVeQAggregatorSchema,
    ("aggregator", "powersgd"): PowerSGDSchema,
    ("aggregator", "ddp"): DDPSchema,
    ("model", "cnn"): DigitsCNNSchema,
    ("model", "resnet"): ResNetSchema,
    ("model", "gpt"): GPTSchema,
    ("dataset", "digits"): DigitsSchema,
    ("dataset", "cifar"): CifarSchema,
    ("dataset", "synthetic"): SyntheticSchema,
    ("dataset", "fashion_mnist"): FashionMNISTSchema,
    ("dataset", "austen"): AustenSchema,
    ("dataset", "text"): TextFileSchema,
    ("optim", "sgd"): SGDSchema,
    ("optim", "adamw"): AdamWSchema,
    ("net", "link"): NetSchema,
    **METHOD_SCHEMAS,
}

#: keyword arguments a constructor takes that no option file sets: supplied when it is built
RUNTIME_KWARGS = frozenset({"world_size", "num_classes", "in_channels", "model"})


def knobs(schema: type, **given) -> dict:
    """The keyword arguments ``schema`` gives its ``_target_``: each field's default (the one home of
    an aggregator knob's default: its constructor has none), ``given`` instead where named, less the
    run's keys (:data:`WRAPPING_KEYS`, :data:`SCHEDULE_KEYS`) and nested option nodes (a compressor is
    built apart).  ``PowerSGDAggregator(**knobs(PowerSGDSchema, rank=4))``: rank 4, every other knob at
    its schema default (an option file may set more: ``gvq.hooks.config.build_aggregator`` composes one)."""
    runs = ((WRAPPING_KEYS if issubclass(schema, _Overlap) else ())        # the run's keys, where inherited
            + (SCHEDULE_KEYS if issubclass(schema, _Schedule) else ()))
    out = {}
    for f in fields(schema):
        if f.name == "_target_" or f.name in runs:
            continue
        value = f.default_factory() if f.default is MISSING else f.default
        if not is_dataclass(value):
            out[f.name] = value.value if isinstance(value, enum.Enum) else value
    unknown = set(given) - set(out)
    if unknown:
        raise TypeError(f"{schema.__name__}: no knob {', '.join(sorted(unknown))}")
    return {**out, **given}
