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


def group_owners(num_groups: int, world_size: int) -> list[list[int]]:
    """The ranks that train on each group (``dataset.split``): with at least as many groups as ranks, group
    g is rank ``g % world``'s alone (dealt round-robin: rank r trains on groups r, r + world, ...); with
    fewer, ranks g, g + G, g + 2G, ... share group g (every rank one group), its examples dealt among them."""
    if num_groups >= world_size:
        return [[g % world_size] for g in range(num_groups)]
    return [list(range(g, world_size, num_groups)) for g in range(num_groups)]


def group_sizes(groups: torch.Tensor, world_size: int) -> torch.Tensor:
    """Training examples each rank owns under :func:`group_owners` (the k-th of m sharers: every m-th)."""
    counts = torch.bincount(groups).tolist()
    sizes = torch.zeros(world_size, dtype=torch.long)
    for g, owners in enumerate(group_owners(len(counts), world_size)):
        for k, r in enumerate(owners):
            sizes[r] += len(range(k, counts[g], len(owners)))
    return sizes


def group_batches_per_epoch(groups: torch.Tensor, world_size: int, batch_size: int) -> int:
    """Full batches each rank gets per epoch under a group split: the smallest rank's, so that every rank
    steps the same number of times (a larger rank's other examples come up in later epochs' draws)."""
    sizes = group_sizes(groups, world_size)
    nb = int(sizes.min()) // batch_size
    if nb < 1:
        raise ValueError(f"batch_size={batch_size} exceeds the {int(sizes.min())} training examples of the "
                         f"smallest rank's groups (dataset.split, world_size={world_size}): no full batch per rank")
    return nb


def group_shard(groups: torch.Tensor, rank: int, world_size: int, batch_size: int, seed: int,
                epoch: int) -> torch.Tensor:
    """This rank's training indices for ``epoch`` under a group split: the epoch's one permutation (as
    :func:`epoch_shard`'s) filtered to the examples this rank owns, cut to the smallest rank's full batches.
    A shared group's examples are dealt in that permutation's order (the j-th to sharer j mod m), so
    sharers stay disjoint and a group's split changes every epoch."""
    perm = torch.randperm(len(groups), generator=seeded_generator(seed, epoch))  # same on every rank
    g = groups[perm]
    owners = group_owners(int(groups.max()) + 1, world_size)
    m = torch.tensor([len(o) for o in owners])
    table = torch.tensor([o + [-1] * (int(m.max()) - len(o)) for o in owners])       # (G, max sharers)
    counts = torch.bincount(g, minlength=len(owners))
    order = torch.argsort(g, stable=True)                # by group, permutation order kept within one
    place = torch.empty_like(g)
    place[order] = torch.arange(len(g)) - (torch.cumsum(counts, 0) - counts)[g[order]]  # j within its group
    mine = perm[table[g, place % m[g]] == rank]
    return mine[:group_batches_per_epoch(groups, world_size, batch_size) * batch_size]


def iterate_batches(data: TensorData, rank: int, world_size: int, batch_size: int, seed: int,
                    start_iteration: int = 0) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield ``(epoch, x, y)`` forever, starting at global iteration ``start_iteration``; ``data.groups``
    set (``dataset.split``): each rank draws from its own groups only (:func:`group_shard`)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} outside [0, world_size={world_size})")
    n, groups = len(data.y_train), data.groups
    nb = (batches_per_epoch(n, world_size, batch_size) if groups is None
          else group_batches_per_epoch(groups, world_size, batch_size))
    epoch, first = divmod(int(start_iteration), nb)
    while True:
        shard = (epoch_shard(n, rank, world_size, batch_size, seed, epoch) if groups is None
                 else group_shard(groups, rank, world_size, batch_size, seed, epoch))
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
