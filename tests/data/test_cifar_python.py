"""gvq/data/cifar_python.py: CIFAR python batches read as data."""
from __future__ import annotations

import os
import pickle
import sys

import pytest
import torch

from gvq import data as D
from tests.helpers.data import write_fake_cifar




@pytest.mark.parametrize("classes", [10, 100])
def test_cifar_reads_pickles(tmp_path, classes):
    folder = write_fake_cifar(tmp_path, classes)
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
    assert ds.x_test.dtype == torch.uint8   # bytes in memory, normalised per batch
    assert torch.allclose(ds.inputs(ds.x_test)[2, :, 5, 7], expect, atol=1e-5)
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
    folder = write_fake_cifar(tmp_path, classes)
    (folder / test[0]).unlink()  # an incomplete tree is missing too
    with pytest.raises(FileNotFoundError):
        loader(str(tmp_path))


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_cifar_batch_that_would_run_code_is_refused_naming_the_file(tmp_path):
    folder = write_fake_cifar(tmp_path, 10)
    marker = tmp_path / "pwned"
    with open(folder / "data_batch_1", "wb") as fh:
        pickle.dump({b"data": _RunsCode(marker), b"labels": [0]}, fh)
    with pytest.raises(ValueError) as e:
        D.cifar10(str(tmp_path))
    msg = str(e.value)
    assert "data_batch_1" in msg and "\n" not in msg and "posix.system" in msg
    assert not marker.exists()
