"""Fashion-MNIST from its four IDX files (gzipped or not), verified, kept as uint8; nothing downloads.

Where the files are looked for, first folder holding all four wins: ``dataset.root`` if set, else
``$GVQ_DATA``, then Debian's package ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``);
in each, the folder itself, ``fashion-mnist/`` and torchvision's ``FashionMNIST/raw/``.  Every file is
checked for its IDX magic number, its shape and the SHA-256 of its decompressed bytes (Debian recompressed
the ``.gz`` members, so only the decompressed bytes have one true checksum).
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import os
import zlib

import numpy as np
import torch

from gvq.data.tensors import TensorData, label_groups

DEBIAN_ROOT = "/usr/share/datasets/fashion-mnist"
LAYOUTS = ("", "fashion-mnist", os.path.join("FashionMNIST", "raw"))   # under each searched folder
#: split -> (images file, labels file), as upstream names them (each may carry a .gz suffix)
FASHION_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                 "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
#: file -> (SHA-256 of the decompressed bytes, shape): the upstream release (zalandoresearch, 2017)
FASHION_SHA256 = {
    "train-images-idx3-ubyte": ("c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
                                (60000, 28, 28)),
    "train-labels-idx1-ubyte": ("bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9", (60000,)),
    "t10k-images-idx3-ubyte": ("5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
                               (10000, 28, 28)),
    "t10k-labels-idx1-ubyte": ("0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34", (10000,)),
}
FASHION_STATS = ((0.2860,), (0.3530,))   # mean, std of the 60,000 training images in [0, 1]
FIX = ("install Debian's package as root (apt-get install dataset-fashion-mnist, or make setup), "
       "or set dataset.root (or GVQ_DATA) to a folder holding the four IDX files")


def fashion_mnist(root: str | None = None, n_train: int | None = None, seed: int = 0,
                  n_test: int | None = None, split: str = "pooled") -> TensorData:
    """Fashion-MNIST: 60,000 / 10,000 images 1x28x28, 10 classes; ``n_train`` / ``n_test`` keep a
    stratified, seeded subset of the training / test images (``None``: all of them); ``split``: how ranks
    divide the training images (:func:`gvq.data.tensors.label_groups`)."""
    folder = find_fashion(root)
    (xtr, ytr), (xte, yte) = (_read_split(folder, split) for split in ("train", "test"))
    if n_train is not None:
        keep = stratified_subset(ytr, n_train, seed)
        xtr, ytr = xtr[keep], ytr[keep]
    if n_test is not None:
        keep = stratified_subset(yte, n_test, seed, key="dataset.n_test")
        xte, yte = xte[keep], yte[keep]
    def as_images(a):                  # a writable (n, 1, 28, 28) copy
        return torch.from_numpy(np.array(a)).unsqueeze(1)
    mean, std = FASHION_STATS
    ytr = torch.from_numpy(ytr)
    return TensorData(as_images(xtr), ytr, as_images(xte), torch.from_numpy(yte), num_classes=10, in_channels=1,
                      augment=False, mean=mean, std=std, groups=label_groups(ytr, split))


def search_roots(root: str | None) -> list[str]:
    """The roots looked under, in order: ``dataset.root`` alone if set, else ``$GVQ_DATA`` and Debian's."""
    if root:
        return [os.path.expanduser(str(root))]
    return ([os.environ["GVQ_DATA"]] if os.environ.get("GVQ_DATA") else []) + [DEBIAN_ROOT]


def _file_in(folder: str, name: str) -> str | None:
    for candidate in (os.path.join(folder, name), os.path.join(folder, name + ".gz")):
        if os.path.isfile(candidate):
            return candidate
    return None


def find_fashion(root: str | None) -> str:
    """The first searched folder that holds all four files; FileNotFoundError in one line otherwise."""
    names = [n for pair in FASHION_FILES.values() for n in pair]
    roots = search_roots(root)
    folders = [os.path.join(r, sub) if sub else r for r in roots for sub in LAYOUTS]
    for folder in folders:
        if all(_file_in(folder, n) for n in names):
            return folder
    for folder in folders:                  # some but not all: name the first missing file there
        missing = [n for n in names if not _file_in(folder, n)]
        if len(missing) < len(names):
            raise FileNotFoundError(f"{os.path.join(folder, missing[0])}[.gz]: missing (Fashion-MNIST "
                                    f"needs all four IDX files); {FIX}")
    raise FileNotFoundError(f"dataset=fashion_mnist: no Fashion-MNIST under {', '.join(roots)}; {FIX}")


def _read_split(folder: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    images, labels = FASHION_FILES[split]
    x, y = (read_idx(_file_in(folder, n), *FASHION_SHA256[n]) for n in (images, labels))
    return x, y.astype(np.int64)


def read_idx(path: str, sha256: str, shape: tuple[int, ...]) -> np.ndarray:
    """The uint8 array of one IDX file; a ValueError naming the file and the fix when it is truncated,
    corrupt or another file.  Cached per (path, size, mtime): every rank and the launcher's check read it."""
    st = os.stat(path)
    return _read_idx(path, st.st_size, st.st_mtime_ns, sha256, shape)


@functools.lru_cache(maxsize=4)
def _read_idx(path: str, size: int, mtime: int, sha256: str, shape: tuple[int, ...]) -> np.ndarray:
    try:
        raw = _decompressed(path)
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: unreadable ({type(e).__name__}: {str(e)[:120]}); {FIX}") from None
    magic = 0x0800 | len(shape)          # unsigned bytes, len(shape) dimensions
    head = np.frombuffer(raw[:4 * (1 + len(shape))], dtype=">u4")
    if len(head) < 1 + len(shape) or head[0] != magic or tuple(int(d) for d in head[1:]) != shape:
        got = "too short" if len(head) < 1 + len(shape) else f"magic {int(head[0]):#06x}, shape {tuple(head[1:])}"
        raise ValueError(f"{path}: not the Fashion-MNIST IDX file expected (want magic {magic:#06x}, "
                         f"shape {shape}; {got}); {FIX}")
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256:
        raise ValueError(f"{path}: checksum mismatch (sha256 {digest[:16]}, want {sha256[:16]}; "
                         f"{len(raw):,} bytes): truncated or corrupt; {FIX}")
    out = np.frombuffer(raw, dtype=np.uint8, offset=len(head) * 4).reshape(shape)
    out.flags.writeable = False          # shared by every caller: subsets are copies
    return out


def _decompressed(path: str) -> bytes:
    with open(path, "rb") as fh:
        head = fh.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open   # by content, not by name
    with opener(path, "rb") as fh:
        return fh.read()


def stratified_subset(y: np.ndarray, n: int, seed: int, key: str = "dataset.n_train") -> np.ndarray:
    """Sorted indices of ``n`` examples, every class in proportion to its share of ``y`` (largest
    remainders round), each class's examples drawn by a generator seeded with ``seed``."""
    classes, counts = np.unique(y, return_counts=True)
    if not len(classes) <= n <= len(y):
        raise ValueError(f"{key}={n}: must be between the {len(classes)} classes and the "
                         f"{len(y)} examples of its split")
    exact = counts * n / len(y)
    take = np.floor(exact).astype(int)
    take[np.argsort(-(exact - take), kind="stable")[: n - take.sum()]] += 1
    rng = np.random.default_rng(seed)
    keep = [rng.permutation(np.flatnonzero(y == c))[:k] for c, k in zip(classes, take)]
    return np.sort(np.concatenate(keep))
