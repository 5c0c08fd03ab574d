"""The keys of every ``python -m gvq.predict`` command (``key=value`` on its command line, ``--cfg`` prints
them composed), declared here once with their defaults, and the path arguments each command takes; the
commands themselves (gvq/predict/__main__.py's table) import their modules on use."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import List, Optional

from gvq.predict.codec_costs import CODEC_COSTS, CodecCostKeys
from gvq.predict.nccl import BASELINE_CODEC_COSTS, Baseline
from gvq.schema.compose import load_grid
from gvq.schema.tool import Arg

ROOT_DIR = Path("runs/predict")          # calibrate writes <ROOT_DIR>/<model>/


@dataclass
class NodeKeys:
    """The two-level shape of every command that prices a net: nodes of ``ranks_per_node`` ranks on their
    own link, ``bandwidth`` / ``latency`` the links between nodes (gvq/comm/links.py Cluster); rings priced
    as ``aggregator.topology=hierarchical`` runs them where a node holds more than one rank."""
    # consecutive ranks a node (must divide N); 1: the flat ring at one link; more => more of the bytes inside nodes
    ranks_per_node: int = 1
    intra_bandwidth: float = 2.4e12      # bit/s inside a node (NVLink-class); lower => intra phases cost more
    intra_latency: float = 0.0           # seconds per message inside a node; higher => intra phases cost more


@dataclass
class PostingKeys:
    """Whether a projection pays this host's CPU for every message posted (:mod:`gvq.predict.pricing`)."""
    # false: messages post for free (a NIC or NCCL posts them; Table 4's simulator has no such cost), so only
    # the link, codecs and compute remain; true: the calibration's CPU a message, which at large N floors a ring
    posting: bool = True


def cluster_of(args):
    """The :class:`gvq.comm.links.Cluster` of a command's :class:`NodeKeys`."""
    from gvq.comm.links import Cluster
    return Cluster(args.ranks_per_node, args.intra_bandwidth, args.intra_latency)


@dataclass
class TableKeys(CodecCostKeys, NodeKeys):
    model: str = "resnet32"              # reads runs/predict/<model>/ (calibrate model=<model> writes it)
    world_size: List[int] = field(default_factory=lambda: [2, 4, 8, 16])   # ranks N, a row each
    bandwidth: List[float] = field(default_factory=lambda: [5e7, 2e8, 1e9])   # links, bit/s per rank
    latency: float = 0.0                 # alpha: seconds per message on the link; higher => latency-bound rows
    # forward/backward CPU time x this, per row (1/6: the GradiVeQ paper's GPUs); lower => aggregation weighs more
    compute_scale: List[float] = field(default_factory=lambda: [1.0])
    codec_scale: float = 1.0             # codec CPU time x this; higher => codec-bound rows
    aggregators: Optional[List[str]] = None   # default: every calibrated one


@dataclass
class ValidateKeys(TableKeys):
    reps: int = 6                        # aggregation repetitions per cell; more => steadier, longer
    iters: int = 4                       # timed iterations per cell; more => steadier, longer


class Phases(Enum):
    bench = "bench"                      # the benchmark's own compute-alone mode, measured beside every mode
    calibration = "calibration"


class MessageCost(Enum):
    host = "host"                        # what N ranks sharing this host's cores pay (calibrate-overlap host_ranks)
    calibration = "calibration"          # the calibration's: a rank a core


class CommCore(Enum):
    shared = "shared"
    own = "own"


@dataclass
class ValidateOverlapKeys(TableKeys):
    overlap_phases: Phases = Phases.bench         # where the compute phases come from
    overlap_msg: MessageCost = MessageCost.host   # what a message posted costs
    comm_core: CommCore = CommCore.shared         # net.comm_core the benchmark ran with (gvq.bench: shared)


class Cache(Enum):
    cold = "cold"        # codec calls timed after flushing the caches (as after the ring's waits; a busy host)
    warm = "warm"        # back to back (a rank alone on its machine); lower codec costs


@dataclass
class CalibrateKeys:
    model: str = "resnet32"
    batch_size: int = 32
    num_classes: int = 100
    cache: Cache = Cache.cold
    # options or settings OPTION:KEY=VALUE[,KEY=VALUE] (keys under aggregator.), each priced under its name
    # (qsgd:compressor.bits=2 as 'qsgd bits=2'); default: conf/grid/calibration.yaml's; more => longer
    aggregators: List[str] = field(default_factory=lambda: load_grid("calibration").settings)
    # one input's shape [C,H,W] (default: [1,8,8] for cnn, [3,32,32] otherwise); e.g. [1,28,28] for
    # Fashion-MNIST, so compute and the backward profile are a run's on it
    input_shape: Optional[List[int]] = None


@dataclass
class CalibrateOverlapKeys:
    model: str = "resnet32"              # calibrated under runs/predict/<model> (calibrate first)
    # bucket sizes (MB) besides DDP's default, as gvq.bench overlap's bucket_mb
    bucket_mb: List[float] = field(default_factory=lambda: [0.25])
    # world sizes whose per-message cost on this host (ranks sharing its cores) validate-overlap needs:
    # those of the benchmarks validated, e.g. [4,8,16,32]; more => longer
    host_ranks: List[int] = field(default_factory=list)
    # host_ranks timed on flat rings (1) and on the hierarchical rings of nodes of each R listed (validate
    # ranks_per_node=R reads them), e.g. [1,2,4,8]; more => longer
    host_ranks_per_node: List[int] = field(default_factory=lambda: [1])


@dataclass
class RingsKeys:
    model: str = "resnet32"              # reads runs/predict/<model>/


@dataclass
class ProjectKeys(CodecCostKeys, NodeKeys, PostingKeys):
    models: List[str] = field(default_factory=lambda: ["resnet32"])   # each calibrated under --calibration/<model>
    max_world_size: int = 1024           # the largest N projected; higher => more cells
    # post-backward and overlapped modes (N >= 8, 50 Mbit/s..100 Gbit/s, compute x1 and x1/6) against
    # overlapped fp16; needs calibrate-overlap; with ranks_per_node > 1 every setting post-backward only
    # (the overlapped model prices flat rings), N = ranks_per_node x 2.. nodes
    overlap: bool = False
    # overlap: also rank by time to accuracy, e.g. [rar=120,fp16=113,'qsgd bits=2=140'] (the frontier's mean
    # iterations per calibrated name, a setting's as the report names it; the others are left out of it)
    iterations_to_target: List[str] = field(default_factory=list)
    aggregators: Optional[List[str]] = None   # default: every calibrated one
    # overlap: what prices overlapped fp16 (and ddp) in the GPU regime (gvq.predict.nccl.BASELINES)
    baseline: Baseline = Baseline.nccl
    # methods, each as the report names it ('diloco every=100'; knobs from conf/method/): beside every_step
    # also projection_methods.csv, every aggregator under each; larger every => fewer syncs per iteration
    methods: List[str] = field(default_factory=lambda: ["every_step"])


@dataclass
class UtilizationKeys(CodecCostKeys, NodeKeys, PostingKeys):
    model: str = "resnet32"              # reads runs/predict/<model>/ (calibrate model=<model> writes it)
    world_size: int = 64                 # ranks N; more => a longer ring (2(N-1)/N of the bytes each way)
    # compute utilizations (compute / iteration) to solve the link for; nearer 1 => faster links needed
    utilization: List[float] = field(default_factory=lambda: [0.5, 0.8, 0.95])
    # forward/backward CPU time x this (1: the calibrated step times); lower => faster links needed
    compute_scale: List[float] = field(default_factory=lambda: [1.0])
    latency: float = 0.0                 # alpha: seconds per message; higher => some targets out of reach
    codec_scale: float = 1.0             # codec CPU time x this; higher => some targets out of reach
    aggregators: List[str] = field(default_factory=lambda: ["rar"])   # calibrated names, each under every method
    # methods as the report names them (knobs from conf/method/; e.g. 'streaming_diloco every=100 fragments=8
    # delay=1' where that option exists); data-parallel is every_step, and ddp / fp16 overlapped on NCCL where
    # the calibration has overlap.json
    methods: List[str] = field(default_factory=lambda: ["every_step", "diloco every=100",
                                                        "streaming_diloco every=100 fragments=8 delay=1"])


CALIBRATION = Arg("--calibration", "calibrate's output folder, if not runs/predict/<model>")
PROJECT_PATHS = (Arg("--calibration", "a folder of calibrations, one per model (<DIR>/<model>), or the folder "
                     "`calibrate --out` wrote", default=str(ROOT_DIR)),
                 Arg("--out", "where the heatmaps and CSVs go", default=str(ROOT_DIR)),
                 Arg("--frontier", "overlap: rank by time to accuracy from `python -m gvq.report frontier "
                     "RUNS`'s frontier.csv (iterations_to_target entries replace its figures)"),
                 CODEC_COSTS, BASELINE_CODEC_COSTS)
