"""Text as next-token windows: the in-memory form of a language-modelling corpus, and a plain text file as one.

A corpus is cut into non-overlapping windows of ``context`` tokens; a window's targets are its tokens
shifted by one (the token after the window's last is the next window's first).  Windows, not random
offsets: an epoch is then a permutation of a fixed set, so the batch stream stays the pure function of
``(seed, epoch, rank, batch)`` that resume relies on (:mod:`gvq.data.batches`).  Tokens are bytes (V = 256)
by default: no tokenizer file to ship, and bits per byte compare across corpora.  ``tokenizer="bpe"`` trains
a byte-level BPE on the training text (:mod:`gvq.data.bpe`); bits per byte still compare, through
``bytes_per_token``.  A corpus joined from several texts (Austen's novels) may keep each window's source
as its group (``dataset.split=by_source``): windows are still cut from the joined text, so the pooled
windows do not change, and the few that straddle two texts count as the first's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from gvq.data.tensors import TensorData

BYTE_VOCAB = 256


@dataclass
class TokenData(TensorData):
    """Windows of token ids: x ``(N, context)`` as stored (uint8 bytes, int32 BPE ids), y ``(N, context)``
    int64 targets.  ``num_classes`` is the vocabulary; ``bytes_per_token`` (the held-out text's bytes over its
    tokens) turns nats per token into bits per byte."""
    bytes_per_token: float = 1.0

    def __post_init__(self):
        if self.x_train.dim() != 2 or self.x_train.shape != self.y_train.shape:
            raise ValueError("TokenData: x and y must be (windows, context) of one shape")

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids as the embedding takes them (int64); stored as bytes, a quarter of the memory per rank."""
        return x.long()


def windows(tokens: np.ndarray, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``: the whole windows of ``context`` tokens in ``tokens`` and their next tokens."""
    n = (len(tokens) - 1) // context
    if n < 1:
        raise ValueError(f"dataset.context={context}: longer than the {len(tokens):,}-token text")
    t = torch.from_numpy(np.array(tokens))                      # a writable copy (the text may be bytes)
    return t[:n * context].view(n, context).clone(), t[1:n * context + 1].view(n, context).long()


def spaced(n: int, keep: int | None) -> torch.Tensor:
    """``keep`` of ``n`` indices spread evenly (all when ``None``): a held-out sample from every part."""
    if keep is None or keep >= n:
        return torch.arange(n)
    if keep < 1:
        raise ValueError(f"dataset.n_test={keep}: must be >= 1 (or null: every held-out window)")
    return torch.linspace(0, n - 1, keep).round().long()


def byte_windows(train: bytes, test: bytes, context: int, n_test: int | None,
                 sources: Sequence[int] | None = None) -> TokenData:
    """A byte-level :class:`TokenData` from the training and held-out texts."""
    starts = None if sources is None else np.arange(len(train))        # token i is byte i
    return _token_data(np.frombuffer(train, dtype=np.uint8), np.frombuffer(test, dtype=np.uint8), context,
                       n_test, BYTE_VOCAB, 1.0, _token_sources(starts, sources))


def bpe_windows(train: bytes, test: bytes, context: int, n_test: int | None, vocab_size: int,
                sources: Sequence[int] | None = None) -> TokenData:
    """A :class:`TokenData` in the ids of a BPE learned from ``train`` alone (cached)."""
    from gvq.data.bpe import bpe_encoding, bpe_ids, bpe_tokenizer   # here: only tokenizer=bpe needs HF tokenizers
    tok = bpe_tokenizer(train, vocab_size)
    test_ids = bpe_ids(tok, test, "held-out")
    if sources is None:
        train_ids, token_sources = bpe_ids(tok, train, "training"), None
    else:
        train_ids, starts = bpe_encoding(tok, train, "training")
        token_sources = _token_sources(starts, _char_lengths(train, sources))
    return _token_data(train_ids, test_ids, context, n_test, tok.get_vocab_size(), len(test) / max(len(test_ids), 1),
                       token_sources)


def _char_lengths(train: bytes, sources: Sequence[int]) -> list[int]:
    """Byte lengths of consecutive UTF-8 texts as their lengths in characters (what BPE offsets count)."""
    edges = np.cumsum([0, *sources])
    return [len(train[a:b].decode("utf-8")) for a, b in zip(edges[:-1], edges[1:])]


def _token_sources(starts: np.ndarray | None, sources: Sequence[int] | None) -> np.ndarray | None:
    """Each token's source: the one of consecutive texts of lengths ``sources`` its first byte (or
    character) ``starts`` lies in.  None: one source."""
    if sources is None:
        return None
    return np.searchsorted(np.cumsum(sources), starts, side="right")


def _token_data(train, test, context: int, n_test: int | None, vocab: int, bytes_per_token: float,
                sources: np.ndarray | None = None) -> TokenData:
    xtr, ytr = windows(train, context)
    xte, yte = windows(test, context)
    keep = spaced(len(yte), n_test)
    # a window straddling two sources counts as its first token's
    groups = None if sources is None else torch.from_numpy(sources[:len(xtr) * context:context].astype(np.int64))
    return TokenData(xtr, ytr, xte[keep], yte[keep], num_classes=vocab, in_channels=1,
                     bytes_per_token=bytes_per_token, groups=groups)


def text_windows(train: bytes, test: bytes, context: int, n_test: int | None, tokenizer: str = "bytes",
                 vocab_size: int = 1024, sources: Sequence[int] | None = None) -> TokenData:
    """The texts as windows of ``tokenizer``'s tokens: ``bytes`` (V = 256) or ``bpe`` (V = ``vocab_size``).
    ``sources``: the byte lengths of the consecutive texts ``train`` joins (novels), each window's source
    kept as its group (``dataset.split=by_source``); None: one pool."""
    if sources is not None and sum(sources) != len(train):
        raise ValueError(f"sources: {sum(sources):,} bytes, the training text {len(train):,}")
    if tokenizer == "bpe":
        return bpe_windows(train, test, context, n_test, vocab_size, sources)
    if tokenizer != "bytes":
        raise ValueError(f"dataset.tokenizer={tokenizer!r}: must be bytes or bpe")
    return byte_windows(train, test, context, n_test, sources)


def char_boundary(raw: bytes, cut: int) -> int:
    """``cut`` moved forward past UTF-8 continuation bytes, so neither side starts inside a character."""
    while cut < len(raw) and 0x80 <= raw[cut] < 0xC0:
        cut += 1
    return cut


def text_file(path: str, context: int = 64, test_fraction: float = 0.1, n_test: int | None = 256,
              tokenizer: str = "bytes", vocab_size: int = 1024, split: str = "pooled") -> TokenData:
    """A UTF-8 (or, as bytes, any) text file as a corpus: its last ``test_fraction`` of bytes held out.
    One source, so one ``split``: pooled."""
    if split != "pooled":
        raise ValueError(f"dataset.split={split!r}: dataset=text is one source; only pooled")
    if not 0 < test_fraction < 1:
        raise ValueError(f"dataset.test_fraction={test_fraction!r}: must be in (0, 1)")
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as e:
        raise FileNotFoundError(f"dataset.path={path}: {e.strerror}") from None
    cut = len(raw) - int(len(raw) * test_fraction)
    if tokenizer == "bpe":                 # a BPE reads characters; bytes keep the cut they always had
        cut = char_boundary(raw, cut)
    return text_windows(raw[:cut], raw[cut:], context, n_test, tokenizer, vocab_size)
