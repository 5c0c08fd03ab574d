"""An optional byte-level BPE for text data sets (``dataset.tokenizer=bpe``), trained offline and cached.

HF ``tokenizers`` learns merges over the UTF-8 bytes of the *training* text only (the held-out text never
shapes the vocabulary, or its loss would flatter the model); its 256-symbol byte alphabet is always kept,
so any text encodes and decodes back to the same bytes.  The trained tokenizer is a JSON file (data, not
pickle) under ``$XDG_CACHE_HOME/gvq``, keyed by the SHA-256 of the training text and the vocabulary size:
the launcher's preflight trains it once and every rank, and every later run, loads it.  A cache file that
does not parse, or that holds another vocabulary, is rebuilt, never trusted.  ``tokenizers`` is imported
here only, so gvq imports without it.

    python cli.py dataset=austen dataset.tokenizer=bpe dataset.vocab_size=1024 model=gpt_tiny optim=adamw
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

BYTE_VOCAB = 256         # the byte alphabet every byte-level BPE keeps (gvq.data.tokens imports this module)
ID_DTYPE = np.int32      # ids above 255 do not fit the byte tokens' uint8


def check_vocab_size(vocab_size: int) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= BYTE_VOCAB:
        raise ValueError(f"dataset.vocab_size={vocab_size!r}: must be an integer above {BYTE_VOCAB} (the byte "
                         "alphabet a byte-level BPE keeps), or use dataset.tokenizer=bytes")


def as_text(raw: bytes, which: str) -> str:
    """``raw`` as UTF-8 text; one line naming the fix when it is not (the BPE learns over characters' bytes)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"dataset.tokenizer=bpe: the {which} text is not UTF-8 (byte {e.start:,}); "
                         "use dataset.tokenizer=bytes") from None


def cache_path(train: bytes, vocab_size: int) -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "gvq", f"bpe-{hashlib.sha256(train).hexdigest()[:24]}-{vocab_size}.json")


def _empty_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)   # no space added: exact round trip
    tok.decoder = decoders.ByteLevel()
    return tok


def train_bpe(train: str, vocab_size: int):
    """A byte-level BPE of ``vocab_size`` tokens learned from ``train`` (deterministic: ties break by pair)."""
    from tokenizers import pre_tokenizers, trainers
    tok = _empty_bpe()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(train.splitlines(keepends=True), trainer=trainer)
    return tok


def _cached(path: str, vocab_size: int):
    """The tokenizer in ``path`` when it parses and holds ``vocab_size`` tokens; None otherwise."""
    from tokenizers import Tokenizer
    try:
        tok = Tokenizer.from_file(path)
    except Exception:                                  # missing, truncated or foreign: rebuilt below
        return None
    return tok if tok.get_vocab_size() == vocab_size else None


def bpe_tokenizer(train: bytes, vocab_size: int):
    """The BPE for this training text and size: from the cache when sound, else trained (then cached)."""
    check_vocab_size(vocab_size)
    path = cache_path(train, vocab_size)
    tok = _cached(path, vocab_size)
    if tok is not None:
        return tok
    tok = train_bpe(as_text(train, "training"), vocab_size)
    if tok.get_vocab_size() != vocab_size:             # too little text to learn that many merges
        raise ValueError(f"dataset.vocab_size={vocab_size}: the training text yields only "
                         f"{tok.get_vocab_size()} tokens; use a smaller vocabulary")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"              # ranks may write at once: rename is atomic
        tok.save(tmp)
        os.replace(tmp, path)
    except OSError:                                    # read-only home: only slower
        pass
    return tok


def bpe_ids(tok, raw: bytes, which: str) -> np.ndarray:
    """``raw`` as token ids (int32)."""
    return np.asarray(tok.encode(as_text(raw, which)).ids, dtype=ID_DTYPE)


def bpe_encoding(tok, raw: bytes, which: str) -> tuple[np.ndarray, np.ndarray]:
    """``raw`` as token ids (int32), and the character each token starts at (which text a token is from)."""
    enc = tok.encode(as_text(raw, which))
    return np.asarray(enc.ids, dtype=ID_DTYPE), np.asarray([a for a, _ in enc.offsets], dtype=np.int64)
