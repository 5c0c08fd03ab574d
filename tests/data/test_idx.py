"""gvq/data/idx.py: Fashion-MNIST from its IDX files — where it is looked for, the checks (magic, shape,
checksum of the decompressed bytes), the stratified subset, the one-line refusals."""
from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from gvq import data as D
from gvq.data import idx
from tests.helpers.data import copy_fashion


def test_reads_the_real_files_as_uint8(fashion_root):
    d = D.fashion_mnist(str(fashion_root))
    assert d.x_train.shape == (60000, 1, 28, 28) and d.x_test.shape == (10000, 1, 28, 28)
    assert d.x_train.dtype == torch.uint8 and d.y_train.dtype == torch.int64
    assert (d.num_classes, d.in_channels, d.augment) == (10, 1, False)
    assert np.bincount(d.y_train.numpy()).tolist() == [6000] * 10
    assert np.bincount(d.y_test.numpy()).tolist() == [1000] * 10
    x = d.x_train.float() / 255                                # the stated stats are the data's own
    assert abs(x.mean().item() - d.mean[0]) < 1e-3 and abs(x.std().item() - d.std[0]) < 1e-3
    batch = d.inputs(d.x_train[:4096])                         # normalised per batch, as the model takes it
    assert batch.dtype == torch.float32 and abs(batch.mean().item()) < 0.05 and abs(batch.std().item() - 1) < 0.05


@pytest.mark.parametrize("gz,layout", [(True, ""), (False, ""), (False, "FashionMNIST/raw"),
                                       (True, "fashion-mnist")])
def test_found_gzipped_or_not_in_every_layout(fashion_root, tmp_path, monkeypatch, gz, layout):
    copy_fashion(tmp_path, gz=gz, layout=layout)
    monkeypatch.delenv("GVQ_DATA", raising=False)
    a = D.fashion_mnist(str(tmp_path), n_train=500)
    monkeypatch.setenv("GVQ_DATA", str(tmp_path))               # the environment's root, root unset
    assert idx.find_fashion(None).startswith(str(tmp_path))
    b = D.fashion_mnist(None, n_train=500)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)


def test_subset_is_stratified_seeded_and_a_subset(fashion_root):
    full = D.fashion_mnist(str(fashion_root))
    a = D.fashion_mnist(str(fashion_root), n_train=1003, seed=1)
    assert len(a) == 1003 and sorted(np.bincount(a.y_train.numpy()).tolist()) == [100] * 7 + [101] * 3
    assert torch.equal(a.x_train, D.fashion_mnist(str(fashion_root), n_train=1003, seed=1).x_train)
    assert not torch.equal(a.x_train, D.fashion_mnist(str(fashion_root), n_train=1003, seed=2).x_train)
    keep = idx.stratified_subset(full.y_train.numpy(), 1003, 1)
    assert torch.equal(full.x_train[keep], a.x_train) and len(set(keep.tolist())) == 1003
    assert a.x_test.shape[0] == 10000                           # the test set stays whole


def test_test_subset_is_stratified_and_leaves_training_whole(fashion_root):
    full = D.fashion_mnist(str(fashion_root))
    a = D.fashion_mnist(str(fashion_root), n_test=2000, seed=3)
    assert len(a) == 60000 and np.bincount(a.y_test.numpy()).tolist() == [200] * 10
    keep = idx.stratified_subset(full.y_test.numpy(), 2000, 3, key="dataset.n_test")
    assert torch.equal(full.x_test[keep], a.x_test)
    with pytest.raises(ValueError, match="dataset.n_test=5:"):
        D.fashion_mnist(str(fashion_root), n_test=5)


def test_stratified_subset_follows_unequal_shares():
    y = np.array([0] * 70 + [1] * 20 + [2] * 10)
    keep = idx.stratified_subset(y, 10, seed=0)
    assert np.bincount(y[keep]).tolist() == [7, 2, 1]
    with pytest.raises(ValueError, match="dataset.n_train=2:"):
        idx.stratified_subset(y, 2, seed=0)                     # fewer than one per class


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg and "dataset-fashion-mnist" in msg   # names the fix
    return msg


def test_truncated_file_is_refused_naming_it(fashion_root, tmp_path):
    folder = copy_fashion(tmp_path, gz=True)
    path = folder / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-200])                 # a cut download: the gzip stream ends early
    with pytest.raises(ValueError) as e:
        D.fashion_mnist(str(tmp_path))
    assert str(path) in _one_line(e)


def test_truncated_plain_file_fails_its_checksum(fashion_root, tmp_path):
    folder = copy_fashion(tmp_path, gz=False)
    path = folder / "train-labels-idx1-ubyte"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError) as e:
        D.fashion_mnist(str(tmp_path))
    assert str(path) in _one_line(e) and "checksum" in str(e.value)


def test_corrupt_bytes_fail_the_checksum(fashion_root, tmp_path):
    folder = copy_fashion(tmp_path, gz=True)
    path = folder / "t10k-images-idx3-ubyte.gz"
    raw = bytearray(gzip.decompress(path.read_bytes()))
    raw[5000] ^= 0xFF                                           # one pixel flipped: magic and size still right
    path.write_bytes(gzip.compress(bytes(raw), compresslevel=1))
    with pytest.raises(ValueError) as e:
        D.fashion_mnist(str(tmp_path))
    assert str(path) in _one_line(e) and "checksum mismatch" in str(e.value)


def test_swapped_file_fails_its_magic_number(fashion_root, tmp_path):
    folder = copy_fashion(tmp_path, gz=False)
    (folder / "t10k-labels-idx1-ubyte").write_bytes((folder / "t10k-images-idx3-ubyte").read_bytes())
    with pytest.raises(ValueError) as e:
        D.fashion_mnist(str(tmp_path))
    assert "t10k-labels-idx1-ubyte" in _one_line(e) and "magic 0x0803" in str(e.value)


def test_missing_everything_names_where_it_looked_and_the_package(tmp_path, monkeypatch):
    monkeypatch.setattr(idx, "DEBIAN_ROOT", str(tmp_path / "debian"))   # as on a machine without it
    monkeypatch.setenv("GVQ_DATA", str(tmp_path / "env"))
    with pytest.raises(FileNotFoundError) as e:
        D.fashion_mnist(None)
    msg = _one_line(e)
    assert str(tmp_path / "env") in msg and str(tmp_path / "debian") in msg and "apt-get install" in msg


def test_one_file_missing_is_named(fashion_root, tmp_path):
    folder = copy_fashion(tmp_path, gz=True)
    (folder / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError) as e:
        D.fashion_mnist(str(tmp_path))
    assert "train-labels-idx1-ubyte" in _one_line(e)
