"""Jane Austen's six novels from Debian's ``r-cran-janeaustenr``, as a text corpus; nothing downloads.

The package keeps the novels in an R lazy-load database: ``data/Rdata.rdx`` (gzip of one serialized R
list: each object's offset and length in the ``.rdb``) and ``data/Rdata.rdb`` (per object: a 4-byte
big-endian length, then a zlib stream of its R serialization, a character vector of the novel's lines).
The ``rdata`` package parses R's serialization; only serialized vectors are read, nothing runs.  Joined
(lines by ``\\n``, each novel ending in ``\\n``, in publication order) the text has one SHA-256, checked,
then cached as plain bytes (``$XDG_CACHE_HOME/gvq``): decoding costs each rank more than a short run.
*Persuasion*, the last, is held out.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import struct
import warnings
import zlib

from gvq.data.tokens import TokenData, text_windows

NOVELS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion")
AUSTEN_SHA256 = "f2516f2139e3cecf49657122fed58ac46313f1fdff32a26fc66789293e92d573"
AUSTEN_BYTES = 4_025_029
PERSUASION_BYTES = 466_854     # the last novel, held out
#: each training novel's bytes as joined, in NOVELS' order: which novel a window is from (dataset.split=by_source)
NOVEL_BYTES = (673_688, 684_768, 883_280, 883_028, 433_411)
R_LIBRARY = "/usr/lib/R/site-library"
#: under each searched root, where the package's data/ folder may be (as installed; as ``dpkg-deb -x``
#: leaves it in a folder of one's own)
LAYOUTS = ("", "data", os.path.join("janeaustenr", "data"),
           os.path.join("usr", "lib", "R", "site-library", "janeaustenr", "data"))
FIX = ("run make setup (as root it unpacks Debian's r-cran-janeaustenr without R: apt-get download "
       "r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_*.deb DIR), then set GVQ_DATA=DIR or dataset.root=DIR")


def austen(root: str | None = None, context: int = 64, n_test: int | None = 256, tokenizer: str = "bytes",
           vocab_size: int = 1024, split: str = "pooled") -> TokenData:
    """Five novels to train on, windows of *Persuasion* held out (``n_test`` spread evenly; ``None``: all);
    bytes, or a BPE of ``vocab_size`` learned from the five (:mod:`gvq.data.bpe`).  ``split=by_source``:
    each training window keeps its novel (the one its first token is in) as its group, so that each rank
    trains on its own novels (:func:`gvq.data.batches.group_shard`)."""
    if split not in ("pooled", "by_source"):
        raise ValueError(f"dataset.split={split!r}: must be pooled or by_source")
    text = austen_text(root)
    cut = len(text) - PERSUASION_BYTES
    return text_windows(text[:cut], text[cut:], context, n_test, tokenizer, vocab_size,
                        NOVEL_BYTES if split == "by_source" else None)


def austen_text(root: str | None = None) -> bytes:
    """The checked corpus: from the cache when it holds the right bytes, else decoded (then cached)."""
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                         "gvq", f"austen-{AUSTEN_SHA256[:16]}.txt")
    try:
        with open(cache, "rb") as fh:
            text = fh.read()
        if hashlib.sha256(text).hexdigest() == AUSTEN_SHA256:
            return text
    except OSError:
        pass
    folder = find_austen(root)
    text = joined(read_lazyload(folder), NOVELS)
    check_text(text, folder)
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        tmp = f"{cache}.{os.getpid()}.tmp"             # ranks may write at once: rename is atomic
        with open(tmp, "wb") as fh:
            fh.write(text)
        os.replace(tmp, cache)
    except OSError:                                    # read-only home: only slower
        pass
    return text


def austen_roots(root: str | None) -> list[str]:
    if root:
        return [os.path.expanduser(str(root))]
    return ([os.environ["GVQ_DATA"]] if os.environ.get("GVQ_DATA") else []) + [os.path.join(R_LIBRARY, "janeaustenr")]


def find_austen(root: str | None) -> str:
    """The first searched folder holding ``Rdata.rdb`` and ``Rdata.rdx``; one line naming the fix otherwise."""
    roots = austen_roots(root)
    for folder in (os.path.join(r, sub) if sub else r for r in roots for sub in LAYOUTS):
        if all(os.path.isfile(os.path.join(folder, f"Rdata.{ext}")) for ext in ("rdb", "rdx")):
            return folder
    raise FileNotFoundError(f"dataset=austen: no janeaustenr data (Rdata.rdb, Rdata.rdx) under "
                            f"{', '.join(roots)}; {FIX}")


def _r_object(raw: bytes):
    import rdata                                       # imported here: only an uncached first read needs it
    with warnings.catch_warnings():                    # "Unknown file type: assumed RDS": a bare serialization
        warnings.simplefilter("ignore")
        return rdata.conversion.convert(rdata.parser.parse_data(raw))


def read_lazyload(folder: str) -> dict[str, list[str]]:
    """Every character vector of an R lazy-load database (``Rdata.rdx`` + ``Rdata.rdb``), by name; a
    ValueError naming the file when it is not one."""
    rdx, rdb = (os.path.join(folder, f"Rdata.{ext}") for ext in ("rdx", "rdb"))
    try:
        with open(rdx, "rb") as fh:
            index = _r_object(gzip.decompress(fh.read()))["variables"]
        with open(rdb, "rb") as fh:
            db = fh.read()
        out = {}
        for name, (offset, length) in index.items():
            block = db[int(offset):int(offset) + int(length)]
            raw = zlib.decompress(block[4:])
            if struct.unpack(">I", block[:4])[0] != len(raw):
                raise ValueError("a block's length disagrees with its header")
            out[str(name)] = [str(line) for line in _r_object(raw)]
        return out
    except (OSError, EOFError, zlib.error, struct.error, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{folder}: not a readable R lazy-load database ({type(e).__name__}: "
                         f"{str(e)[:120]}); {FIX}") from None


def joined(books: dict[str, list[str]], order) -> bytes:
    """The named books in ``order``, lines joined by ``\\n``, each book ending in ``\\n``."""
    missing = [n for n in order if n not in books]
    if missing:
        raise ValueError(f"no object {missing[0]!r} in the janeaustenr data; {FIX}")
    return "".join("\n".join(books[n]) + "\n" for n in order).encode("utf-8")


def check_text(text: bytes, folder: str) -> None:
    digest = hashlib.sha256(text).hexdigest()
    if digest != AUSTEN_SHA256:
        raise ValueError(f"{folder}: the decoded novels have sha256 {digest[:16]} ({len(text):,} bytes), want "
                         f"{AUSTEN_SHA256[:16]} ({AUSTEN_BYTES:,} bytes): another version or corrupt; {FIX}")

