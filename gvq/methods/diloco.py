"""DiLoCo (Douillard et al. 2023): every rank steps its own (inner) optimizer for ``every`` steps; then the
ranks average the pseudo-gradient Δ = θ_global − θ_local through the run's aggregator (any ring option:
rar, fp16, qsgd ...), reset θ to the global copy and take an outer SGD step (Nesterov) on it.
``python cli.py method=diloco method.every=30``.

The order is OpenDiLoCo's (``open_diloco/train_diloco_torch.py``): Δ, averaged, θ ← θ_global, then the outer
step.  The inner optimizer's state is kept across outer steps; the global copy is fp32 (wider parameters
keep their own dtype) and identical on every rank at the start (the model is broadcast before).
"""
from __future__ import annotations

import contextlib

import torch

from gvq.aggregators.base import Aggregator, RunContext
from gvq.comm import clock
from gvq.methods.base import Method
from gvq.methods.nodes import ADDED, NodeWorkers
from gvq.schema import columns


class DiLoCo(Method):
    """Inner steps alone, an outer step on the averaged pseudo-gradient every ``every`` iterations."""

    name = "diloco"
    extra_fields = ("synced",)

    def __init__(self, every: int = 30, outer_lr: float = 0.7, outer_momentum: float = 0.9, workers: str = "rank"):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"method.every={every!r}: must be an integer >= 1")
        if not outer_lr > 0:
            raise ValueError(f"method.outer_lr={outer_lr!r}: must be > 0")
        if not 0 <= outer_momentum < 1:
            raise ValueError(f"method.outer_momentum={outer_momentum!r}: must be in [0, 1)")
        if workers not in ("rank", "node"):
            raise ValueError(f"method.workers={workers!r}: must be rank or node")
        self.every, self.outer_lr, self.outer_momentum = every, float(outer_lr), float(outer_momentum)
        self.workers = str(workers)
        #: method.workers=node: the node's ring and the nodes' (gvq/methods/nodes.py); None: every rank a worker
        self.nodes: NodeWorkers | None = None

    def check_run(self, cfg: dict) -> None:
        if self.workers != "node":
            return
        per = cfg["net"]["ranks_per_node"]
        if per < 2:
            raise ValueError(f"method.workers=node needs nodes of several ranks: net.ranks_per_node={per} is "
                             "the flat net (e.g. net=nodes2x4, or method.workers=rank)")
        if cfg["aggregator"].get("topology") == "hierarchical" or cfg["aggregate_error"]:
            raise ValueError("method.workers=node runs the aggregator across nodes itself: it takes neither "
                             "aggregator.topology=hierarchical nor aggregate_error=true")

    def aggregator_context(self, ctx: RunContext) -> RunContext:
        """``method.workers=node``: the ring of one rank a node (gvq/methods/nodes.py); else every rank."""
        if self.workers != "node":
            return ctx
        self.nodes = NodeWorkers(ctx)
        return self.nodes.across

    def check(self, agg: Aggregator) -> None:
        if agg.inside_backward or not agg.any_bucket:
            raise ValueError(f"method={self.name} averages a vector after the step; aggregator={agg.name} "
                             "averages only inside backward: pick a ring aggregator without overlap")

    def setup(self, params: list[torch.nn.Parameter], agg: Aggregator) -> None:
        super().setup(params, agg)
        self.params = [p for p in params if p.requires_grad]
        if self.workers == "node":
            if self.nodes is None:
                raise ValueError("method.workers=node: set the aggregator up in aggregator_context()'s ring")
            self.nodes.setup(params)
        if len({p.dtype for p in self.params}) > 1:
            raise ValueError(f"method={self.name}: parameters of one dtype only (its Δ is one flat vector)")
        self.bounds = self.fragment_bounds()
        wide = torch.promote_types(self.params[0].dtype, torch.float32)
        # Parameters only so that torch's SGD steps them (one per fragment, each with its own momentum;
        # a fragment whose grad is None is not stepped): no autograd ever runs on them
        self.globals_ = [torch.nn.Parameter(self.flat_local(f).to(wide, copy=True), requires_grad=True)
                         for f in range(len(self.bounds) - 1)]
        m = self.outer_momentum
        self.outer = torch.optim.SGD(self.globals_, lr=self.outer_lr, momentum=m, nesterov=m > 0)

    def fragment_bounds(self) -> list[int]:
        """Where each fragment's parameters start in :attr:`params`, then the end: DiLoCo syncs the whole
        model, one fragment (Streaming DiLoCo splits it)."""
        return [0, len(self.params)]

    # -- the schedule: after every `every` inner steps (OpenDiLoCo: real_step % local_steps == 0) ---------
    def syncs(self, iteration: int) -> bool:
        return (iteration + 1) % self.every == 0

    def averages_gradients(self, iteration: int) -> bool:
        return False

    # -- one iteration -----------------------------------------------------------------------------------
    def before_step(self, iteration: int) -> dict:
        """workers=node: the gradients averaged inside the node every step (and, where the schedule averages
        them, across nodes too: the mean of the nodes' means)."""
        if self.nodes is None:
            return super().before_step(iteration)
        stats = self.nodes.average_gradients(iteration)
        everywhere = self.averages_gradients(iteration)
        if everywhere:
            across = self.agg.aggregate(iteration)
            stats = {**across, **{k: stats[k] + across[k] for k in (*ADDED, "aggregate_s")}}
        return {**columns.unsynced_row(), **stats, "phase": "node" if not everywhere else self.agg.name,
                **self.sync_marker(everywhere)}

    def after_step(self, iteration: int) -> dict:
        if self.averages_gradients(iteration):        # replicas stepped together: the global copy follows
            with torch.no_grad():
                for f, g in enumerate(self.globals_):
                    g.copy_(self.flat_local(f))
            return {}
        if not self.syncs(iteration):
            return {}
        row = {**self.outer_step(iteration), **self.sync_marker(True)}
        return row if self.nodes is None else self.nodes.plus_gradients(row)

    def outer_step(self, iteration: int) -> dict:
        """Δ averaged, θ_global stepped by the outer optimizer on it, θ_local ← θ_global.  ``aggregate_s``
        is the whole sync (Δ, its average, the outer step)."""
        delta, stats = self.averaged_delta(0, iteration)
        t0 = clock.now()
        self.outer_apply(0, delta)
        return {**stats, "aggregate_s": stats["aggregate_s"] + clock.now() - t0}

    @torch.no_grad()
    def averaged_delta(self, f: int, iteration: int) -> tuple[torch.Tensor, dict]:
        """Fragment ``f``'s Δ = θ_global − θ_local, averaged by the aggregator (its parameters' share of
        any per-parameter state), with the sync's columns (``aggregate_s``: Δ and its average)."""
        t0 = clock.now()
        delta = self.delta(f)
        t_delta = clock.now() - t0
        stats = self.average(f, delta, iteration)
        return delta, {**stats, "aggregate_s": t_delta + stats["aggregate_s"]}

    @torch.no_grad()
    def delta(self, f: int) -> torch.Tensor:
        """Fragment ``f``'s pseudo-gradient θ_global − θ_local, in the parameters' dtype."""
        local = self.flat_local(f)
        return (self.globals_[f] - local.to(self.globals_[f].dtype)).to(local.dtype)

    def average(self, f: int, delta: torch.Tensor, iteration: int) -> dict:
        """``delta`` (fragment ``f``'s) replaced by its average over ranks; the sync row's columns."""
        params = tuple(range(self.bounds[f], self.bounds[f + 1]))
        if self.nodes is not None:
            stats = self.nodes.average(self.agg, delta, iteration, params)
        else:
            stats = self.agg.average_vector(delta, iteration, params)
        return {**columns.unsynced_row(), **stats, "phase": self.agg.name}

    @torch.no_grad()
    def outer_apply(self, f: int, delta: torch.Tensor, alpha: float = 0.0) -> None:
        """The outer optimizer's step on fragment ``f``'s global copy with the averaged ``delta`` as its
        gradient, then θ_local ← α·θ_local + (1 − α)·θ_global (α = 0, DiLoCo's: the global copy)."""
        g = self.globals_[f]
        g.grad = delta.to(g.dtype)
        self.outer.step()
        g.grad = None
        self.write_local(f, g if alpha == 0 else torch.lerp(g, self.flat_local(f).to(g.dtype), alpha))

    # -- the parameters of fragment f as one vector --------------------------------------------------------
    def flat_local(self, f: int) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params[self.bounds[f]: self.bounds[f + 1]]])

    @torch.no_grad()
    def write_local(self, f: int, flat: torch.Tensor) -> None:
        offset = 0
        for p in self.params[self.bounds[f]: self.bounds[f + 1]]:
            p.copy_(flat[offset: offset + p.numel()].view_as(p))
            offset += p.numel()

    @contextlib.contextmanager
    def synced_parameters(self, model: torch.nn.Module):
        """The global copy in the model while inside (the outer parameters: what DiLoCo evaluates), this
        rank's own parameters back after."""
        mine = [self.flat_local(f).clone() for f in range(len(self.globals_))]
        for f, g in enumerate(self.globals_):
            self.write_local(f, g.detach())
        try:
            yield
        finally:
            for f, flat in enumerate(mine):
                self.write_local(f, flat)

    def close(self) -> None:
        if self.nodes is not None:
            self.nodes.close()

    # -- checkpoints: the global copy and the outer momentum (the inner optimizer's is the run's) ----------
    def state_dict(self) -> dict:
        return {"global": torch.cat([g.detach() for g in self.globals_]), "outer": self.outer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for g, saved in zip(self.globals_, state["global"].split([g.numel() for g in self.globals_])):
                g.copy_(saved)
        self.outer.load_state_dict(state["outer"])
