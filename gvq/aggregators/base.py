"""The aggregator contract: what the training loop, the benchmarks and the tools call to turn per-rank
gradients into their mean.

See docs/design.md#gvqaggregatorsbasepy for how it works and why.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from gvq.comm.links import Cluster
from gvq.comm.ring import Ring
from gvq.compressors._segments import balanced_segments
from gvq.compressors.base import Compressor
from gvq.compressors.base import check_int  # noqa: F401 (the one integer-argument check; re-exported)


def check_bucket_cap(value) -> float | None:
    """``aggregator.bucket_cap_mb`` (torch DDP's and the gvq hook's bucket size, MiB): > 0, or None for
    DDP's defaults (its small first bucket included; torch drops it when a size is passed)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"aggregator.bucket_cap_mb={value!r}: must be > 0 (or unset)")
    return float(value)


@dataclass
class Bucket:
    """One vector an aggregator averages (:meth:`FlatAggregator.average`): one DDP bucket, or
    post-backward the whole gradient, with its parameters' share of the per-parameter state."""
    flat: torch.Tensor                 # this rank's gradients of ``params``, concatenated; becomes their mean
    params: tuple[int, ...]            # positions in the aggregator's ``params``, in ``flat``'s order
    iteration: int
    state: dict[str, torch.Tensor]     # ``per_parameter()``'s shares, laid out as ``flat``
    notes: dict = field(default_factory=dict)   # what :meth:`measure` leaves for :meth:`measure_after`


@dataclass
class RunContext:
    """What an aggregator needs to know about the run it is bound to."""
    rank: int
    world_size: int
    seed: int = 0
    timeout_s: float | None = None   # how long a peer is waited for; None: the process group's timeout
    bandwidth_bps: float | None = None
    latency_s: float = 0.0
    run_dir: str | None = None     # where rank 0 may write aggregator-specific files (None: nowhere)
    #: the run's ``aggregate_error`` knob: a ring aggregator also all-reduces each raw vector exactly (untimed,
    #: uncounted) to log its mean's error against the exact mean; off: no extra collective, the column NaN
    aggregate_error: bool = False
    #: the learning rate of the step being taken, read when an iteration opens (the run's optimizer's; step-unit
    #: error feedback needs it, ``aggregator.ef_units=step``); None: not known (a tool, a hook's own script)
    lr: Callable[[], float] | None = None
    #: where the ranks sit (net.ranks_per_node and the links inside a node); the default: the flat net
    cluster: Cluster = Cluster()
    #: the process group of the ranks its ring runs among, ``rank`` and ``world_size`` being this rank's
    #: position in it and its size (``method.workers=node``: the nodes' ring at one local index); None: the
    #: default group, every rank
    group: object | None = None
    #: false: the codecs' compression-error column is not measured (NaN; its whole-vector round trip skipped):
    #: ``gvq.bench aggregate`` times aggregation alone, and in virtual time on a shared host the round trip's
    #: spread across ranks (each timed with co-runners) is waited out inside the ring after it
    compression_error: bool = True


def refuse_optimizer_momentum(option: str, cfg: dict) -> None:
    """For an aggregator that keeps a momentum of its own (DGC, Signum): a one-line ``ValueError`` if the
    run's optimizer adds a second (SGD's momentum or Nesterov; AdamW has neither key and passes)."""
    o = cfg["optim"]
    if o.get("momentum", 0) != 0 or o.get("nesterov", False):
        raise ValueError(f"aggregator={option} keeps the momentum itself (aggregator.momentum / beta): needs "
                         f"optim.momentum=0 optim.nesterov=false, not optim.momentum={o.get('momentum')}")


class Aggregator:
    """The one contract every aggregator satisfies (``conf/aggregator/*`` all do, torch DDP's included).

    Subclasses implement :meth:`setup` and :meth:`aggregate`; every other member has a default that is
    right for an aggregator without that feature.  Call order: ``preflight`` (launcher, before ranks
    start; optional), ``setup``, ``wrap``, then per iteration ``aggregate``; ``state_dict`` /
    ``load_state_dict`` around checkpoints (after ``wrap``); ``summary`` and ``close`` at the end.
    Whether it runs inside backward instead is not its business: :func:`gvq.hooks.builder.aggregator_from`
    decides, and wraps it.
    """

    #: short label for logs, reports and a checkpoint's identity
    name: str = "aggregator"
    #: extra per-iteration CSV columns :meth:`aggregate` reports (values: rank 0's)
    extra_fields: tuple[str, ...] = ()
    #: all its traffic goes through gvq's P2P, so ``net.clock=virtual`` can time it (torch DDP's cannot)
    virtual_time: bool = False
    #: it averages during backward (torch DDP): :meth:`wrap` returns the model to train, whose gradients
    #: are the mean once backward returns, so the loop checks them once (before :meth:`aggregate`)
    inside_backward: bool = False
    #: after :meth:`setup`, the one flat buffer every ``param.grad`` is a view of (the guards check it
    #: with one reduction); None where gradients live elsewhere (torch DDP: one check per parameter)
    bucket: torch.Tensor | None = None
    #: inside backward only, set by each :meth:`aggregate`: the part of its ``aggregate_s`` this rank's
    #: clock already counted in the compute phase (under the wall clock backward itself waits for the
    #: last bucket), which the training loop takes out of ``compute_s``, so the two never count it twice
    inside_compute_s: float = 0.0
    #: the codec, for aggregators built around one (the benchmarks time it alone); None: none
    compressor: Compressor | None = None
    #: a bucket's rings run a codec of its own whose cost per value differs from the whole gradient's
    #: (GradiVeQ: bases restricted to the bucket's layers), so the cost model times each bucket's; False:
    #: every bucket runs the whole codec, whose cost curves hold
    bucket_codecs: bool = False
    #: it can average any one DDP gradient bucket (:meth:`FlatAggregator.average_bucket_`, per-parameter
    #: state included), so :mod:`gvq.hooks` can run it inside backward; False: torch DDP's own options
    #: (they overlap by themselves).  The one declaration of that capability
    any_bucket: bool = False
    #: its state is fitted from the whole model's vector each iteration it samples (GradiVeQ's PCA bases,
    #: refit on a schedule of iterations), so a vector holding only some parameters in an iteration
    #: (Streaming DiLoCo's fragments) leaves the other layers' fit without samples; False: any part
    fits_whole_vectors: bool = False

    # -- life cycle ----------------------------------------------------------------------------------
    def preflight(self, params: list[torch.nn.Parameter]) -> None:
        """Checks that need the model's shapes, run by the launcher before any rank starts: raise a
        one-line ``ValueError`` (GradiVeQ: K against every conv layer).  Default: nothing to check."""

    @classmethod
    def check_run(cls, cfg: dict) -> None:
        """Raise a one-line ``ValueError`` if the rest of the run (``cfg``: the composed run config as a
        dict; its ``optim`` ...) cannot serve this aggregator (DGC keeps the momentum itself, so the
        optimizer must have none).  Config validation calls it before any rank starts, as it calls
        ``Method.check_run``.  Default: any run."""

    def setup(self, params: list[torch.nn.Parameter], ctx: RunContext) -> None:
        """Bind to this rank's parameters and the run (called once, after construction)."""
        raise NotImplementedError

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model the loop trains, called once after :meth:`setup`: the model itself, unless the
        aggregator lives inside backward (``inside_backward``: torch DDP wraps it)."""
        return model

    def aggregate(self, iteration: int) -> dict:
        """Replace every ``param.grad`` by the mean over ranks; return the iteration's measurements.

        ``aggregate_s`` has one meaning for every aggregator and clock: what this rank waited, after its
        backward produced the last gradient, until every gradient was averaged.  An aggregator
        ``inside_backward`` also sets :attr:`inside_compute_s`."""
        raise NotImplementedError

    def average_vector(self, flat: torch.Tensor, iteration: int, params: tuple[int, ...] | None = None) -> dict:
        """Replace ``flat``, a vector laid out as the flat gradient of the parameters at positions
        ``params`` (in that order; None: every parameter), by its mean over ranks in one iteration frame;
        return its measurements (``aggregate_s``, ``bytes_sent`` ...).  What a method sends that is not
        this step's gradient goes through here (DiLoCo's pseudo-gradient, local SGD's parameters,
        Streaming DiLoCo's one fragment), with the aggregator's own per-parameter state (error feedback's
        memory: only those parameters' share).  Default: refused in one line (torch DDP averages inside
        its own hooks only); every aggregator with :attr:`any_bucket` has it."""
        raise ValueError(f"aggregator={self.name} cannot average an arbitrary vector (torch DDP averages "
                         "only its own gradient buckets): pick a ring aggregator (rar, fp16, qsgd ...)")

    def close(self) -> None:
        """Release the transport (threads, links).  Default: nothing held."""

    # -- measurements ----------------------------------------------------------------------------------
    @property
    def max_abs(self) -> float:
        """The largest magnitude the wire carries (its compressor's; fp16: 65504): the guards refuse an
        iteration where world_size x max|g| exceeds it, before a partial sum can overflow mid-ring."""
        return math.inf if self.compressor is None else self.compressor.max_abs

    def measure(self, bucket: Bucket) -> dict:
        """Untimed measurements on this rank's own gradient ``bucket.flat``, before it is summed (e.g. the
        compression error); every rank pays them, so none waits for rank 0.  Default: none."""
        return {}

    def measure_after(self, bucket: Bucket) -> dict:
        """Untimed measurements once ``bucket.flat`` holds the mean, from what the sum left behind
        (PowerSGD's and error feedback's compression error).  Default: none."""
        return {}

    def rings(self, params: tuple[int, ...], n: int) -> list[Ring] | None:
        """The rings :meth:`FlatAggregator.average` runs, in order, on a vector of ``params`` (positions,
        in the vector's order) at ``n`` ranks in its present phase: what :mod:`gvq.predict` prices.
        None: none declared (torch DDP's own collectives), and the cost model refuses to price it."""
        return None

    def extra_passes(self) -> int:
        """Whole-vector passes its :meth:`FlatAggregator.average` makes outside its :meth:`rings`, in its
        present phase, each about one vector add (PowerSGD: M = g + e, two copies, e -= the mean):
        :mod:`gvq.predict` prices them beside the rings.  Default: none."""
        return 0

    def summary(self) -> dict:
        """Run-level figures for ``summary.json``'s ``aggregator`` (GradiVeQ: refreshes, relays).
        Default: none (the key is left out)."""
        return {}

    # -- checkpoints ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What a checkpoint must keep for a bitwise resume (tensors, numbers, strings).  Default:
        nothing (a stateless aggregator)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output (after :meth:`setup` and :meth:`wrap`)."""

    # -- tools (gvq.bench, gvq.predict) --------------------------------------------------------------
    def codec_session(self, flat: torch.Tensor, params=None) -> contextlib.AbstractContextManager:
        """A context around one iteration's codec calls on this rank's vector ``flat`` of ``params``
        (None: every parameter), for codecs that keep state between calls (PowerSGD: a fresh iteration of
        its P / Q state; GradiVeQ: its Eq. 7 loss tracking on the vector's codec).  The aggregator runs
        its own rings inside it; tools that replay its codec calls (``gvq.predict calibrate``,
        ``calibrate-overlap``) do the same.  Default: nothing to set up."""
        return contextlib.nullcontext()

    def prepare_benchmark(self, grads: list[torch.Tensor], args=None) -> None:
        """Pin the steady (compressed) state before a benchmark times :meth:`aggregate` (GradiVeQ: fit
        a basis; PowerSGD: no uncompressed start).  Called after :meth:`setup`.  Default: nothing."""

    def benchmark_warmup(self) -> int:
        """Iterations a benchmark must run before timing, for state :meth:`prepare_benchmark` cannot
        pin (torch's PowerSGD hook counts its own iterations).  Default: 0."""
        return 0


@functools.lru_cache(maxsize=64)
def equal_segments(numel: int, n: int) -> list[slice]:
    """``n`` contiguous segments of sizes differing by at most one (empty when numel < n); cached: the
    ring asks for the same split every iteration."""
    return balanced_segments(numel, n)
