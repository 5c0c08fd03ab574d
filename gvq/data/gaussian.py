"""CIFAR-shaped random data for benchmarks: gaussian images around a per-class mean image."""
from __future__ import annotations

import torch

from gvq.data.tensors import TensorData, label_groups, seeded_generator


def synthetic(num_classes: int = 100, n_train: int = 2048, n_test: int = 512,
              image_size: int = 32, channels: int = 3, seed: int = 0, split: str = "pooled") -> TensorData:
    """Gaussian images around a per-class random mean image (learnable), for benchmarks only."""
    g = seeded_generator(seed, 0x5E7)
    means = 0.5 * torch.randn(num_classes, channels, image_size, image_size, generator=g)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(num_classes, (n,), generator=g)
        return means[y] + torch.randn(n, channels, image_size, image_size, generator=g), y

    (xtr, ytr), (xte, yte) = draw(n_train), draw(n_test)
    return TensorData(xtr, ytr, xte, yte, num_classes=num_classes, in_channels=channels,
                      augment=False, groups=label_groups(ytr, split))

