"""Austen's novels from an R lazy-load database: the decoder against a database the test writes, the
checksum, the cache, the one-line refusals, and the real corpus where it is installed."""
from __future__ import annotations

import hashlib

import pytest

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
    text = R.joined(R.read_lazyload(str(austen_folder)), R.NOVELS)
    assert len(text) == R.AUSTEN_BYTES and hashlib.sha256(text).hexdigest() == R.AUSTEN_SHA256
    data = R.austen(str(austen_folder))
    assert data.num_classes == 256
    assert tuple(data.x_train.shape) == ((R.AUSTEN_BYTES - R.PERSUASION_BYTES - 1) // 64, 64)
    assert bytes(data.x_test[0].tolist()).startswith(b"Persuasion")
