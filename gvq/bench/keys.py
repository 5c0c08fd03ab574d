"""The keys of the ``python -m gvq.bench`` commands on the tool command line (``key=value``; ``--cfg`` prints
them composed), declared here once with their defaults; ``--out`` (the records as JSON) is each one's path
argument (``paper`` and ``gpucheck``: the folder their runs go to).  A grid key (``grid.settings``, ``grid.set``,
``grid.world_sizes``, ``grid.links_bps``, ``grid.compute_scales``) starts from the command's grid file,
``conf/grid/<grid>.yaml`` (``COMMANDS`` in gvq/bench/__main__.py names it)."""
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
#: GRACE's compressors gvq has (sparsifiers, sign codecs, natural compression), options of conf/aggregator/
GRACE_CODECS = ("topk", "topk_chunk", "randomk", "dgc", "natural", "efsignsgd", "onebit", "signum")
#: the codec bench's labels: every quantizer, the GradiVeQ settings the papers use (gvq.bench.codecs.GRADIVEQ),
#: PowerSGD, GRACE's
CODECS = (*QUANTIZERS, "gradiveq", "gradiveq_bf16", "gradiveq_pooled", "gradiveq_pooled_bf16", "powersgd",
          *GRACE_CODECS)


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
class TopkKeys:
    models: List[str] = field(default_factory=lambda: ["resnet32", "gpt_tiny"])   # whose gradients (conf/model/)
    num_classes: List[int] = field(default_factory=lambda: [100, 256])   # one per model (a GPT's: its vocabulary)
    ratios: List[float] = field(default_factory=lambda: [0.01, 0.001])   # r: k = max(1, floor(r * n)) per scope
    reps: int = 30                       # paired repetitions per cell (>= 2); more => tighter intervals, longer
    world_sizes: List[int] = field(default_factory=lambda: [4, 8, 64])   # N of each break-even bandwidth column


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
    input_shape: Optional[List[int]] = None   # C, H, W (null: what the model's config declares); [1,28,28]: FMNIST
    batch_size: int = 32                 # per rank
    iters: int = 12                      # timed iterations per mode (the median, its interval); more => tighter
    warmup: int = 1                      # untimed iterations first
    timeout: float = 600.0               # seconds a rank waits for a peer; raise it for many ranks on few cores


OUT = (Arg("--out", "write the records as JSON here"),)


@dataclass
class AggregateKeys:
    # conf/grid/bench.yaml (make bench's): grid.settings (options of conf/aggregator/, or allreduce: gloo's
    # own, unshaped wall clock only; their knobs go in grid.set, OPTION:KEY=VALUE for one), grid.world_sizes x
    # grid.links_bps one table each ([]: one unshaped loopback table); more => a longer run
    grid: GridSchema = field(default_factory=GridSchema)
    # the ranks' net node (net.clock, net.compute_scale, net.codec_scale, net.latency_s, ...), as a run's;
    # the links are grid.links_bps
    net: NetSchema = field(default_factory=NetSchema)
    model: str = "resnet32"              # whose gradient shapes (conf/model/)
    num_classes: int = 100
    reps: int = 20                       # timed aggregations (the median); more => steadier, longer
    warmup: int = 3                      # untimed aggregations first (GradiVeQ fits its basis before them)
    timeout: float = 120.0               # seconds a rank waits for a peer; raise it for many ranks on few cores
    rank: Optional[int] = None           # run only this rank, started elsewhere (gvq.bench netns); with init
    init: Optional[str] = None           # with rank: the rendezvous URL (file://...)


@dataclass
class Workload:
    """One timed training iteration: the model, its input, the counts (gvq.bench train, netns-train)."""
    model: str = "cnn"                   # whose forward and backward (conf/model/)
    num_classes: int = 10
    # C, H, W (null: 1 8 8 for cnn, else 3 32 32); [1,28,28]: Fashion-MNIST, so seconds match a run on it
    input_shape: Optional[List[int]] = None
    batch_size: int = 32                 # per rank
    iters: int = 30                      # timed iterations per mode (the median, its interval); more => tighter
    warmup: int = 5                      # untimed iterations first


@dataclass
class TrainKeys(Workload):
    # conf/grid/train.yaml: grid.settings (modes: conf/aggregator options, torch_ddp a bare DDP loop, local
    # no communication), grid.set (their overrides), grid.world_sizes one table each, grid.links_bps the
    # runner's aggregators' emulated link, one table each ([]: unshaped; torch DDP's is never shaped)
    grid: GridSchema = field(default_factory=GridSchema)
    net: NetSchema = field(default_factory=NetSchema)   # the ranks' clock, as a run's (links: grid.links_bps)
    compressed_only: bool = False        # true: compressed iterations only (GradiVeQ's basis fitted first)
    # cuda: model, data and codecs on the GPU (a GPU per rank over NCCL, else ranks sharing GPUs over
    # host-staged gloo; wall clock, synchronised at every reading)
    device: str = "cpu"
    timeout: float = 120.0               # seconds a rank waits for a peer; raise it for many ranks on few cores
    rank: Optional[int] = None           # run only this rank, started elsewhere (gvq.bench netns-train); with init
    init: Optional[str] = None           # with rank: the rendezvous URL (file://...)


@dataclass
class MethodCostKeys(Workload):
    # every_step's compute-only path against DiLoCo's non-sync steps, through train.step, wall clock
    every: int = 10                      # DiLoCo's H; larger => more non-sync pairs per iteration, fewer syncs
    world_size: int = 1                  # ranks; more => the loop's own collectives in both modes, more noise
    iters: int = 60                      # timed iterations per mode (pairs: its non-sync ones); more => tighter
    timeout: float = 120.0               # seconds a rank waits for a peer


@dataclass
class NetnsKeys:
    # conf/grid/netns.yaml: grid.world_sizes (its first: the ranks), grid.links_bps the tbf rates; uncompressed
    # RAR under kernel shaping against the emulator on each
    grid: GridSchema = field(default_factory=GridSchema)
    reps: int = 10                       # timed aggregations per link (the median); more => steadier, longer
    model: str = "resnet32"              # whose gradient shapes (conf/model/)


@dataclass
class NetnsNodesKeys:
    # conf/grid/netns_nodes.yaml: grid.settings and grid.set (aggregator options and their overrides, as
    # gvq.bench aggregate's: aggregator.topology=hierarchical), grid.world_sizes (its first: the ranks),
    # grid.links_bps the inter-node tbf rates per rank; each against the emulator and the virtual clock
    grid: GridSchema = field(default_factory=GridSchema)
    ranks_per_node: int = 2              # consecutive ranks a node; more => more of the traffic on intra links
    # bit/s inside a node; above 1e10 the kernel leaves it unshaped (the veth's own speed); lower => the
    # intra phases cost more
    intra_bandwidth_bps: float = 2.4e12
    reps: int = 5                        # timed aggregations per setting and link (the median); more => longer
    model: str = "resnet32"              # whose gradient shapes (conf/model/)


@dataclass
class NetnsTrainKeys(Workload):
    # conf/grid/netns_train.yaml: grid.settings (modes, as gvq.bench train's), grid.set, grid.world_sizes
    # (>= 2), grid.links_bps the tbf rates per rank
    grid: GridSchema = field(default_factory=GridSchema)
    model: str = "resnet20"
    iters: int = 20
    # tbf burst (a tc size, e.g. 64kb); auto: a millisecond of the rate; larger => burstier links
    burst: str = "auto"
    loopback: bool = True                # also time the unshaped loopback reference
    timeout: float = 600.0               # seconds per shaped run


@dataclass
class PaperKeys:
    # conf/grid/paper.yaml: grid.settings (the methods), grid.world_sizes, grid.compute_scales (1: CPU,
    # 1/6: GPU) and grid.set (more cli.py overrides for every job); each cell one cli.py run
    grid: GridSchema = field(default_factory=GridSchema)
    # bit/s per rank, each a number or auto: the link at which RAR's aggregation / compute = 850/650, the
    # paper's CPU cluster (solved from one run at N = 6)
    links: List[str] = field(default_factory=lambda: ["auto"])
    steady_iters: int = 12               # iterations of the rar / qsgd runs; more => steadier, longer
    compressed_iters: int = 10           # compressed iterations of the GradiVeQ runs (after L_t)
    force: bool = False                  # true: rerun jobs that completed before
    calibrate: bool = False              # true: only solve the 850/650 link and print it


@dataclass
class SoakKeys:
    kills: int = 4                       # attempts that lose a rank (restarts=<kills>)
    every: int = 5                       # checkpoint.every; larger => more iterations redone per kill
    iterations: int = 60
    ranks: int = 2                       # world_size
    seed: int = 0                        # which ranks die, after which rows, where
    timeout: float = 600.0               # seconds each run may take
    set: List[str] = field(default_factory=lambda: ["model.width=8"])   # more cli.py overrides


@dataclass
class GpucheckKeys:
    part: List[str] = field(default_factory=lambda: ["tests", "codecs", "cli"])   # which checks
    timeout: float = 300.0               # seconds per cli.py run and per codec run
    k: Optional[str] = None              # tests: only CUDA tests matching this pytest -k expression
    file_timeout: float = 540.0          # tests: seconds per test file's pytest run
    codecs: Optional[List[str]] = None   # codecs: labels of gvq.bench codecs (null: all of them)
    reps: int = 3                        # codecs: timed calls per codec
    aggregators: Optional[List[str]] = None   # cli: options of conf/aggregator/ (null: every one)
    world_sizes: List[int] = field(default_factory=lambda: [1, 3])   # cli: ranks per run
    # checks at a time (null: half the CPUs, at most 8); more => sooner, more contention
    jobs: Optional[int] = None

