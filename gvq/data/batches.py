"""The sharded, resumable batch stream each rank trains on, and the test set in batches."""
from __future__ import annotations

from typing import Iterator

import torch

from gvq.data.tensors import TensorData, seeded_generator

AUG_PAD = 4  # pixels of zero padding before the random crop (He et al. 2016, sec. 4.2)


def batches_per_epoch(n: int, world_size: int, batch_size: int) -> int:
    """Full batches each rank gets per epoch (every rank the same number; the rest is dropped)."""
    nb = (n // world_size) // batch_size
    if nb < 1:
        raise ValueError(f"batch_size={batch_size} x world_size={world_size} exceeds the "
                         f"{n} training examples: no full batch per rank")
    return nb


def epoch_shard(n: int, rank: int, world_size: int, batch_size: int, seed: int,
                epoch: int) -> torch.Tensor:
    """This rank's training indices for ``epoch``: ``perm[rank::world]``, cut to full batches."""
    perm = torch.randperm(n, generator=seeded_generator(seed, epoch))  # same on every rank
    return perm[rank::world_size][:batches_per_epoch(n, world_size, batch_size) * batch_size]


def iterate_batches(data: TensorData, rank: int, world_size: int, batch_size: int, seed: int,
                    start_iteration: int = 0) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield ``(epoch, x, y)`` forever, starting at global iteration ``start_iteration``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} outside [0, world_size={world_size})")
    n = len(data.y_train)
    nb = batches_per_epoch(n, world_size, batch_size)
    epoch, first = divmod(int(start_iteration), nb)
    while True:
        shard = epoch_shard(n, rank, world_size, batch_size, seed, epoch)
        for b in range(first, nb):
            idx = shard[b * batch_size:(b + 1) * batch_size]
            x = data.inputs(data.x_train[idx])   # normalised per batch (uint8 data stays bytes)
            if data.augment:
                # Seeded per batch (not per epoch): a resumed run needs no replay of earlier draws.
                x = augment_batch(x, seeded_generator(seed, rank, epoch, b))
            yield epoch, x, data.y_train[idx]
        epoch, first = epoch + 1, 0


def augment_batch(x: torch.Tensor, generator: torch.Generator, pad: int = AUG_PAD) -> torch.Tensor:
    """Random crop of the ``pad``-zero-padded images back to (H, W), and random horizontal flip.

    Zero padding is applied to the normalised tensor (i.e. the mean colour).  One gather for the
    whole batch: per-image row and column index maps, the flip folded into the column map.
    """
    n, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n, 1), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n, 1), generator=generator)
    flip = torch.rand(n, 1, generator=generator) < 0.5
    rows = dy + torch.arange(h)                                   # (n, h)
    cols = dx + torch.where(flip, torch.arange(w - 1, -1, -1), torch.arange(w))  # (n, w)
    out = padded[torch.arange(n)[:, None, None], :, rows[:, :, None], cols[:, None, :]]  # (n,h,w,c)
    return out.permute(0, 3, 1, 2).contiguous()


def test_batches(data: TensorData,
                 batch_size: int = 512) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The whole test set in order, in batches of at most ``batch_size``."""
    for i in range(0, len(data.y_test), batch_size):
        yield data.inputs(data.x_test[i:i + batch_size]), data.y_test[i:i + batch_size]


test_batches.__test__ = False  # not a pytest test, despite the name
