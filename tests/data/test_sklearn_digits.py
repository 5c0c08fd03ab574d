"""gvq/data/sklearn_digits.py: the split, its cache, scikit-learn's arrays."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from gvq import data as D


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
    x, y = D.digits_arrays()
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
    train, test = D.stratified_split(D.digits_arrays()[1], 0.2, 0)
    assert (len(train), len(test)) == (1437, 360)
    assert test[:8].tolist() == [1496, 188, 705, 820, 413, 744, 1466, 500]
    assert train[:8].tolist() == [1346, 295, 257, 385, 1640, 849, 640, 757]


@pytest.mark.slow
def test_digits_cache_spares_the_import_and_survives_damage(tmp_path):
    """A second run reads the cache and never imports scikit-learn (its import is most of a short run's
    data time); a damaged cache file is rebuilt, never trusted; importing gvq.data imports nothing of it."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    code = ("import gvq.data as D, sys; on_import = 'sklearn' in sys.modules; d = D.digits(); "
            "print('sklearn' in sys.modules, float(d.x_test.sum()), D.digits_cache_path(0.2, 0), on_import)")
    def run():
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env=env).stdout.split()

    fresh, cached = run(), run()
    assert fresh[0] == "True" and cached[0] == "False"
    assert fresh[3] == cached[3] == "False"                 # importing gvq.data imports nothing of it
    assert abs(float(fresh[1]) - float(cached[1])) < 1e-3 and cached[2].startswith(str(tmp_path))
    with open(cached[2], "wb") as fh:
        fh.write(b"PK\x03\x04 not a zip")
    assert run()[0] == "True" and run()[0] == "False"      # rebuilt from scikit-learn, then cached again


def test_digits_refuses_a_split_without_every_class(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="fewer than one example of each"):
        D.digits(test_fraction=0.001)   # 2 test examples for 10 classes
    assert not list(tmp_path.rglob("*.npz"))
