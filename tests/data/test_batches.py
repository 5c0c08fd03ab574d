"""gvq/data/batches.py: shards, resume, augmentation, the test set in batches."""
from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from gvq import data as D


# ----------------------------------------------------------------------------------------- batches

def index_data(n: int, augment: bool = False, size: int = 1) -> D.TensorData:
    """Data whose label is the example's index, so batches reveal which examples they hold."""
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 1, size, size).clone()
    return D.TensorData(x, torch.arange(n), x[:2], torch.arange(2), n, 1, augment)


def take(it, k):
    return [next(it) for _ in range(k)]


def test_shards_disjoint_cover_and_share_permutation():
    n, world, bs = 103, 3, 5
    nb = D.batches_per_epoch(n, world, bs)
    assert nb == 6
    data = index_data(n)
    per_rank = [take(D.iterate_batches(data, r, world, bs, seed=7), 2 * nb) for r in range(world)]
    for epoch in range(2):
        shards = [torch.cat([y for _, _, y in b[epoch * nb:(epoch + 1) * nb]]) for b in per_rank]
        assert all(e == epoch for b in per_rank for e, _, _ in b[epoch * nb:(epoch + 1) * nb])
        assert all(len(s) == nb * bs for s in shards)
        assert all(torch.equal(D.epoch_shard(n, r, world, bs, 7, epoch), shards[r])
                   for r in range(world))
        union = torch.cat(shards)
        assert len(set(union.tolist())) == len(union)  # disjoint
        assert n - len(union) < world * bs  # only the remainder is dropped
        # Interleaving the shards rebuilds one permutation: every rank used the same one.
        perm = torch.randperm(n, generator=D.seeded_generator(7, epoch))
        assert torch.equal(torch.stack(shards, 1).reshape(-1), perm[:len(union)])
    first = [y for _, _, y in per_rank[0][:nb]]
    second = [y for _, _, y in per_rank[0][nb:]]
    assert not torch.equal(torch.cat(first), torch.cat(second))  # reshuffled each epoch


def test_batch_too_large_raises():
    with pytest.raises(ValueError, match="batch_size"):
        next(D.iterate_batches(index_data(10), 0, 2, 8, seed=0))


@pytest.mark.parametrize("start", [0, 1, 5, 6, 13])  # nb = 6: mid-epoch, boundary, later epoch
def test_resume_matches_continuing(start):
    data = index_data(40, augment=True, size=6)
    full = take(D.iterate_batches(data, 1, 3, 2, seed=4), 20)
    resumed = take(D.iterate_batches(data, 1, 3, 2, seed=4, start_iteration=start), 20 - start)
    for (e1, x1, y1), (e2, x2, y2) in zip(full[start:], resumed):
        assert e1 == e2 and torch.equal(x1, x2) and torch.equal(y1, y2)


def test_augmentation_crops_and_flips():
    x = torch.randn(16, 3, 32, 32)
    a = D.augment_batch(x, D.seeded_generator(1))
    assert a.shape == x.shape
    assert torch.equal(a, D.augment_batch(x, D.seeded_generator(1)))
    assert not torch.equal(a, D.augment_batch(x, D.seeded_generator(2)))
    assert not torch.equal(a, x)
    padded = F.pad(x, (4, 4, 4, 4))
    found = set()
    for i in range(16):  # every output is some 32x32 window of the padded image, maybe mirrored
        hits = {(dy, dx, flip) for dy in range(9) for dx in range(9) for flip in (0, 1)
                if torch.equal(a[i], padded[i, :, dy:dy + 32, dx:dx + 32].flip(-1)
                               if flip else padded[i, :, dy:dy + 32, dx:dx + 32])}
        assert len(hits) == 1
        found |= hits
    assert {f for _, _, f in found} == {0, 1}  # both flipped and unflipped images
    assert len({(dy, dx) for dy, dx, _ in found}) > 8  # crops spread over the offsets


def test_augmentation_differs_between_batches():
    data = index_data(40, augment=True, size=6)
    data.x_train += 1  # nonzero images: the zero padding shows where each crop landed
    (_, x0, _), (_, x1, _) = take(D.iterate_batches(data, 0, 1, 8, seed=0), 2)
    assert not torch.equal(x0 == 0, x1 == 0)


def test_test_batches_cover_test_set():
    d = D.digits()
    xs, ys = zip(*D.test_batches(d, 100))
    assert [len(y) for y in ys] == [100, 100, 100, 60]
    assert torch.equal(torch.cat(xs), d.x_test) and torch.equal(torch.cat(ys), d.y_test)
