"""Images with one label each (digits, Fashion-MNIST, CIFAR, synthetic): the loss per image, accuracy."""
from __future__ import annotations

import torch

from gvq.workloads.base import Workload


class Classification(Workload):
    """Inputs ``(C, H, W)``; the model is built with ``C`` input channels."""

    @property
    def in_channels(self) -> int:
        return self.sample_shape[0]

    def synthetic_batch(self, batch: int, generator: torch.Generator | None = None):
        """Gaussian images and a label each (the inputs first: one generator draws both, in this order)."""
        return (torch.randn(batch, *self.sample_shape, generator=generator),
                torch.randint(0, self.num_classes, (batch,), generator=generator))
