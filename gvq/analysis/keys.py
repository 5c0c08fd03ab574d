"""The keys of every ``python -m gvq.analysis`` command (``key=value`` on its command line; ``--cfg`` prints
them composed), declared here once with their defaults; ``--out`` (where the files go) is each command's
path argument.  The analyses record their gradients from a short single-worker run (gvq.analysis.record)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from gvq.schema.tool import Arg


@dataclass
class QuantizersKeys:
    model: str = "cnn"                   # conf/model name
    dataset: str = "digits"              # conf/dataset name
    iterations: int = 200                # gradients recorded; more => steadier means, longer
    every: int = 10                      # keep every n-th gradient; lower => more (and more alike) gradients
    bucket: int = 2048                   # quantizer bucket size; larger => coarser scales, more error


@dataclass
class CorrelationKeys:
    iterations: int = 150                # recorded iterations (the paper's: 150); at least 3
    model: str = "cnn"                   # cnn | resnet20 (trained on digits)
    layer: int = 0                       # conv layer (0 = first) for both figures
    lam: float = 0.01                    # Eq. 6 lambda for Fig. 5's d; higher => smaller d
    batch: int = 128                     # batch (stands for the aggregate of N ranks); larger => less noisy gradients
    seed: int = 0                        # the recording run's seed (weights, batches)


@dataclass
class _Recorded:
    """The recording and GradiVeQ schedule the peer comparisons share (conf/experiment/digits_gradiveq.yaml's)."""
    model: str = "cnn"                   # conf/model name (cnn, resnet20, resnet32, ...); the ResNets take minutes
    # conf/dataset name; digits = real data (the honest default); synthetic = gaussian class means
    # (CIFAR-shaped, unrealistic gradient statistics)
    dataset: str = "digits"
    L_t: int = 50                        # fitting gradients per cycle; more => a basis fitted on more, older gradients
    L_c: int = 80                        # evaluation gradients per cycle; more => later ones, further from the fit
    warmup: int = 50                     # first iterations skipped; more => the fast-changing start left out
    iterations: int = 400                # recorded: cycles of L_t + L_c after warmup
    samples: str = "exact"               # GradiVeQ's fitting samples: exact, or qsgd (one 4-bit encode, the paper's)
    batch: int = 128                     # batch (stands for N=4 ranks x 32); larger => less noisy gradients
    lr: float = 0.05                     # the recording run's SGD step; larger => gradients change faster
    tolerance: float = 0.03              # relative byte gap counted as matched; larger => looser matches
    min_compression_rate: float = 2.0    # GradiVeQ's rate floor; higher => fewer layers compressed
    seed: int = 0                        # the recording run's seed (weights, batches)


@dataclass
class PeersKeys(_Recorded):
    rank: List[int] = field(default_factory=lambda: [2, 4])          # PowerSGD ranks
    K: List[str] = field(default_factory=lambda: ["auto", "x1"])      # GradiVeQ slice sizes to try
    # GradiVeQ knob(s) bisected to match PowerSGD's bytes (lambda: Eq. 6 per layer; target_ratio: the
    # same K/d in every layer)
    match: List[str] = field(default_factory=lambda: ["lambda"])
    # GradiVeQ pool, each tried (true or on: fit on all slices of a layer, d may exceed L_t - 1)
    pool: List[bool] = field(default_factory=lambda: [False, True])


@dataclass
class FrontierKeys(_Recorded):
    K: Optional[List[str]] = None        # GradiVeQ slice sizes (x<m>, auto, ints); default x1..x<H*W>
    ratios: List[float] = field(default_factory=lambda: [4.0, 8.0, 16.0])   # whole-vector byte ratios
    rank: List[int] = field(default_factory=lambda: [1, 2, 4, 8])           # PowerSGD ranks
    pool: List[bool] = field(default_factory=lambda: [True])                # GradiVeQ pool, each tried
    reps: int = 7                        # timed calls per codec (their median); more => steadier, longer
    recommend_at: float = 8.0            # the byte ratio of the recommendation line


@dataclass
class DitherKeys:
    quantizers: Optional[List[str]] = None   # gvq.analysis.dither.CONFIGS' names; default: every one
    sizes: List[int] = field(default_factory=lambda: [2048, 100_000])     # gradient sizes drawn
    calls: int = 2000                    # consecutive calls; more => a finer test, longer
    block: int = 100                     # calls per block of the block test; larger => fewer, longer blocks


@dataclass
class TraceKeys:
    model: str = "cnn"                   # conf/model name
    dataset: str = "fashion_mnist"       # conf/dataset name
    warmup: int = 100                    # iterations before the fit; more => a fit on smaller, later gradients
    L_t: int = 100                       # fitting gradients; more => a basis (and mean) over a longer window
    L_c: int = 400                       # compressed iterations traced after the fit; more => a longer trace
    lam: float = 0.01                    # Eq. 6 lambda; higher => smaller d
    batch: int = 64                      # the recording run's batch; larger => less noisy gradients
    lr: float = 0.05                     # the recording run's SGD step; larger => gradients shrink sooner
    seed: int = 0                        # the recording run's seed (weights, batches)


def out(default: str | None, what: str = "output folder") -> tuple[Arg]:
    return (Arg("--out", f"{what} (default: {default})", default=default),)

