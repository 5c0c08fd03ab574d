"""Syncing less often in a user's own DDP script: a ``conf/method`` option (local SGD, DiLoCo: the classes
of gvq/methods/) around the script's ``optimizer.step()``, what it sends averaged by a gvq ring aggregator::

    from gvq.hooks import MethodSync
    sync = MethodSync.from_config("diloco", ddp, {"method.every": 30}, aggregator="rar")
    for x, y in batches:
        with sync.no_sync():                 # DDP's no_sync on a step whose gradients stay on each rank
            loss_fn(ddp(x), y).backward()
        opt.step()
        stats = sync.after_step()           # at a sync: the parameters / Δ averaged, DiLoCo's outer step
    torch.save({"model": ..., "opt": opt.state_dict(), "gvq": sync.state_dict()}, f"ckpt.rank{rank}.pt")

Between syncs nothing is communicated: :meth:`MethodSync.no_sync` is DDP's ``no_sync`` on every step whose
gradients the method keeps local (all of DiLoCo's; local SGD's from ``start_iter`` on), and DDP's own
averaging (or the hook registered on it) on the others.  :meth:`after_step` calls the method's
``after_step`` (:class:`gvq.methods.base.Method`), the loop's, whose sync goes through the aggregator's
``average_vector`` on a process group of its own over DDP's ranks.  Overrides are the command line's keys:
``method.*`` compose the method as ``python cli.py method=<name>`` does (its schema, its one-line refusal
of a misspelt key), the others the aggregator as :func:`gvq.hooks.config.build_aggregator` does.  Between
syncs every rank holds its own parameters and inner optimizer state, so each rank checkpoints its own
(model, optimizer, ``state_dict()``): a resume mid-period then continues as if never stopped.

``method.workers=node`` (gvq/methods/nodes.py: a two-level net's nodes are the workers; give the cluster
as ``MethodSync.from_config(..., cluster=Cluster(ranks_per_node=8))``, DDP over every rank): the
every-step averaging inside a node is the method's, never DDP's.  DDP's all-reduce would average over all
ranks, across nodes, every step; a DDP over the node's group instead would be a second mechanism beside
the method's own node ring, and the user's one DDP could not also span the nodes.  So every step runs in
DDP's ``no_sync`` (DiLoCo keeps every gradient local), and leaving :meth:`MethodSync.no_sync` after
backward calls the method's ``before_step``, as the training loop does after backward: the node's ring
averages the gradients on the intra-node links, nothing crosses a node.  The outer step in
:meth:`after_step` goes across nodes exactly as in the loop (the aggregator on the ring of the nodes'
j-th ranks, then the all-gather inside the node).  Any method's ``before_step`` runs there on a step
whose gradients stay local (workers=rank: nothing sent, the columns of a step that sent nothing).
"""
from __future__ import annotations

import contextlib

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gvq.aggregators.base import RunContext
from gvq.aggregators.flat import FlatAggregator
from gvq.hooks.config import build_aggregator, check_overrides, hydra_value
from gvq.hooks.group import connect, place_in, ring_ranks
from gvq.hooks.state import bind_aggregator, require_hookable, require_own_state
from gvq.methods.base import Method
from gvq.schema.compose import compose
from gvq.schema.errors import ConfigError, instantiation_line


def compose_method(name: str, overrides: dict | None = None) -> Method:
    """The method ``python cli.py method=<name> <overrides>`` builds (``overrides``: ``{"method.every": 30}``),
    not yet set up; a misspelt key, an ill-typed value or an unknown name: the CLI's one-line ConfigError."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    if not isinstance(name, str):
        raise ConfigError(f"gvq method: method={name!r}: give an option name of conf/method (diloco, local_sgd)")
    node = compose([f"method={name}", *(f"{k}={hydra_value(v)}" for k, v in (overrides or {}).items())]).method
    node = OmegaConf.to_container(node, resolve=True)
    try:
        return instantiate(node, _convert_="object")
    except (ValueError, TypeError, InstantiationException) as e:      # a value out of range: its one line
        raise ConfigError(instantiation_line("method", node, e), source=e) from None


def require_ddp(model) -> None:
    if not isinstance(model, DistributedDataParallel):
        raise ValueError(f"MethodSync: model={type(model).__name__}: hand it the DistributedDataParallel "
                         "wrapper (its no_sync keeps the gradients local between syncs)")


def method_ring(method: Method, ctx: RunContext, ddp: DistributedDataParallel) -> RunContext:
    """The context ``method`` sets its aggregator up in (``aggregator_context``); where that is another ring
    than DDP's ranks (``method.workers=node``), DDP must span every rank of nodes that have several: a
    one-line ``ValueError`` otherwise."""
    mine = method.aggregator_context(ctx)
    if mine is ctx:
        return ctx
    if ctx.cluster.flat:
        raise ValueError(f"MethodSync: method={method.name} with workers=node needs nodes of several ranks: "
                         "pass cluster=Cluster(ranks_per_node=R) (or method.workers=rank)")
    if ring_ranks(ddp.process_group) != list(range(dist.get_world_size())):
        raise ValueError("MethodSync: method.workers=node cuts the default group into nodes: wrap the model "
                         "in a DistributedDataParallel over every rank")
    return mine


class MethodSync:
    """One method around a DDP model's optimizer step (see the module docstring)."""

    def __init__(self, method: Method, aggregator: FlatAggregator, ddp: DistributedDataParallel):
        """``aggregator``: bound to ``ddp``'s parameters (``agg.bind(params, ctx)``, its place among DDP's
        ranks in ``ctx``: what :meth:`from_config` does); ``method``: built, not set up (the model's
        replicas identical, as DDP leaves them after wrapping)."""
        require_ddp(ddp)
        require_hookable(aggregator, "MethodSync")
        if aggregator.params is None:
            raise ValueError(f"MethodSync: {aggregator.name!r} must be bound to the model's parameters "
                             "(agg.bind(params, ctx); or MethodSync.from_config)")
        self.method, self.aggregator, self.ddp = method, aggregator, ddp
        #: this process's place among DDP's ranks (what a checkpoint is marked with)
        self.place = place_in(ring_ranks(ddp.process_group), None, None)
        ring = aggregator.ctx.group           # the method's ring (workers=node: one rank a node), else DDP's
        self.ranks = ring_ranks(ring if ring is not None else ddp.process_group)
        self.group = connect(aggregator, self.ranks)       # never mixed with DDP's own collectives
        method.setup(list(ddp.module.parameters()), aggregator)
        self.iteration = 0                   # the step whose forward / backward comes next
        self._local = -1                     # the last step whose backward ran inside no_sync
        self._before: dict = {}              # that step's before_step columns

    @classmethod
    def from_config(cls, method: str, ddp: DistributedDataParallel, overrides: dict | None = None,
                    aggregator="rar", **context) -> "MethodSync":
        """``method`` (a conf/method option: ``local_sgd``, ``diloco``, ``every_step``) on ``ddp``, what it
        sends averaged by ``aggregator`` (a ring option, or a dict with ``_target_``) over DDP's process
        group.  ``overrides``: the command line's keys, ``method.*`` the method's, the rest the
        aggregator's (``{"method.every": 30, "compressor.bits": 4}``); ``context``: :class:`RunContext`
        fields (``seed``, ``timeout_s``).  Every refusal is one line, raised before anything is sent."""
        overrides = check_overrides(overrides)
        mine = {k: v for k, v in overrides.items() if k.split(".", 1)[0] == "method"}
        built = compose_method(method, mine)
        agg = build_aggregator(aggregator, **{k: v for k, v in overrides.items() if k not in mine})
        built.check(agg)                     # before any collective: a hook-only aggregator, one line
        require_ddp(ddp)
        bind_aggregator(agg, ddp, None, dict(context), lambda ctx: method_ring(built, ctx, ddp))
        return cls(built, agg, ddp)

    # -- one step -----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        """Around this step's forward and backward: DDP's ``no_sync`` where the method keeps the gradients
        on each rank, else nothing (DDP averages them: post-local SGD before ``start_iter``, every_step)."""
        if self.method.averages_gradients(self.iteration):
            yield
            return
        with self.ddp.no_sync():
            yield
        self._local = self.iteration
        self._before = self.method.before_step(self.iteration)   # workers=node: the node's average

    def syncs(self) -> bool:
        """Whether the coming step communicates (its gradients through DDP, or after it the parameters)."""
        return self.method.syncs(self.iteration)

    def after_step(self) -> dict:
        """After ``optimizer.step()``: the method's sync where the schedule has one; returns ``synced`` (1
        where the ranks communicated this step), on a step inside :meth:`no_sync` the columns of the
        method's ``before_step`` (workers=node: the node's gradient ring), and, at a sync after the step, the
        aggregator's measurements (``bytes_sent``, ``aggregate_s`` ... : docs/columns.md).  A step whose
        gradients should have stayed local but went through DDP's all-reduce (backward outside
        :meth:`no_sync`) is refused."""
        it = self.iteration
        if not self.method.averages_gradients(it) and self._local != it:
            raise ValueError(f"MethodSync: step {it}'s backward ran outside sync.no_sync(): DDP averaged the "
                             f"gradients method={self.method.name} keeps on each rank (wrap forward and backward)")
        before = self._before if self._local == it else {}
        row = {**before, "synced": int(self.method.syncs(it)), **self.method.after_step(it)}
        self.iteration += 1
        return row

    def synced_parameters(self) -> contextlib.AbstractContextManager:
        """A context in which the model holds the parameters every rank agrees on (DiLoCo: the global copy
        of the last sync), to evaluate or save a model; each rank's own back after."""
        return self.method.synced_parameters(self.ddp.module)

    # -- checkpoints: this rank's own (with the script's model and optimizer, saved per rank) -------------------
    def state_dict(self) -> dict:
        return {"rank": self.place[0], "world_size": self.place[1], "name": self.method.name,
                "iteration": self.iteration, "method": self.method.state_dict(),
                "aggregator": self.aggregator.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output (another rank's, or another method's, refused in one line)."""
        require_own_state(state, RunContext(*self.place), "MethodSync")
        if state["name"] != self.method.name:
            raise ValueError(f"MethodSync.load_state_dict: a method={state['name']} state, not "
                             f"method={self.method.name}'s")
        self.iteration = int(state["iteration"])
        self.method.load_state_dict(state["method"])
        self.aggregator.load_state_dict(state["aggregator"])

    def close(self) -> None:
        """Release the aggregator's transport; idempotent."""
        self.aggregator.close()

    def __enter__(self) -> "MethodSync":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
