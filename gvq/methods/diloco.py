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

from gvq.aggregators.base import Aggregator
from gvq.comm import clock
from gvq.methods.base import Method
from gvq.schema import columns


class DiLoCo(Method):
    """Inner steps alone, an outer step on the averaged pseudo-gradient every ``every`` iterations."""

    name = "diloco"
    extra_fields = ("synced",)

    def __init__(self, every: int = 30, outer_lr: float = 0.7, outer_momentum: float = 0.9):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"method.every={every!r}: must be an integer >= 1")
        if not outer_lr > 0:
            raise ValueError(f"method.outer_lr={outer_lr!r}: must be > 0")
        if not 0 <= outer_momentum < 1:
            raise ValueError(f"method.outer_momentum={outer_momentum!r}: must be in [0, 1)")
        self.every, self.outer_lr, self.outer_momentum = every, float(outer_lr), float(outer_momentum)

    def check(self, agg: Aggregator) -> None:
        if agg.inside_backward or not agg.any_bucket:
            raise ValueError(f"method={self.name} averages a vector after the step; aggregator={agg.name} "
                             "averages only inside backward: pick a ring aggregator without overlap")

    def setup(self, params: list[torch.nn.Parameter], agg: Aggregator) -> None:
        super().setup(params, agg)
        self.params = [p for p in params if p.requires_grad]
        if len({p.dtype for p in self.params}) > 1:
            raise ValueError(f"method={self.name}: parameters of one dtype only (its Δ is one flat vector)")
        local = self.flat_local()
        wide = torch.promote_types(local.dtype, torch.float32)
        # a Parameter only so that torch's SGD steps it: no autograd ever runs on it
        self.global_ = torch.nn.Parameter(local.to(wide, copy=True), requires_grad=True)
        m = self.outer_momentum
        self.outer = torch.optim.SGD([self.global_], lr=self.outer_lr, momentum=m, nesterov=m > 0)

    # -- the schedule: after every `every` inner steps (OpenDiLoCo: real_step % local_steps == 0) ---------
    def syncs(self, iteration: int) -> bool:
        return (iteration + 1) % self.every == 0

    def averages_gradients(self, iteration: int) -> bool:
        return False

    # -- one iteration -----------------------------------------------------------------------------------
    def after_step(self, iteration: int) -> dict:
        if self.averages_gradients(iteration):        # replicas stepped together: the global copy follows
            with torch.no_grad():
                self.global_.copy_(self.flat_local())
            return {}
        if not self.syncs(iteration):
            return {}
        return {**self.outer_step(iteration), **self.sync_marker(True)}

    @torch.no_grad()
    def outer_step(self, iteration: int) -> dict:
        """Δ = θ_global − θ_local averaged by the aggregator; θ_global stepped by the outer optimizer on
        it; θ_local ← θ_global.  ``aggregate_s`` is the whole sync (Δ, its average, the outer step)."""
        t0 = clock.now()
        local = self.flat_local()
        delta = (self.global_ - local.to(self.global_.dtype)).to(local.dtype)
        t_delta = clock.now() - t0
        stats = self.agg.average_vector(delta, iteration)
        t0 = clock.now()
        self.global_.grad = delta.to(self.global_.dtype)
        self.outer.step()
        self.global_.grad = None
        self.write_local(self.global_)
        return {**columns.unsynced_row(), **stats, "phase": self.agg.name,
                "aggregate_s": t_delta + stats["aggregate_s"] + clock.now() - t0}

    # -- the parameters as one vector ----------------------------------------------------------------------
    def flat_local(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    @torch.no_grad()
    def write_local(self, flat: torch.Tensor) -> None:
        offset = 0
        for p in self.params:
            p.copy_(flat[offset: offset + p.numel()].view_as(p))
            offset += p.numel()

    @contextlib.contextmanager
    def synced_parameters(self, model: torch.nn.Module):
        """The global copy in the model while inside (the outer parameters: what DiLoCo evaluates), this
        rank's own parameters back after."""
        mine = self.flat_local().clone()
        self.write_local(self.global_.detach())
        try:
            yield
        finally:
            self.write_local(mine)

    # -- checkpoints: the global copy and the outer momentum (the inner optimizer's is the run's) ----------
    def state_dict(self) -> dict:
        return {"global": self.global_.detach().clone(), "outer": self.outer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.global_.copy_(state["global"])
        self.outer.load_state_dict(state["outer"])
