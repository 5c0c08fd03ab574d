"""Models (parameter counts, shapes, depth validation) and data (loaders, shards, resume, augmentation).

    .venv/bin/python -m pytest -q tests/test_models_data.py
"""
from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate

from gvq import data as D
from gvq import models as M


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def conv_weights_by_width(model) -> dict[int, int]:
    out: dict[int, int] = {}
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            out[m.out_channels] = out.get(m.out_channels, 0) + m.weight.numel()
    return out


# ------------------------------------------------------------------------------------------ models

def test_resnet32_cifar100_counts():
    model = M.resnet32(num_classes=100)
    assert n_params(model) == 470_004
    widths = conv_weights_by_width(model)
    assert widths == {16: 23_472, 32: 87_552, 64: 350_208}
    assert sum(widths.values()) == 461_232
    assert not any(isinstance(m, torch.nn.Conv2d) and m.bias is not None for m in model.modules())


@pytest.mark.parametrize("fn,depth,expected", [  # the published option-A counts for 10 classes
    (M.resnet20, 20, 269_722), (M.resnet32, 32, 464_154),
    (M.resnet56, 56, 853_018), (M.resnet110, 110, 1_727_962)])
def test_resnet_family_counts(fn, depth, expected):
    model = fn(num_classes=10)
    assert n_params(model) == expected
    n = (depth - 2) // 6
    # Weighted layers: stem + 2 convs per block + fc = 6n + 2; no 1x1 projection convs (option A).
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) + 1 == depth
    assert all(c.kernel_size == (3, 3) for c in convs)
    bn = 2 * (16 + 2 * n * (16 + 32 + 64))
    assert n_params(model) == sum(conv_weights_by_width(model).values()) + bn + 64 * 10 + 10


def test_forward_shapes():
    x = torch.randn(2, 3, 32, 32)
    assert M.resnet20(num_classes=100)(x).shape == (2, 100)
    assert M.ResNet(14, num_classes=7, in_channels=1)(torch.randn(3, 1, 8, 8)).shape == (3, 7)
    cnn = M.DigitsCNN(num_classes=10, in_channels=1)
    assert cnn(torch.randn(4, 1, 8, 8)).shape == (4, 10)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in cnn.modules())
    assert len(list(cnn.buffers())) == 0
    conv = sum(p.numel() for p in cnn.parameters() if p.dim() == 4)
    assert conv / n_params(cnn) > 0.85


@pytest.mark.parametrize("depth", [21, 2, 33, 0])
def test_bad_depth_raises(depth):
    with pytest.raises(ValueError, match="model.depth"):
        M.ResNet(depth, num_classes=10)


def test_shortcut_a_subsamples_and_zero_pads():
    x = torch.randn(2, 16, 8, 8)
    y = M.ShortcutA(16, 32, stride=2)(x)
    assert y.shape == (2, 32, 4, 4)
    assert torch.equal(y[:, 8:24], x[:, :, ::2, ::2])
    assert y[:, :8].abs().sum() == 0 and y[:, 24:].abs().sum() == 0


def test_kaiming_init_scale():
    conv = M.resnet56(num_classes=10).layer3[0].conv2.weight  # fan_in 576 -> std sqrt(2/576)
    assert abs(conv.std().item() - math.sqrt(2 / 576)) < 0.005


def test_digits_cnn_learns(one_thread):
    torch.manual_seed(0)
    d, model = D.digits(), M.DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    iters = 200
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 * (1 + math.cos(math.pi * i / iters)))
    batches = D.iterate_batches(d, 0, 1, 64, seed=0)
    for _ in range(iters):
        _, x, y = next(batches)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        acc = (model(d.x_test).argmax(1) == d.y_test).float().mean().item()
    assert acc >= 0.93, acc


# -------------------------------------------------------------------------------------- datasets

def test_digits_split():
    a, b = D.digits(), D.digits()
    assert a.x_train.shape == (1437, 1, 8, 8) and a.x_test.shape == (360, 1, 8, 8)
    assert a.x_train.dtype == torch.float32 and a.y_train.dtype == torch.int64
    assert (a.num_classes, a.in_channels, a.augment) == (10, 1, False)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert abs(a.x_train.mean().item()) < 1e-4 and abs(a.x_train.std().item() - 1) < 1e-3
    # The 1797 digit images are all distinct, so disjoint splits share no image.
    train = {r.numpy().tobytes() for r in a.x_train.flatten(1)}
    assert not any(r.numpy().tobytes() in train for r in a.x_test.flatten(1))
    assert torch.bincount(a.y_test, minlength=10).min() >= 35  # stratified: ~36 per class
    assert not torch.equal(D.digits(seed=1).y_test, a.y_test)


@pytest.mark.parametrize("fraction", [0.2, 0.013, 0.33, 0.77])
def test_digits_are_scikit_learns(fraction, tmp_path, monkeypatch):
    """The images and each split are scikit-learn's public ``load_digits`` and ``train_test_split``, index
    for index, whether read fresh or from the cache."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ref = load_digits()
    x, y = D._digits_arrays()
    assert np.array_equal(x[:, 0], (ref.images / 16).astype(np.float32)) and np.array_equal(y, ref.target)
    for seed in (0, 1, 123):
        theirs = train_test_split(np.arange(len(y)), test_size=fraction, stratify=y, random_state=seed)
        for _ in ("fresh", "cached"):
            d = D.digits(test_fraction=fraction, seed=seed)
            assert torch.equal(d.y_test, torch.from_numpy(y[theirs[1]])), (fraction, seed)
            assert torch.equal(d.y_train, torch.from_numpy(y[theirs[0]])), (fraction, seed)
        assert os.path.isfile(D.digits_cache_path(fraction, seed))


def test_digits_split_is_pinned():
    """The default split, pinned: runs keep their data across scikit-learn versions, or this says why not."""
    train, test = D.stratified_split(D._digits_arrays()[1], 0.2, 0)
    assert (len(train), len(test)) == (1437, 360)
    assert test[:8].tolist() == [1496, 188, 705, 820, 413, 744, 1466, 500]
    assert train[:8].tolist() == [1346, 295, 257, 385, 1640, 849, 640, 757]


@pytest.mark.slow
def test_digits_cache_spares_the_import_and_survives_damage(tmp_path):
    """A second run reads the cache and never imports scikit-learn (its import is most of a short run's
    data time); a damaged cache file is rebuilt, never trusted; importing gvq.data imports nothing of it."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    code = ("import gvq.data as D, sys; d = D.digits(); "
            "print('sklearn' in sys.modules, float(d.x_test.sum()), D.digits_cache_path(0.2, 0))")
    run = lambda: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,  # noqa: E731
                                 check=True, env=env).stdout.split()
    fresh, cached = run(), run()
    assert fresh[0] == "True" and cached[0] == "False"
    assert abs(float(fresh[1]) - float(cached[1])) < 1e-3 and cached[2].startswith(str(tmp_path))
    with open(cached[2], "wb") as fh:
        fh.write(b"PK\x03\x04 not a zip")
    assert run()[0] == "True" and run()[0] == "False"      # rebuilt from scikit-learn, then cached again
    out = subprocess.run([sys.executable, "-c", "import gvq.data, sys; print('sklearn' in sys.modules)"],
                         capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False"


def test_digits_refuses_a_split_without_every_class(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="fewer than one example of each"):
        D.digits(test_fraction=0.001)   # 2 test examples for 10 classes
    assert not list(tmp_path.rglob("*.npz"))


def test_synthetic_shapes_and_learnable():
    s = D.synthetic(num_classes=5, n_train=200, n_test=50, image_size=16, channels=2, seed=3)
    assert s.x_train.shape == (200, 2, 16, 16) and s.x_test.shape == (50, 2, 16, 16)
    assert (s.num_classes, s.in_channels, s.augment) == (5, 2, False)
    assert s.y_train.max() < 5 and s.y_train.dtype == torch.int64
    assert torch.equal(s.x_train, D.synthetic(5, 200, 50, 16, 2, seed=3).x_train)
    means = torch.stack([s.x_train[s.y_train == c].mean(0) for c in range(5)]).flatten(1)
    pred = torch.cdist(s.x_test.flatten(1), means).argmin(1)
    assert (pred == s.y_test).float().mean() > 0.9


def _write_fake_cifar(root, classes: int, n: int = 4):
    """A CIFAR pickle tree like the real one, n images per file, pixel value = file index + image."""
    name, train, test, key, _ = D.CIFAR_LAYOUT[classes]
    folder = root / name
    folder.mkdir(parents=True)
    for i, f in enumerate(train + test):
        pixels = np.repeat((np.arange(n) + 10 * i)[:, None], 3072, axis=1).astype(np.uint8)
        d = {b"data": pixels, key: [(j + i) % classes for j in range(n)]}
        if classes == 100:
            d[b"coarse_labels"] = [99] * n  # must not be read
        with open(folder / f, "wb") as fh:
            pickle.dump(d, fh)
    return folder


@pytest.mark.parametrize("classes", [10, 100])
def test_cifar_reads_pickles(tmp_path, classes):
    folder = _write_fake_cifar(tmp_path, classes)
    loader = D.cifar10 if classes == 10 else D.cifar100
    ds = loader(str(tmp_path))
    ntrain = 4 * (5 if classes == 10 else 1)
    assert ds.x_train.shape == (ntrain, 3, 32, 32) and ds.x_test.shape == (4, 3, 32, 32)
    assert (ds.num_classes, ds.in_channels, ds.augment) == (classes, 3, True)
    assert ds.y_train.tolist() == [(j + i) % classes for i in range(ntrain // 4) for j in range(4)]
    mean, std = D.CIFAR_STATS[classes]
    # Test file is the last one written: image j has pixel value 10 * (files - 1) + j.
    v = 10 * (ntrain // 4) + 2
    expect = torch.tensor([(v / 255 - m) / s for m, s in zip(mean, std)])
    assert torch.allclose(ds.x_test[2, :, 5, 7], expect, atol=1e-5)
    direct = loader(str(folder))  # root may also be the extracted folder itself
    assert torch.equal(direct.x_train, ds.x_train)


@pytest.mark.parametrize("classes", [10, 100])
def test_cifar_missing_message(tmp_path, monkeypatch, classes):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import fails, as on this machine
    loader = D.cifar10 if classes == 10 else D.cifar100
    with pytest.raises(FileNotFoundError) as e:
        loader(str(tmp_path), download=True)
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path) in msg
    name, train, test, _, url = D.CIFAR_LAYOUT[classes]
    assert name in msg and url in msg and all(f in msg for f in train + test)
    folder = _write_fake_cifar(tmp_path, classes)
    (folder / test[0]).unlink()  # an incomplete tree is missing too
    with pytest.raises(FileNotFoundError):
        loader(str(tmp_path))


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
        perm = torch.randperm(n, generator=D._generator(7, epoch))
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
    a = D.augment_batch(x, D._generator(1))
    assert a.shape == x.shape
    assert torch.equal(a, D.augment_batch(x, D._generator(1)))
    assert not torch.equal(a, D.augment_batch(x, D._generator(2)))
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


# ------------------------------------------------------------------------------------------- hydra

@pytest.mark.parametrize("model,dataset,classes,chans", [
    ("cnn", "digits", 10, 1), ("resnet20", "cifar10", 10, 3), ("resnet32", "cifar100", 100, 3),
    ("resnet56", "synthetic", 100, 3), ("resnet110", "digits", 10, 1)])
def test_yaml_instantiates(compose_cfg, tmp_path, monkeypatch, model, dataset, classes, chans):
    monkeypatch.setenv("GVQ_DATA", str(tmp_path))
    if dataset.startswith("cifar"):
        _write_fake_cifar(tmp_path, classes)
    cfg = compose_cfg(f"model={model}", f"dataset={dataset}")
    ds = instantiate(cfg.dataset)
    assert (ds.num_classes, ds.in_channels) == (classes, chans)
    net = instantiate(cfg.model, num_classes=ds.num_classes, in_channels=ds.in_channels)
    with torch.no_grad():
        assert net(ds.x_test[:2]).shape == (2, classes)


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_cifar_batch_that_would_run_code_is_refused_naming_the_file(tmp_path):
    folder = _write_fake_cifar(tmp_path, 10)
    marker = tmp_path / "pwned"
    with open(folder / "data_batch_1", "wb") as fh:
        pickle.dump({b"data": _RunsCode(marker), b"labels": [0]}, fh)
    with pytest.raises(ValueError) as e:
        D.cifar10(str(tmp_path))
    msg = str(e.value)
    assert "data_batch_1" in msg and "\n" not in msg and "posix.system" in msg
    assert not marker.exists()
