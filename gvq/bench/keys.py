"""The keys of the ``python -m gvq.bench`` commands on the tool command line (``key=value``; ``--cfg`` prints
them composed), declared here once with their defaults; ``--out`` (the records as JSON) is each one's path
argument.  The commands still on flags are listed in gvq/bench/__main__.py's ``LEGACY``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from gvq.schema.grid import GridSchema
from gvq.schema.options import Clock, NetSchema
from gvq.schema.tool import Arg

#: a ResNet-32 (100 classes) gradient's size: the quantizer bench's default vector
RESNET32_PARAMS = 470_004
#: every scalar quantizer (and fp16): the quantizer and codec benches' default options
QUANTIZERS = ("qsgd", "terngrad", "signsgd", "linear", "orq", "bingrad_pb", "bingrad_b", "fp16")
#: the codec bench's labels: every quantizer, the GradiVeQ settings the papers use (gvq.bench.codecs.GRADIVEQ), PowerSGD
CODECS = (*QUANTIZERS, "gradiveq", "gradiveq_bf16", "gradiveq_pooled", "gradiveq_pooled_bf16", "powersgd")


@dataclass
class StartupKeys:
    world_size: int = 2                  # ranks of the 1-iteration run
    loggers: List[str] = field(default_factory=lambda: ["csv", "wandb"])      # csv, wandb
    start: List[str] = field(default_factory=lambda: ["forkserver", "spawn"])  # how ranks start (GVQ_START_METHOD)
    reps: int = 3                        # runs per setting (medians reported); more => steadier, longer


@dataclass
class QuantizersKeys:
    aggregators: List[str] = field(default_factory=lambda: list(QUANTIZERS))   # conf/aggregator options
    numel: int = RESNET32_PARAMS         # values per vector; larger => bandwidth-bound, smaller => launch-bound
    reps: int = 20                       # calls per codec (the median); more => steadier, longer
    set: List[str] = field(default_factory=list)      # overrides, e.g. [aggregator.compressor.bucket=512]


@dataclass
class CodecsKeys:
    codecs: List[str] = field(default_factory=lambda: list(CODECS))    # labels of gvq.bench.codecs
    model: str = "resnet32"              # whose gradient shapes (conf/model/)
    num_classes: int = 100
    device: Optional[str] = None         # cpu or cuda; default: cuda where there is one
    reps: int = 10                       # calls per codec (the median); more => steadier, longer


@dataclass
class ClockKeys:
    model: str = "resnet32"
    reps: int = 10                       # aggregations per cell; more => steadier, longer
    iters: int = 6                       # training iterations per cell; more => steadier, longer
    grid: GridSchema = field(default_factory=GridSchema)   # conf/grid/clock.yaml: grid.links_bps the links


@dataclass
class OverlapKeys:
    # conf/grid/overlap.yaml: grid.settings (OPTION or OPTION:KEY=VALUE, keys under aggregator.; one mode
    # per variant each), grid.set (what they start from, a setting's own key replacing it), grid.world_sizes,
    # grid.links_bps, grid.compute_scales (1: CPU; 1/6: GPU); more of any => a longer run
    grid: GridSchema = field(default_factory=GridSchema)
    # the run's net node: virtual time; net.codec_scale, net.exclusive, net.comm_core yours to set (the
    # bench sets net.clock, net.compute_scale from the grid, and the links)
    net: NetSchema = field(default_factory=lambda: NetSchema(clock=Clock.virtual))
    bucket_mb: float = 0.25              # the smaller DDP bucket, MB (variant small); smaller => more messages
    # post-backward, overlapped at DDP's buckets, overlapped at bucket_mb; fewer => faster
    variants: List[str] = field(default_factory=lambda: ["post", "overlap", "small"])
    wall: bool = False                   # true: instead, overlapped RAR vs torch DDP, wall clock, loopback
    model: str = "resnet32"              # whose forward and backward (conf/model/)
    num_classes: int = 10
    input_shape: Optional[List[int]] = None   # C, H, W (null: 1 8 8 for cnn, else 3 32 32); [1,28,28]: Fashion-MNIST
    batch_size: int = 32                 # per rank
    iters: int = 12                      # timed iterations per mode (the median, its interval); more => tighter
    warmup: int = 1                      # untimed iterations first
    timeout: float = 600.0               # seconds a rank waits for a peer; raise it for many ranks on few cores


OUT = (Arg("--out", "write the records as JSON here"),)

