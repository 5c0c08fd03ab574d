"""The in-memory form every loader returns, and the seeded generators everything random draws from."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


@dataclass
class TensorData:
    """Train/test tensors: x ``(N, C, H, W)``, y int64 class indices.

    x is either float32, already normalised, or uint8 pixels (0..255) with the per-channel ``mean`` /
    ``std`` of the training images in [0, 1]: kept as bytes (a quarter of the memory, copied once per rank)
    and normalised per batch by :meth:`inputs`.
    """
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    in_channels: int
    augment: bool = False  # pad-and-crop + horizontal flip on training batches
    mean: Optional[tuple[float, ...]] = None  # per channel, for uint8 x
    std: Optional[tuple[float, ...]] = None
    # text (gvq.data.tokens.TokenData): bytes per token, for bits per byte; None: not text
    bytes_per_token: Optional[float] = None
    # dataset.split: each training example's group (its novel, its class), whole groups dealt to ranks
    # (gvq.data.batches.group_shard); None: pooled, every rank a random share of everything
    groups: Optional[torch.Tensor] = None

    def __post_init__(self):
        if (self.x_train.dtype == torch.uint8) != (self.mean is not None and self.std is not None):
            raise ValueError("TensorData: uint8 images need mean and std (and only they do)")

    def __len__(self) -> int:
        return len(self.y_train)

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """A batch of this data's images as the model takes them: float32, normalised."""
        if x.dtype != torch.uint8:
            return x
        mean = torch.tensor(self.mean, dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32).view(1, -1, 1, 1)
        return (x.float().div_(255.0) - mean) / std


def label_groups(y: torch.Tensor, split: str) -> Optional[torch.Tensor]:
    """A labelled data set's :attr:`TensorData.groups` for ``dataset.split``: its classes (``by_label``: each
    rank trains on a subset of the classes, the CNN's non-identical data) or none (``pooled``)."""
    if split == "pooled":
        return None
    if split != "by_label":
        raise ValueError(f"dataset.split={split!r}: must be pooled or by_label (a labelled data set's groups)")
    return y


def _seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integer parts (nearby tuples give unrelated streams)."""
    words = [int(p) & 0xFFFFFFFF for p in parts]
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0] >> 1)


def seeded_generator(*parts: int) -> torch.Generator:
    """A CPU generator seeded from integer parts (``(seed, epoch)``, ``(seed, rank, epoch, batch)``)."""
    return torch.Generator().manual_seed(_seed(*parts))

