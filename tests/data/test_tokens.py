"""Text as next-byte windows: targets are the inputs shifted by one, the held-out sample, a text file's split."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gvq.data import iterate_batches, text_file
from gvq.data.tokens import spaced, windows


def test_windows_targets_are_the_next_tokens():
    tokens = np.arange(23, dtype=np.uint8)
    x, y = windows(tokens, 5)
    assert x.shape == y.shape == (4, 5) and x.dtype == torch.uint8 and y.dtype == torch.int64
    flat_x, flat_y = x.flatten().long(), y.flatten()
    torch.testing.assert_close(flat_y, flat_x + 1)
    assert int(flat_y[-1]) == 20                      # the 21st token closes the last whole window


def test_a_text_shorter_than_a_window_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="dataset.context=8"):
        windows(np.zeros(8, dtype=np.uint8), 8)


def test_held_out_windows_are_spread_over_the_whole_text():
    keep = spaced(100, 5)
    assert keep.tolist() == [0, 25, 50, 74, 99]
    assert spaced(10, None).tolist() == list(range(10)) and spaced(3, 10).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="dataset.n_test=0"):
        spaced(10, 0)


def test_text_file_holds_out_its_end_and_streams_as_batches(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"a" * 900 + b"z" * 100)
    data = text_file(str(path), context=10, test_fraction=0.1, n_test=None)
    assert data.num_classes == 256 and data.bytes_per_token == 1.0
    assert set(data.x_test.flatten().tolist()) == {ord("z")}
    assert ord("z") not in set(data.x_train[:-1].flatten().tolist())
    _, x, y = next(iterate_batches(data, 1, 2, 4, seed=0))
    assert x.dtype == torch.int64 and x.shape == y.shape == (4, 10)
    with pytest.raises(FileNotFoundError, match="dataset.path="):
        text_file(str(tmp_path / "none.txt"))


def test_a_split_never_starts_inside_a_character_and_a_bad_fraction_is_refused(tmp_path):
    """The held-out cut moves past UTF-8 continuation bytes (an é's second byte stays with its first), and
    ``test_fraction`` outside (0, 1) is refused naming the key."""
    from gvq.data.tokens import char_boundary
    raw = "aé".encode() * 3                             # a, 0xC3, 0xA9, ...
    assert char_boundary(raw, 2) == 3 and char_boundary(raw, 3) == 3 and char_boundary(raw, len(raw)) == len(raw)
    path = tmp_path / "t.txt"
    path.write_bytes(b"a" * 200)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match=f"dataset.test_fraction={bad!r}: must be in"):
            text_file(str(path), context=10, test_fraction=bad)


def test_token_and_tensor_data_refuse_mismatched_shapes_and_unscaled_bytes():
    from gvq.data.tensors import TensorData
    from gvq.data.tokens import TokenData
    x = torch.zeros(4, 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="must be \\(windows, context\\) of one shape"):
        TokenData(x, torch.zeros(4, 7, dtype=torch.int64), x, x.long(), 256, 1)
    with pytest.raises(ValueError, match="uint8 images need mean and std"):
        TensorData(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64),
                   torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64), 10, 1)
