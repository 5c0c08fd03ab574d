"""scikit-learn's bundled 8x8 handwritten digits: no download, cached as arrays after the first read."""
from __future__ import annotations

import functools
import math
import os
import zipfile

import numpy as np
import torch

from gvq.data.tensors import TensorData, label_groups


def digits(test_fraction: float = 0.2, seed: int = 0, split: str = "pooled") -> TensorData:
    """sklearn's 1797 8x8 digits (0..16 -> /16), stratified split, normalised by train stats; ``split``:
    how ranks divide the training images (:func:`gvq.data.tensors.label_groups`)."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"dataset.test_fraction={test_fraction!r}: must be in (0, 1)")
    x, y, train, test = _digits_split(test_fraction, seed)
    xtr, xte, ytr, yte = x[train], x[test], y[train], y[test]
    mean, std = float(xtr.mean()), float(xtr.std())
    def norm(a):
        return torch.from_numpy((a - mean) / std).float()
    ytr = torch.from_numpy(ytr).long()
    return TensorData(norm(xtr), ytr, norm(xte), torch.from_numpy(yte).long(), num_classes=10, in_channels=1,
                      augment=False, groups=label_groups(ytr, split))


DIGITS_KEYS = ("x", "y", "train", "test")


def digits_cache_path(test_fraction: float, seed: int) -> str | None:
    """Where :func:`digits` keeps what scikit-learn gave for this split: ``$XDG_CACHE_HOME/gvq`` (else
    ``~/.cache/gvq``), keyed by the installed scikit-learn's version, so an upgrade asks it afresh.
    Why a cache: importing scikit-learn costs the launcher and every rank more than a short run trains."""
    from importlib import metadata
    try:
        version = metadata.version("scikit-learn")
    except metadata.PackageNotFoundError:
        return None                                  # not cached; importing scikit-learn says what is missing
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "gvq", f"digits-sklearn{version}-test{test_fraction!r}-seed{int(seed)}.npz")


def _digits_split(test_fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    """(x, y, train, test): read from the cache, else from scikit-learn (then cached; a cache that cannot
    be read or written is only slower, never wrong: it is rebuilt from scikit-learn)."""
    path = digits_cache_path(test_fraction, seed)
    try:
        with np.load(path, allow_pickle=False) as f:          # arrays only: nothing in the file runs
            return tuple(f[k] for k in DIGITS_KEYS)
    except (OSError, TypeError, KeyError, ValueError, zipfile.BadZipFile):   # absent, truncated, not ours
        pass
    x, y = digits_arrays()
    arrays = (x, y, *stratified_split(y, test_fraction, seed))
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.npz"                   # ranks may write at once: rename is atomic
        np.savez(tmp, **dict(zip(DIGITS_KEYS, arrays)))
        os.replace(tmp, path)
    except (OSError, TypeError):                                # read-only home, no version: not cached
        pass
    return arrays


@functools.lru_cache(maxsize=1)
def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Images (1797, 1, 8, 8) in [0, 1] and labels, from scikit-learn's ``load_digits``.  Imported here,
    not at module load: scikit-learn's import is a noticeable share of a run's start-up, and only
    ``dataset=digits`` needs it."""
    from sklearn.datasets import load_digits
    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    x.flags.writeable = y.flags.writeable = False  # shared: callers get split copies
    return x, y


def stratified_split(y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test indices, every class in proportion: scikit-learn's
    ``train_test_split(..., stratify=y, random_state=seed)``, the split gvq's runs have always used (a test
    pins a few indices, so a scikit-learn that changed it would be noticed).  A split too small to hold
    one example of every class is refused here, naming the option."""
    from sklearn.model_selection import train_test_split
    n_test = math.ceil(test_fraction * len(y))
    classes = len(np.unique(y))
    if min(n_test, len(y) - n_test) < classes:
        raise ValueError(f"dataset.test_fraction={test_fraction!r}: leaves a split of {len(y)} examples "
                         f"with fewer than one example of each of the {classes} classes")
    train, test = train_test_split(np.arange(len(y)), test_size=test_fraction, stratify=y,
                                   random_state=seed)
    return train, test

