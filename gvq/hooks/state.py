"""The hook's state object and the hook function, in the shape of torch's ``PowerSGDState`` +
``powerSGD_hook``: ``ddp.register_comm_hook(GvqHookState(aggregator), gvq_hook)``.

The state owns one set-up gvq ring aggregator (``conf/aggregator/`` options that sum through gvq's P2P)
and a per-rank :class:`gvq.hooks.thread.CommThread`.  Per iteration, on that thread, in DDP's bucket
order, in the aggregator's iteration frame (the one post-backward aggregation runs in):
``begin_iteration(it)`` before the first bucket, ``average_bucket_(flat, params, it)`` per bucket
(per-parameter state, so DDP's bucket rebuild after the first iteration loses nothing),
``end_iteration(it)`` after the last.

No ``from __future__ import annotations`` here: DDP checks the hook's annotations as objects
(``dist.GradBucket``, ``torch.futures.Future[torch.Tensor]``).
"""
import logging
import threading

import torch
import torch.distributed as dist

from gvq.aggregators.base import RunContext
from gvq.aggregators.flat import FlatAggregator
from gvq.comm import clock
from gvq.comm.errors import RankError
from gvq.comm.p2p import peer_timeout_s
from gvq.hooks.group import check_registered, connect, ddp_group, hook_parameters, place_in, ring_ranks
from gvq.hooks.layout import reduce_bucket
from gvq.hooks.thread import BucketJob, CommThread, IterationRecord

log = logging.getLogger("gvq")


def require_hookable(agg, who: str = "gvq hook") -> None:
    """The one check that ``agg`` can run inside backward: it averages any one DDP bucket through gvq's
    ring (``any_bucket``; torch DDP's own options overlap by themselves)."""
    if not agg.any_bucket:
        raise ValueError(f"{who}: {type(agg).__name__} does not aggregate through gvq's ring "
                         "(torch DDP overlaps by itself)")


def bind_aggregator(agg: FlatAggregator, params, group, context: dict, place=None):
    """Bind ``agg`` (built, not yet bound) to ``params`` as :meth:`GvqHookState.from_config` describes them
    (parameters, a model or its DDP wrapper), this process's place in the group averaged over giving its
    :class:`RunContext` (``context``: the other fields); the gradients left where they are (DDP owns their
    buffers).  ``place``: the method's ``aggregator_context`` (which ranks its ring runs among, from the
    run's context); None: every rank of the group.  Returns the group (None: inferred again from the
    parameters' DDP)."""
    params, wrapper_group = hook_parameters(params)
    if group is not None and wrapper_group is not None and group is not wrapper_group:
        raise ValueError("gvq hook: group= differs from the DistributedDataParallel's own process group")
    group = group if group is not None else wrapper_group
    rank, world = place_in(ring_ranks(ddp_group(params, group)), context.pop("rank", None),
                           context.pop("world_size", None))
    try:
        ctx = RunContext(rank, world, **context)
    except TypeError:
        raise ValueError(f"gvq hook: {sorted(context)}: RunContext takes {list(RunContext.__dataclass_fields__)}; "
                         "an option's keys go in overrides ({'compressor.bits': 2})") from None
    agg.bind(params, ctx if place is None else place(ctx))
    return group


def require_own_state(state: dict, ctx: RunContext, who: str) -> None:
    """Refuse, in one line, a per-rank state saved by another rank (or at another world size): loaded, it
    would give this rank that rank's error memory and random stream."""
    mine = (ctx.rank, ctx.world_size)
    theirs = (state.get("rank", ctx.rank), state.get("world_size", ctx.world_size))
    if theirs != mine:
        raise ValueError(f"{who}.load_state_dict: the state of rank {theirs[0]} of {theirs[1]}, "
                         f"not this rank's ({mine[0]} of {mine[1]}): save and load each rank's own state "
                         "(where a framework writes rank 0's file only, checkpoint "
                         "gvq.hooks.checkpoint.AllRanks(state) instead)")


class GvqHookState:
    """State of :func:`gvq_hook`: the aggregator, the communication thread and the last iteration's
    measurements (:meth:`iteration_stats`)."""

    def __init__(self, aggregator: FlatAggregator, lanes: clock.Lanes | None = None, group=None):
        """``aggregator``: a gvq ring aggregator bound to this rank's parameters, its gradients left to
        DDP (``agg.bind(params, ctx)``: what :meth:`from_config` does), ``ctx`` giving this process's
        place in ``group``.  ``lanes``: the clock lanes it times on (default: its own wall-clock pair;
        the runner passes the process's, virtual time included).  ``group``: the process group DDP
        averages over (``DistributedDataParallel(..., process_group=...)``; None: the default group);
        the state runs its ring among those ranks, on a process group of its own over them
        (:mod:`gvq.hooks.group`).  Peers are waited for as long as the aggregator's
        ``RunContext.timeout_s`` says, by default the process group's timeout."""
        require_hookable(aggregator)
        if aggregator.params is None or aggregator.bucket is not None:
            raise ValueError(f"gvq hook: {aggregator.name!r} must be bound to this rank's parameters with "
                             "its gradients left to DDP (agg.bind(params, ctx), not agg.setup, which lays "
                             "them out for averaging after backward; or GvqHookState.from_config)")
        self.aggregator = aggregator
        self.lanes = lanes if lanes is not None else clock.Lanes()
        self.iteration = 0                      # the iteration whose buckets come next
        self.layout: list[list[int]] = []       # the last iteration's buckets (parameter positions)
        self._resumed: list[list[int]] | None = None   # a checkpoint's layout, for the next iteration
        self._positions = {id(p): i for i, p in enumerate(aggregator.params)}
        self._by_ptr = {p.data_ptr(): i for i, p in enumerate(aggregator.params) if p.numel()}
        ctx = aggregator.ctx
        #: the global ranks of the ring (None: no process group, a state never run)
        self.ranks = ring_ranks(ddp_group(aggregator.params, group))
        self._check_at_first_bucket = group is None     # inferred: the DDP it is registered on must agree
        place_in(self.ranks, ctx.rank, ctx.world_size)
        self._transient()
        self._connect()

    def _connect(self) -> None:
        """The aggregator's transport on a process group of this state's own (its messages never meet
        another state's), made once per process: again after unpickling, at first use."""
        self.group = connect(self.aggregator, self.ranks)

    @property
    def timeout_s(self) -> float:
        """How long a peer (and :meth:`iteration_stats`) is waited for: the aggregator's transport's."""
        return peer_timeout_s(self.aggregator.ctx.timeout_s)

    def _transient(self) -> None:
        """What never pickles: the thread, the open iteration, the finished iteration's signal."""
        self._thread: CommThread | None = None
        self._open: IterationRecord | None = None
        self._layout: list[list[int]] = []
        self._last: dict | None = None
        #: when the last finished iteration's last bucket was averaged, on the communication lane's clock
        #: (the runner's compute lane waits until then under virtual time)
        self.t_done = 0.0
        self._finished = threading.Event()

    @classmethod
    def from_config(cls, config, params, overrides: dict | None = None, lanes: clock.Lanes | None = None,
                    group=None, **context) -> "GvqHookState":
        """A state around ``config`` (an option name such as ``"qsgd"``, or a dict with ``_target_``;
        ``overrides`` merged into it), built and bound on ``params``: the model's parameters, the model,
        or best its ``DistributedDataParallel`` wrapper, whose process group is then the one averaged
        over (else ``group``, else the default group).  ``context``: :class:`RunContext` fields; rank and
        world size are this process's place in that group (given without a process group only),
        ``timeout_s`` defaults to its timeout; ``lanes`` as in the constructor."""
        from gvq.hooks.config import build_aggregator, check_overrides
        agg = build_aggregator(config, **check_overrides(overrides))
        return cls(agg, lanes, bind_aggregator(agg, params, group, context))

    # -- the hook's side (autograd thread) ------------------------------------------------------------
    def positions(self, params) -> list[int]:
        """A bucket's parameters as positions in the aggregator's ``params`` (by identity, else by
        storage: a bucket rebuild only reorders the same parameters)."""
        try:
            return [self._positions[id(p)] if id(p) in self._positions else self._by_ptr[p.data_ptr()]
                    for p in params]
        except KeyError:
            raise ValueError("gvq hook: a DDP bucket holds a parameter the aggregator was not set up "
                             "with (build the state on the same model's parameters)") from None

    def submit(self, job: BucketJob) -> None:
        if self._thread is None:
            if self._check_at_first_bucket:
                check_registered(self.ranks, self.aggregator.params[job.params[0]])
                self._check_at_first_bucket = False
            self._start()
        self._thread.submit(job)

    def _start(self) -> None:
        agg = self.aggregator
        if agg.p2p is None:                       # unpickled: its transport and group were left behind
            self._connect()
        self._thread = CommThread(self._reduce, name=f"gvq-comm-rank{agg.ctx.rank}",
                                  label=f"rank {agg.ctx.rank}: gvq hook", lanes=self.lanes)

    # -- the communication thread's side ------------------------------------------------------------
    def _reduce(self, job: BucketJob) -> None:
        agg = self.aggregator
        if self._open is None:
            self._finished.clear()
            agg.begin_iteration(self.iteration)          # the frame post-backward aggregation opens too
            self._open = IterationRecord(self.iteration)
        lane = self.lanes.comm
        lane.advance_to(job.t_ready)              # a bucket starts no earlier than backward made it
        self._open.t_start_last = lane.now()
        for group, numel, stats in reduce_bucket(agg, job.flat, job.params, self.iteration, self._resumed):
            self._open.add(job.t_ready, numel, stats)
            self._layout.append(group)
        if job.is_last:
            self._close_iteration()
        job.future.set_result(job.flat)

    def _close_iteration(self) -> None:
        agg, rec = self.aggregator, self._open
        extra = agg.end_iteration(rec.iteration)         # its columns and counters, as post-backward
        rec.t_done = self.t_done = self.lanes.comm.now()
        self._last = {**rec.result(), **extra}
        self._open, self.iteration = None, self.iteration + 1
        self.layout, self._layout, self._resumed = self._layout, [], None
        self._finished.set()

    # -- the training loop's side -------------------------------------------------------------------
    def iteration_stats(self) -> dict:
        """The last finished iteration's measurements, declared columns only (docs/columns.md):
        ``buckets``, ``comm_s`` (first bucket launched -> last averaged), ``exposed_s`` (last averaged -
        backward produced the last bucket), ``last_bucket_s``, ``averaging_s`` (the buckets' own times,
        summed), the codec / wire / byte counters and the aggregator's columns; :attr:`t_done` says
        when it finished.  A :class:`RankError` when none finishes within the peer timeout."""
        if self._thread is None and self._last is None:
            raise ValueError("gvq hook: no iteration has run yet: iteration_stats() answers after a backward")
        if not self._finished.wait(self.timeout_s):
            self.raise_failure()
            raise RankError(self.aggregator.ctx.rank, f"gvq hook: no iteration finished within {self.timeout_s:g}s")
        return dict(self._last)

    def raise_failure(self) -> None:
        if self._thread is not None and self._thread.error is not None:
            raise self._thread.error

    def close(self) -> None:
        """Stop and join the communication thread, then release the aggregator's transport (an emulated
        link's sender thread included); idempotent."""
        if self._thread is not None:
            self._thread.close(self.timeout_s)
            self._thread = None
        self.aggregator.close()

    def __enter__(self) -> "GvqHookState":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- checkpoints and pickling -------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's state, marked with its rank and world size: error memories, dithers and samples
        are per rank, so :meth:`load_state_dict` takes back only its own."""
        ctx = self.aggregator.ctx
        return {"rank": ctx.rank, "world_size": ctx.world_size, "iteration": self.iteration,
                "layout": [list(g) for g in self.layout], "aggregator": self.aggregator.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore; a fresh DDP's first (single) bucket is then averaged in the recorded layout (see
        :mod:`gvq.hooks.layout`).  Another rank's state (or one of another world size) is refused: loaded,
        it would give this rank that rank's error memory and random stream."""
        require_own_state(state, self.aggregator.ctx, "GvqHookState")
        self.iteration = int(state["iteration"])
        self._resumed = [list(g) for g in state.get("layout", [])] or None
        self.layout = self._resumed or []
        self.aggregator.load_state_dict(state["aggregator"])

    def __getstate__(self) -> dict:
        """Without the thread or the lanes (fresh wall lanes); the aggregator pickles itself without its
        transport (``FlatAggregator.__getstate__``), which :meth:`_start` opens again on first use."""
        return {k: v for k, v in self.__dict__.items()
                if k not in ("lanes", "group", "_thread", "_open", "_layout", "_last", "_finished")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lanes, self.group = clock.Lanes(), None
        self._transient()


def gvq_hook(state: GvqHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: queue the bucket for this rank's communication thread and return the
    future it completes with the averaged buffer.  Never blocks the autograd thread."""
    fut: torch.futures.Future = torch.futures.Future()
    job = BucketJob(fut, bucket.buffer(), state.positions(bucket.parameters()), bucket.index(),
                    bucket.is_last(), state.lanes.compute.now())
    state.submit(job)
    if job.is_last:                 # backward's tail only waits for the buckets now: let peers' phases run
        state.lanes.compute.yield_core()
    # a future completed with an exception object hands DDP that object as its value; re-raised in a
    # callback it becomes the returned future's error, which backward raises as such.  (value() of a
    # completed future does not wait: no wait inside a callback)
    return fut.then(_value)


def _value(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()
