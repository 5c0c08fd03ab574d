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


# ------------------------------------------------------------------------- dataset.split: by group

def test_pooled_is_the_stream_it_always_was():
    """No groups (dataset.split=pooled): the batches main's stream gave before splits existed, pinned
    (labels, epochs and the augmented images' checksum from start iteration 4, mid-epoch)."""
    data = index_data(103, augment=True, size=3)
    got = take(D.iterate_batches(data, 1, 3, 5, seed=7, start_iteration=4), 4)
    assert [(e, y.tolist()) for e, _, y in got] == [
        (0, [92, 102, 40, 31, 57]), (0, [15, 80, 29, 21, 63]), (1, [46, 82, 55, 44, 99]), (1, [61, 5, 23, 43, 50])]
    assert float(sum((x * torch.arange(x.numel()).view_as(x)).sum() for _, x, _ in got)) == 32355.0


def grouped_data(sizes, augment: bool = False) -> D.TensorData:
    """index_data whose examples come in groups of the given sizes, interleaved (group of example i:
    ``groups[i]``), so that a rank's labels (indices) reveal the groups it drew from."""
    groups = torch.cat([torch.full((s,), g) for g, s in enumerate(sizes)])
    groups = groups[torch.randperm(len(groups), generator=D.seeded_generator(99))]
    data = index_data(len(groups), augment=augment, size=4 if augment else 1)
    data.groups = groups
    return data


@pytest.mark.parametrize("sizes,world,owned", [
    ((30, 41, 25, 52, 38), 2, [{0, 2, 4}, {1, 3}]),           # more groups than ranks: dealt round-robin
    ((30, 41, 25, 52, 38), 5, [{0}, {1}, {2}, {3}, {4}]),
    ((60, 44), 5, [{0}, {1}, {0}, {1}, {0}]),                 # more ranks than groups: ranks g, g+2, ... share g
])
def test_each_rank_draws_its_own_groups_only_disjoint_and_equally_long(sizes, world, owned):
    data, bs = grouped_data(sizes), 3
    nb = D.group_batches_per_epoch(data.groups, world, bs)
    sizes_per_rank = D.group_sizes(data.groups, world)
    assert nb == int(sizes_per_rank.min()) // bs                 # cut to the smallest rank's batches
    assert sizes_per_rank.sum() == len(data.groups)              # every example has one owner
    epochs = []
    for epoch in range(2):
        per_rank = [torch.cat([y for _, _, y in take(D.iterate_batches(data, r, world, bs, seed=3,
                                                                        start_iteration=epoch * nb), nb)])
                    for r in range(world)]
        epochs.append(per_rank)
        assert all(len(y) == nb * bs for y in per_rank)           # every rank steps the same number of times
        assert all(torch.equal(D.group_shard(data.groups, r, world, bs, 3, epoch), y) for r, y in enumerate(per_rank))
        for r, y in enumerate(per_rank):
            assert set(data.groups[y].tolist()) == owned[r], (r, set(data.groups[y].tolist()))
        union = torch.cat(per_rank)
        assert len(set(union.tolist())) == len(union)            # disjoint, sharers of a group included
    assert not torch.equal(epochs[0][0], epochs[1][0])            # reshuffled each epoch


def test_a_shared_group_is_split_evenly_among_its_ranks():
    data = grouped_data((60, 45))
    assert D.group_owners(2, 5) == [[0, 2, 4], [1, 3]] and D.group_owners(5, 2) == [[0], [1], [0], [1], [0]]
    assert D.group_sizes(data.groups, 5).tolist() == [20, 23, 20, 22, 20]


@pytest.mark.parametrize("start", [0, 1, 7, 8, 19])            # nb = 8: mid-epoch, boundary, later epoch
def test_a_grouped_stream_resumes_bitwise(start):
    data = grouped_data((30, 41, 25, 52, 38), augment=True)
    assert D.group_batches_per_epoch(data.groups, 3, 3) == 8      # rank 2's one group of 25
    full = take(D.iterate_batches(data, 1, 3, 3, seed=4), 24)
    resumed = take(D.iterate_batches(data, 1, 3, 3, seed=4, start_iteration=start), 24 - start)
    for (e1, x1, y1), (e2, x2, y2) in zip(full[start:], resumed):
        assert e1 == e2 and torch.equal(x1, x2) and torch.equal(y1, y2)


def test_a_rank_whose_groups_hold_no_full_batch_is_refused_naming_the_split():
    with pytest.raises(ValueError, match=r"dataset.split.*no full batch"):
        next(D.iterate_batches(grouped_data((40, 5)), 0, 2, 8, seed=0))


def test_by_label_deals_classes_and_leaves_the_test_set():
    pooled, split = D.digits(), D.digits(split="by_label")
    assert pooled.groups is None and torch.equal(split.groups, split.y_train)
    assert torch.equal(pooled.x_test, split.x_test) and torch.equal(pooled.x_train, split.x_train)
    _, _, y = next(D.iterate_batches(split, 1, 4, 64, seed=0))
    assert set(y.tolist()) <= {1, 5, 9}                          # class c to rank c mod 4


@pytest.mark.parametrize("dataset,split,allowed", [("digits", "by_source", "pooled, by_label"),
                                                   ("text", "by_source", "pooled"),
                                                   ("austen", "by_label", "pooled, by_source")])
def test_a_split_the_data_set_has_no_groups_for_is_refused_in_one_line(compose_cfg, dataset, split, allowed):
    from hydra.errors import ConfigCompositionException
    from gvq.schema.errors import describe
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg(f"dataset={dataset}", f"dataset.split={split}")
    assert describe(e.value) == f"dataset.split={split}: expected one of {allowed}"


def test_the_composed_split_reaches_the_loader_as_the_ranks_build_it(compose_cfg):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    cfg = OmegaConf.to_container(compose_cfg("dataset=digits", "dataset.split=by_label"), resolve=True)
    data = instantiate(cfg["dataset"])                           # as gvq.run.train.build does
    assert torch.equal(data.groups, data.y_train)
    assert instantiate(OmegaConf.to_container(compose_cfg("dataset=digits").dataset)).groups is None
