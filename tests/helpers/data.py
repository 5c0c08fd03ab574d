"""Data files as the loaders find them on disk, written small: fake CIFAR pickles, and Fashion-MNIST's
IDX files (the real ones copied, or made up to exercise the checks)."""
from __future__ import annotations

import gzip
import pickle
import shutil
import struct
import zlib
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


def write_digits_as_cifar(root: Path) -> Path:
    """scikit-learn's digits as CIFAR-10 python batches (8x8 scaled 4x to 32x32, three equal channels,
    1,500 to train in five files, 297 to test): CIFAR's format with images a CNN learns, as a user's own
    CIFAR-format data would be, since no CIFAR is bundled."""
    x, y = D.digits_arrays()
    pixels = np.kron(x[:, 0] * 255, np.ones((4, 4))).astype(np.uint8)
    return _write_as_cifar(root, pixels, y, 1500)


def write_fashion_as_cifar(root: Path) -> Path:
    """The real Fashion-MNIST as CIFAR-10 python batches (28x28 padded to 32x32, three equal channels;
    the first 50,000 training images in five files, the 10,000 test images): CIFAR's format and size at
    CIFAR's scale (docs/results.md, "Defaults on CIFAR-format data")."""
    d = D.fashion_mnist()
    x = np.concatenate([d.x_train[:50000].numpy(), d.x_test.numpy()])[:, 0]
    y = np.concatenate([d.y_train[:50000].numpy(), d.y_test.numpy()])
    return _write_as_cifar(root, np.pad(x, ((0, 0), (2, 2), (2, 2))), y, 50000)


def _write_as_cifar(root: Path, gray: np.ndarray, y: np.ndarray, n_train: int) -> Path:
    """(n, 32, 32) uint8 images and their labels as ``root/cifar-10-batches-py``: the first ``n_train`` in
    five training files, the rest in the test file."""
    pixels = np.repeat(gray[:, None], 3, axis=1).reshape(len(gray), -1)
    name, train, test, key, _ = D.CIFAR_LAYOUT[10]
    folder = root / name
    folder.mkdir(parents=True)
    bounds = np.linspace(0, n_train, len(train) + 1).astype(int)
    parts = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])] + [slice(n_train, len(gray))]
    for f, part in zip(train + test, parts):
        with open(folder / f, "wb") as fh:
            pickle.dump({b"data": pixels[part], key: y[part].tolist()}, fh)
    return root


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


# -- an R lazy-load database (Rdata.rdx + Rdata.rdb), as R writes one: XDR serialization, version 2 -----------

def _r_int(*values: int) -> bytes:
    return struct.pack(f">{len(values)}i", *values)


def _r_chars(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _r_int(9 | (1 << 15), len(raw)) + raw             # CHARSXP, UTF-8 flagged


def _r_strings(values) -> bytes:
    return _r_int(16, len(values)) + b"".join(_r_chars(v) for v in values)   # STRSXP


def _r_named_list(items: dict[str, bytes]) -> bytes:
    """VECSXP with a names attribute: the serialized values, then a pairlist (names = ...), then NILVALUE."""
    body = _r_int(19 | (1 << 9), len(items)) + b"".join(items.values())
    names = _r_int(2 | (1 << 10)) + _r_int(1) + _r_chars("names") + _r_strings(list(items))
    return body + names + _r_int(254)


def _r_serialized(obj: bytes) -> bytes:
    return b"X\n" + _r_int(2, 0x040200, 0x020300) + obj


def write_r_lazyload(folder: Path, objects: dict[str, list[str]]) -> Path:
    """``Rdata.rdx`` and ``Rdata.rdb`` holding each named character vector, as R's lazy-load database does."""
    folder.mkdir(parents=True, exist_ok=True)
    blocks, index, offset = [], {}, 0
    for name, lines in objects.items():
        raw = _r_serialized(_r_strings(lines))
        block = struct.pack(">I", len(raw)) + zlib.compress(raw)
        index[name] = _r_int(13, 2, offset, len(block))              # INTSXP c(offset, length)
        blocks.append(block)
        offset += len(block)
    (folder / "Rdata.rdb").write_bytes(b"".join(blocks))
    rdx = _r_named_list({"variables": _r_named_list(index), "references": _r_int(19, 0),
                         "compressed": _r_int(10, 1, 1)})
    (folder / "Rdata.rdx").write_bytes(gzip.compress(_r_serialized(rdx)))
    return folder
