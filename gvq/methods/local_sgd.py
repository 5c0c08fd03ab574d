"""Local SGD / post-local SGD (Stich 2019; Lin et al., ICLR 2020): every rank steps its own optimizer on its
own gradients, and every ``every`` steps the parameters are averaged through the run's aggregator; before
``start_iter`` the gradients are averaged every step (post-local SGD).  ``python cli.py method=local_sgd
method.every=4``.

It is :class:`gvq.methods.diloco.DiLoCo` with the outer step θ ← θ_global − 1·mean(Δ) = mean(θ_local)
(outer lr 1, no momentum): one mechanism.  Its schedule is torch's ``PeriodicModelAverager(period=every,
warmup_steps=start_iter)``: the first average right after ``start_iter``'s step, then every ``every``.
"""
from __future__ import annotations

from gvq.methods.diloco import DiLoCo


class LocalSGD(DiLoCo):
    """Parameters averaged every ``every`` steps from ``start_iter`` on, gradients every step before."""

    name = "local_sgd"

    def __init__(self, every: int = 4, start_iter: int = 0, workers: str = "rank"):
        super().__init__(every=every, outer_lr=1.0, outer_momentum=0.0, workers=workers)
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(f"method.start_iter={start_iter!r}: must be an integer >= 0")
        self.start_iter = start_iter

    def syncs(self, iteration: int) -> bool:
        return iteration < self.start_iter or (iteration - self.start_iter) % self.every == 0

    def averages_gradients(self, iteration: int) -> bool:
        return iteration < self.start_iter
