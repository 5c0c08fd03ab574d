"""Data sets held in memory as tensors, and the sharded, resumable batch stream each rank trains on.

Loaders are built from Hydra (``conf/dataset/*.yaml``) and return a :class:`TensorData`::

    python cli.py dataset=digits                     # scikit-learn's load_digits, no download
    python cli.py dataset=cifar100 dataset.root=/data  # reads /data/cifar-100-python/{train,test}
    python cli.py dataset=synthetic                  # CIFAR-shaped random data, for benchmarks

Training is iteration-based: :func:`iterate_batches` yields ``(epoch, x, y)`` forever.  Every epoch
is one permutation shared by all ranks (seeded by ``(seed, epoch)``); rank r takes
``perm[r::world]`` cut to whole batches, so shards are disjoint and equally long.  Everything
random is a pure function of ``(seed, epoch, rank, batch)``, so starting at iteration ``i`` gives
exactly the batches a run that got there by stepping would see.
"""
from __future__ import annotations

import functools
import math
import os
import pickle
import zipfile
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

CIFAR_STATS = {  # per-channel mean/std of the training images (values in [0, 1])
    10: ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    100: ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
CIFAR_LAYOUT = {  # classes -> (folder, train files, test files, label key, archive url)
    10: ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
         b"labels", "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
    100: ("cifar-100-python", ["train"], ["test"], b"fine_labels",
          "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
}
AUG_PAD = 4  # pixels of zero padding before the random crop (He et al. 2016, sec. 4.2)


@dataclass
class TensorData:
    """Train/test tensors: x ``(N, C, H, W)`` float32 normalised, y int64 class indices."""
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    in_channels: int
    augment: bool = False  # pad-and-crop + horizontal flip on training batches

    def __len__(self) -> int:
        return len(self.y_train)


def _seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integer parts (nearby tuples give unrelated streams)."""
    words = [int(p) & 0xFFFFFFFF for p in parts]
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0] >> 1)


def _generator(*parts: int) -> torch.Generator:
    return torch.Generator().manual_seed(_seed(*parts))


# ---------------------------------------------------------------------------------------- loaders

def digits(test_fraction: float = 0.2, seed: int = 0) -> TensorData:
    """sklearn's 1797 8x8 digits (0..16 -> /16), stratified split, normalised by train stats."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"dataset.test_fraction={test_fraction!r}: must be in (0, 1)")
    x, y, train, test = _digits_split(test_fraction, seed)
    xtr, xte, ytr, yte = x[train], x[test], y[train], y[test]
    mean, std = float(xtr.mean()), float(xtr.std())
    norm = lambda a: torch.from_numpy((a - mean) / std).float()  # noqa: E731
    return TensorData(norm(xtr), torch.from_numpy(ytr).long(), norm(xte),
                      torch.from_numpy(yte).long(), num_classes=10, in_channels=1, augment=False)


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
    x, y = _digits_arrays()
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
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
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


def cifar10(root: str = "data", download: bool = False) -> TensorData:
    """CIFAR-10 from ``root/cifar-10-batches-py`` (or ``root`` being that folder)."""
    return _cifar(10, root, download)


def cifar100(root: str = "data", download: bool = False) -> TensorData:
    """CIFAR-100 (fine labels) from ``root/cifar-100-python`` (or ``root`` being that folder)."""
    return _cifar(100, root, download)


def _cifar(classes: int, root: str, download: bool) -> TensorData:
    root = os.path.expanduser(str(root))
    folder = _find_cifar(classes, root)
    if folder is None and download:
        _download_cifar(classes, root)
        folder = _find_cifar(classes, root)
    if folder is None:
        raise FileNotFoundError(_missing_message(classes, root))
    _, train, test, key, _ = CIFAR_LAYOUT[classes]
    xtr, ytr = _read_batches(folder, train, key)
    xte, yte = _read_batches(folder, test, key)
    mean, std = (torch.tensor(s).view(1, 3, 1, 1) for s in CIFAR_STATS[classes])
    norm = lambda a: (a.float().div_(255.0) - mean) / std  # noqa: E731
    return TensorData(norm(xtr), ytr, norm(xte), yte, num_classes=classes, in_channels=3,
                      augment=True)


def _find_cifar(classes: int, root: str) -> str | None:
    """The folder holding all CIFAR files: ``root/<folder>`` or ``root`` itself, else None."""
    name, train, test, _, _ = CIFAR_LAYOUT[classes]
    for folder in (os.path.join(root, name), root):
        if all(os.path.isfile(os.path.join(folder, f)) for f in train + test):
            return folder
    return None


def _missing_message(classes: int, root: str) -> str:
    name, train, test, _, url = CIFAR_LAYOUT[classes]
    files = ",".join(train + test + (["meta"] if classes == 100 else ["batches.meta"]))
    return (f"dataset.root={root}: CIFAR-{classes} not found; put {name}/{{{files}}} from {url} "
            f"under {root} (or set dataset.download=true where torchvision works)")


def _download_cifar(classes: int, root: str) -> None:
    """Fetch with torchvision if it imports here; failures fall through to the FileNotFoundError."""
    try:
        import torchvision  # lazily: it fails to import on some machines (missing C++ ops)
        cls = torchvision.datasets.CIFAR10 if classes == 10 else torchvision.datasets.CIFAR100
        cls(root, train=True, download=True)
        cls(root, train=False, download=True)
    except Exception:  # noqa: BLE001 - any failure means "not available"; caller reports it
        pass


#: what a CIFAR python batch may ask the unpickler for: numpy arrays and their dtypes, nothing callable else
_CIFAR_GLOBALS = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                  ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.numeric", "_frombuffer"),
                  ("numpy._core.numeric", "_frombuffer"), ("_codecs", "encode")}


class _DataOnly(pickle.Unpickler):
    """A data file is data: the pickle may rebuild arrays, never import or call anything else."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _CIFAR_GLOBALS:
            raise pickle.UnpicklingError(f"asks for {module}.{name}, which a CIFAR batch never does")
        return super().find_class(module, name)


def _load_batch(path: str, key: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Images (n, 3, 32, 32) uint8 and labels of one batch file; a ValueError naming the file otherwise."""
    try:
        with open(path, "rb") as fh:
            d = _DataOnly(fh, encoding="bytes").load()
        x = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        y = np.asarray(d[key], dtype=np.int64).reshape(-1)
        if len(x) != len(y):
            raise ValueError(f"{len(x)} images but {len(y)} labels")
        return x, y
    except Exception as e:  # noqa: BLE001 - a data file: whatever is wrong, it is not a CIFAR batch
        what = f"{type(e).__name__}: {e}" if not isinstance(e, KeyError) else f"no {e} entry"
        raise ValueError(f"{path}: not a CIFAR python batch ({str(what).splitlines()[0][:200]}); a data file "
                         "never runs code here -- check dataset.root") from None


def _read_batches(folder: str, files: list[str], key: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(_load_batch(os.path.join(folder, f), key) for f in files))
    return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))


def synthetic(num_classes: int = 100, n_train: int = 2048, n_test: int = 512,
              image_size: int = 32, channels: int = 3, seed: int = 0) -> TensorData:
    """Gaussian images around a per-class random mean image (learnable), for benchmarks only."""
    g = _generator(seed, 0x5E7)
    means = 0.5 * torch.randn(num_classes, channels, image_size, image_size, generator=g)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(num_classes, (n,), generator=g)
        return means[y] + torch.randn(n, channels, image_size, image_size, generator=g), y

    (xtr, ytr), (xte, yte) = draw(n_train), draw(n_test)
    return TensorData(xtr, ytr, xte, yte, num_classes=num_classes, in_channels=channels,
                      augment=False)


# ---------------------------------------------------------------------------------------- batches

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
    perm = torch.randperm(n, generator=_generator(seed, epoch))  # same on every rank
    return perm[rank::world_size][:batches_per_epoch(n, world_size, batch_size) * batch_size]


def iterate_batches(data: TensorData, rank: int, world_size: int, batch_size: int, seed: int,
                    start_iteration: int = 0) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield ``(epoch, x, y)`` forever, starting at global iteration ``start_iteration``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} outside [0, world_size={world_size})")
    n = len(data.y_train)
    nb = batches_per_epoch(n, world_size, batch_size)
    epoch, b = divmod(int(start_iteration), nb)
    while True:
        shard = epoch_shard(n, rank, world_size, batch_size, seed, epoch)
        for b in range(b, nb):
            idx = shard[b * batch_size:(b + 1) * batch_size]
            x = data.x_train[idx]
            if data.augment:
                # Seeded per batch (not per epoch): a resumed run needs no replay of earlier draws.
                x = augment_batch(x, _generator(seed, rank, epoch, b))
            yield epoch, x, data.y_train[idx]
        epoch, b = epoch + 1, 0


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
        yield data.x_test[i:i + batch_size], data.y_test[i:i + batch_size]


test_batches.__test__ = False  # not a pytest test, despite the name
