"""Data files as the loaders find them on disk, written small: fake CIFAR pickles, and Fashion-MNIST's
IDX files (the real ones copied, or made up to exercise the checks)."""
from __future__ import annotations

import gzip
import pickle
import shutil
from pathlib import Path

import numpy as np

from gvq import data as D
from gvq.data import idx


def write_fake_cifar(root, classes: int, n: int = 4):
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


def fashion_source() -> Path | None:
    """The folder of the real Fashion-MNIST files (Debian's package, or GVQ_DATA's), or None."""
    try:
        return Path(idx.find_fashion(None))
    except FileNotFoundError:
        return None


def copy_fashion(dest: Path, gz: bool = True, layout: str = "") -> Path:
    """The four real files into ``dest/layout``, gzipped (as Debian ships them) or not.  A file already in
    the form asked for is copied as it is; one to gzip is gzipped at level 1 (level 9, gzip's default,
    takes tens of seconds for the 47 MB of training images, and the loader reads any level)."""
    src = fashion_source()
    folder = dest / layout if layout else dest
    folder.mkdir(parents=True, exist_ok=True)
    for name in idx.FASHION_SHA256:
        have = src / f"{name}.gz" if (src / f"{name}.gz").exists() else src / name
        want = folder / (name + ".gz" * gz)
        if (have.suffix == ".gz") == gz:
            shutil.copyfile(have, want)
            continue
        opener = gzip.open if have.suffix == ".gz" else open
        with opener(have, "rb") as fin, (gzip.open(want, "wb", compresslevel=1) if gz else open(want, "wb")) as fout:
            shutil.copyfileobj(fin, fout)
    return folder
