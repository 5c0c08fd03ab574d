"""The optional byte-level BPE (dataset.tokenizer=bpe): exact round trip, learned from the training text
alone, deterministic, cached (a damaged cache rebuilt), its refusals, bits per byte, and a short run."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from gvq.data import bpe, text_file
from gvq.data.tokens import bpe_windows, text_windows
from tests.helpers.cli import ROOT
from tests.helpers.launch import compose_job, launch_job

VOCAB = 300
UNSEEN = " wentworth"                      # a word the held-out text repeats and the training text lacks


def _english(n: int = 160, offset: int = 0) -> str:
    """A few KB of English-like text, made here (the tests need no corpus installed)."""
    words = "the of and to a in that was her not be she he had it as for with his you which but".split()
    return "".join(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(8 + i % 5)).capitalize() + ".\n"
                   for i in range(offset, offset + n))


TRAIN = _english().encode()
TEST = "".join(_english(4, k) + f"Captain{UNSEEN * 10}, said the café.\n" for k in range(12)).encode()


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))     # never the user's cache
    return tmp_path / "cache"


def test_held_out_text_round_trips_exactly_in_fewer_tokens_than_bytes():
    tok = bpe.bpe_tokenizer(TRAIN, VOCAB)
    ids = bpe.bpe_ids(tok, TEST, "held-out")
    assert tok.decode(ids.tolist()) == TEST.decode()
    assert tok.get_vocab_size() == VOCAB and len(ids) < len(TEST)
    data = bpe_windows(TRAIN, TEST, context=16, n_test=None, vocab_size=VOCAB)
    assert data.num_classes == VOCAB and data.bytes_per_token == pytest.approx(len(TEST) / len(ids))
    assert data.bytes_per_token > 1 and int(data.y_train.max()) >= 256   # merged tokens are used


def test_vocabulary_is_learned_from_the_training_text_only():
    alone = bpe.train_bpe(TRAIN.decode(), VOCAB)
    assert len(alone.encode(UNSEEN).ids) > 1
    both = bpe.train_bpe((TRAIN + TEST).decode(), VOCAB)             # the check can fail: a leak would show
    assert len(both.encode(UNSEEN).ids) == 1


def test_training_is_deterministic():
    a, b = bpe.train_bpe(TRAIN.decode(), VOCAB), bpe.train_bpe(TRAIN.decode(), VOCAB)
    assert a.to_str() == b.to_str()
    assert a.encode(TEST.decode()).ids == b.encode(TEST.decode()).ids


def test_second_call_loads_the_cache_and_a_damaged_cache_is_rebuilt(monkeypatch):
    first = bpe.bpe_tokenizer(TRAIN, VOCAB)
    path = bpe.cache_path(TRAIN, VOCAB)
    with monkeypatch.context() as m:
        m.setattr(bpe, "train_bpe", lambda *a: pytest.fail("retrained despite the cache"))
        assert bpe.bpe_tokenizer(TRAIN, VOCAB).to_str() == first.to_str()
    for damage in ('{"version": "1.0", "model": {"type": "BPE", "vocab"', "\x00not json"):
        with open(path, "w") as fh:
            fh.write(damage)
        assert bpe.bpe_tokenizer(TRAIN, VOCAB).to_str() == first.to_str()
        assert bpe._cached(path, VOCAB) is not None                    # rewritten whole
    assert bpe.cache_path(TRAIN, VOCAB + 1) != path and bpe.cache_path(TRAIN[:-1], VOCAB) != path


def test_a_cache_of_another_size_is_not_trusted():
    path = bpe.cache_path(TRAIN, VOCAB)
    os.makedirs(os.path.dirname(path))
    bpe.train_bpe(TRAIN.decode(), VOCAB + 10).save(path)
    assert bpe.bpe_tokenizer(TRAIN, VOCAB).get_vocab_size() == VOCAB


@pytest.mark.parametrize("size", [256, 10, True, 300.5])
def test_a_vocabulary_without_merges_is_refused_naming_the_key(size):
    with pytest.raises(ValueError, match=f"dataset.vocab_size={size!r}: must be an integer above 256"):
        text_windows(TRAIN, TEST, 16, None, "bpe", size)


def test_refusals_name_the_key():
    with pytest.raises(ValueError, match="dataset.vocab_size=5000: the training text yields only"):
        text_windows(TRAIN, TEST, 16, None, "bpe", 5000)
    with pytest.raises(ValueError, match="dataset.tokenizer='words': must be bytes or bpe"):
        text_windows(TRAIN, TEST, 16, None, "words")
    with pytest.raises(ValueError, match="dataset.tokenizer=bpe: the held-out text is not UTF-8"):
        text_windows(TRAIN, b"\xff\xfe" + TEST, 16, None, "bpe", VOCAB)


def test_text_file_cuts_between_characters_and_keeps_bytes_unchanged(tmp_path):
    path = tmp_path / "t.txt"
    raw = TRAIN + "é".encode() * 400
    path.write_bytes(raw)
    data = text_file(str(path), context=16, test_fraction=0.1, n_test=None, tokenizer="bpe", vocab_size=VOCAB)
    assert data.num_classes == VOCAB and data.x_train.dtype.is_signed
    as_bytes = text_file(str(path), context=16, test_fraction=0.1, n_test=None)
    assert as_bytes.num_classes == 256 and as_bytes.bytes_per_token == 1.0


def test_a_tokenizer_outside_the_choices_is_refused_at_compose_time(tmp_path):
    cfg = compose_job(tmp_path, "dataset=text", "dataset.path=x", "dataset.tokenizer=bpe", "dataset.vocab_size=512")
    assert OmegaConf.select(cfg, "dataset.tokenizer") == "bpe"
    with pytest.raises(Exception, match="override dataset.tokenizer=words"):
        compose_job(tmp_path, "dataset=text", "dataset.path=x", "dataset.tokenizer=words")
    with pytest.raises(Exception, match="override dataset.vocab_size=big"):
        compose_job(tmp_path, "dataset=text", "dataset.path=x", "dataset.vocab_size=big")


def test_gvq_imports_without_tokenizers():
    code = "import sys, gvq, gvq.data, gvq.run.launch; assert 'tokenizers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_a_short_bpe_run_logs_a_finite_bits_per_byte(tmp_path, cache_home):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(TRAIN + TEST)
    code, summary = launch_job(
        tmp_path / "run", "logger=csv", "logger.progress=false", "dataset=text", f"dataset.path={corpus}",
        "dataset.tokenizer=bpe", f"dataset.vocab_size={VOCAB}", "dataset.context=16", "dataset.n_test=8",
        "model=gpt_tiny", "model.layers=1", "model.heads=2", "model.width=16", "model.context=16", "optim=adamw",
        "optim.warmup_iters=1", "iterations=3", "eval_every=3", "batch_size=4", "world_size=2")
    assert code == 0 and math.isfinite(summary["final_test_bpb"])
    assert summary["final_test_bpb"] < summary["final_test_loss"] / math.log(2)   # > 1 byte per token
    assert len(list((cache_home / "gvq").glob("bpe-*.json"))) == 1      # trained once, by the preflight
