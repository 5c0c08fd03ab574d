"""CIFAR-10 / CIFAR-100 from the standard python-format batches, read as data (never unpickling objects)."""
from __future__ import annotations

import os
import pickle

import numpy as np
import torch

from gvq.data.tensors import TensorData, label_groups

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


def cifar10(root: str = "data", download: bool = False, split: str = "pooled") -> TensorData:
    """CIFAR-10 from ``root/cifar-10-batches-py`` (or ``root`` being that folder)."""
    return _cifar(10, root, download, split)


def cifar100(root: str = "data", download: bool = False, split: str = "pooled") -> TensorData:
    """CIFAR-100 (fine labels) from ``root/cifar-100-python`` (or ``root`` being that folder)."""
    return _cifar(100, root, download, split)


def _cifar(classes: int, root: str, download: bool, split: str) -> TensorData:
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
    mean, std = CIFAR_STATS[classes]
    return TensorData(xtr, ytr, xte, yte, num_classes=classes, in_channels=3, mean=mean, std=std,
                      augment=True, groups=label_groups(ytr, split))   # split: gvq.data.tensors.label_groups


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
    except Exception:  # any failure means "not available"; caller reports it
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
    except Exception as e:  # a data file: whatever is wrong, it is not a CIFAR batch
        what = f"{type(e).__name__}: {e}" if not isinstance(e, KeyError) else f"no {e} entry"
        raise ValueError(f"{path}: not a CIFAR python batch ({str(what).splitlines()[0][:200]}); a data file "
                         "never runs code here -- check dataset.root") from None


def _read_batches(folder: str, files: list[str], key: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(_load_batch(os.path.join(folder, f), key) for f in files))
    return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))

