"""Austen's novels from an R lazy-load database: the decoder against a database the test writes, the
checksum, the cache, the one-line refusals, and the real corpus where it is installed."""
from __future__ import annotations

import hashlib

import pytest
import torch

from gvq.data import iterate_batches
from gvq.data import r_lazyload as R
from tests.helpers.data import write_r_lazyload

BOOKS = {"emma": ["EMMA", "", "By Jane Austen", "café"], "persuasion": ["Persuasion", "", "the end"]}


@pytest.fixture
def fake_austen(tmp_path, monkeypatch):
    """A two-novel database under GVQ_DATA (as ``dpkg-deb -x`` leaves it), its checksum made the expected
    one, the cache in the test's folder."""
    folder = write_r_lazyload(tmp_path / "deb" / "usr" / "lib" / "R" / "site-library" / "janeaustenr" / "data", BOOKS)
    text = R.joined(BOOKS, ("emma", "persuasion"))
    monkeypatch.setattr(R, "NOVELS", ("emma", "persuasion"))
    monkeypatch.setattr(R, "AUSTEN_SHA256", hashlib.sha256(text).hexdigest())
    monkeypatch.setattr(R, "PERSUASION_BYTES", len(R.joined(BOOKS, ("persuasion",))))
    monkeypatch.setenv("GVQ_DATA", str(tmp_path / "deb"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return folder, text


def test_the_decoder_reads_every_character_vector_by_name(tmp_path):
    folder = write_r_lazyload(tmp_path, BOOKS)
    assert R.read_lazyload(str(folder)) == BOOKS


def test_books_join_by_lines_each_ending_in_a_newline():
    assert R.joined(BOOKS, ("persuasion", "emma")) == "Persuasion\n\nthe end\nEMMA\n\nBy Jane Austen\ncafé\n".encode()
    with pytest.raises(ValueError, match="no object 'mansfieldpark'"):
        R.joined(BOOKS, ("mansfieldpark",))


def test_the_corpus_is_found_checked_cached_and_the_last_novel_held_out(fake_austen, tmp_path):
    folder, text = fake_austen
    assert R.find_austen(None) == str(folder)
    assert R.austen_text() == text
    cached = list((tmp_path / "cache" / "gvq").iterdir())
    assert len(cached) == 1 and cached[0].read_bytes() == text
    for f in folder.iterdir():                                  # the cache alone serves the next read
        f.unlink()
    data = R.austen(context=4, n_test=None)
    assert bytes(data.x_test[0].tolist()) == b"Pers"
    assert bytes(data.x_train[0].tolist()) == b"EMMA"


def test_a_wrong_checksum_is_one_line_naming_both(fake_austen, monkeypatch):
    monkeypatch.setattr(R, "AUSTEN_SHA256", "0" * 64)
    with pytest.raises(ValueError) as e:
        R.austen_text()
    line = str(e.value)
    assert "\n" not in line and "want 0000000000000000" in line and "sha256" in line and "make setup" in line


def test_a_cache_with_other_bytes_is_ignored(fake_austen, tmp_path):
    folder, text = fake_austen
    R.austen_text()
    cached = next((tmp_path / "cache" / "gvq").iterdir())
    cached.write_bytes(b"tampered")
    assert R.austen_text() == text and cached.read_bytes() == text


def test_a_missing_corpus_is_one_line_saying_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("GVQ_DATA", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(R, "R_LIBRARY", str(tmp_path / "no-R"))
    with pytest.raises(FileNotFoundError) as e:
        R.austen()
    line = str(e.value)
    assert "\n" not in line and "apt-get download r-cran-janeaustenr" in line and "GVQ_DATA" in line


def test_a_file_that_is_not_a_database_is_refused_naming_it(tmp_path):
    (tmp_path / "Rdata.rdx").write_bytes(b"not gzip")
    (tmp_path / "Rdata.rdb").write_bytes(b"")
    with pytest.raises(ValueError, match="not a readable R lazy-load database"):
        R.read_lazyload(str(tmp_path))


def test_the_real_corpus_has_its_checksum_and_five_novels_to_train(austen_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))          # decoded afresh, not from a cache
    books = R.read_lazyload(str(austen_folder))
    text = R.joined(books, R.NOVELS)
    assert len(text) == R.AUSTEN_BYTES and hashlib.sha256(text).hexdigest() == R.AUSTEN_SHA256
    data = R.austen(str(austen_folder))
    assert data.num_classes == 256
    assert tuple(data.x_train.shape) == ((R.AUSTEN_BYTES - R.PERSUASION_BYTES - 1) // 64, 64)
    assert bytes(data.x_test[0].tolist()).startswith(b"Persuasion")
    # by_source: NOVEL_BYTES are the training novels as joined; their windows are the pooled ones
    assert R.NOVEL_BYTES == tuple(len(R.joined(books, (n,))) for n in R.NOVELS[:-1])
    split = R.austen(str(austen_folder), split="by_source")
    assert torch.equal(split.x_train, data.x_train) and torch.equal(split.x_test, data.x_test)
    assert torch.bincount(split.groups).tolist() == [10527, 10699, 13802, 13797, 6771]


#: three training novels of one letter each (lengths unequal, not multiples of the window), one held out
NOVELS3 = {"sensesensibility": ["aa aaa a aaaa"] * 9, "prideprejudice": ["bbb b bb bbbbb"] * 4,
           "emma": ["c cc ccc cccc"] * 6, "persuasion": ["Persuasion", "", "the end"]}


@pytest.fixture
def three_novels(tmp_path, monkeypatch):
    """A three-novel corpus (and Persuasion) under GVQ_DATA; a window's letters tell its novel."""
    order = tuple(NOVELS3)
    write_r_lazyload(tmp_path / "deb", NOVELS3)
    text = R.joined(NOVELS3, order)
    monkeypatch.setattr(R, "NOVELS", order)
    monkeypatch.setattr(R, "AUSTEN_SHA256", hashlib.sha256(text).hexdigest())
    monkeypatch.setattr(R, "PERSUASION_BYTES", len(R.joined(NOVELS3, ("persuasion",))))
    monkeypatch.setattr(R, "NOVEL_BYTES", tuple(len(R.joined(NOVELS3, (n,))) for n in order[:-1]))
    monkeypatch.setenv("GVQ_DATA", str(tmp_path / "deb"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _letters(text: str) -> set[str]:
    return set(text) - {" ", "\n"}


def test_by_source_groups_each_window_by_the_novel_its_first_byte_is_in(three_novels):
    pooled, split = R.austen(context=8, n_test=None), R.austen(context=8, n_test=None, split="by_source")
    assert pooled.groups is None and torch.equal(pooled.x_train, split.x_train)
    assert torch.equal(pooled.x_test, split.x_test)                      # the test set does not change
    ends = torch.tensor(R.NOVEL_BYTES).cumsum(0)
    offsets = torch.arange(len(split.x_train)) * 8                      # window i starts at byte 8 i
    assert torch.equal(split.groups, torch.searchsorted(ends, offsets, right=True))
    for window, g in zip(split.x_train, split.groups.tolist()):
        assert "abc"[g] == bytes(window.tolist()).decode().strip(" \n")[0]
    # and ranks: rank r draws from novel r only (world 3), from novels {0, 2} / {1} (world 2)
    for world, owned in ((3, [{"a"}, {"b"}, {"c"}]), (2, [{"a", "c"}, {"b"}])):
        for r in range(world):
            _, x, _ = next(iterate_batches(split, r, world, 2, seed=0))
            first = {bytes(w.tolist()).decode().strip(" \n")[0] for w in x}
            assert first <= owned[r], (world, r, first)


def test_by_source_with_bpe_groups_by_the_first_tokens_novel(three_novels):
    from gvq.data.bpe import bpe_tokenizer
    split = R.austen(context=4, n_test=None, tokenizer="bpe", vocab_size=264, split="by_source")
    text = R.austen_text()
    tok = bpe_tokenizer(text[:len(text) - R.PERSUASION_BYTES], 264)
    assert torch.bincount(split.groups).tolist()[1] > 0
    for window, g in zip(split.x_train, split.groups.tolist()):
        first = _letters(tok.decode([int(window[0])]))
        assert first <= {"abc"[g]}, (first, g)                          # a lone space/newline token: no letter
    assert R.austen(context=4, n_test=None, tokenizer="bpe", vocab_size=264).groups is None


def test_a_split_other_than_pooled_or_by_source_is_refused_naming_the_key(three_novels):
    with pytest.raises(ValueError, match="dataset.split='by_label'"):
        R.austen(split="by_label")
