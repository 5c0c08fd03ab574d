"""The workload contract's shared parts: the loss is cross-entropy per target (an image's ``(B, C)`` logits,
a language model's ``(B, T, V)`` per token), accuracy counts the most likely class per target."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gvq.workloads import Classification, LanguageModelling


def test_the_cnn_loss_is_cross_entropy_per_image():
    g = torch.Generator().manual_seed(0)
    out, y = torch.randn(5, 10, generator=g), torch.randint(0, 10, (5,), generator=g)
    work = Classification(10, (1, 8, 8))
    assert torch.equal(work.loss(out, y), F.cross_entropy(out, y))
    assert torch.equal(work.loss(out, y, reduction="sum"), F.cross_entropy(out, y, reduction="sum"))


def test_the_language_model_loss_is_cross_entropy_per_token():
    """The mean over every (window, position) of -log softmax at the next token, computed by hand."""
    g = torch.Generator().manual_seed(1)
    out, y = torch.randn(3, 7, 11, generator=g), torch.randint(0, 11, (3, 7), generator=g)
    work = LanguageModelling(11, 7)
    by_hand = -torch.log_softmax(out, -1).gather(-1, y.unsqueeze(-1)).mean()
    torch.testing.assert_close(work.loss(out, y), by_hand, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(work.loss(out, y, reduction="sum"), by_hand * 21, rtol=1e-6, atol=1e-5)
    assert work.loss(out, y).item() == pytest.approx(F.cross_entropy(out.reshape(21, 11), y.reshape(21)).item())


def test_accuracy_counts_the_most_likely_class_per_target():
    out = torch.tensor([[[0.1, 2.0], [3.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]])   # (B=2, T=2, V=2)
    y = torch.tensor([[1, 1], [0, 1]])
    assert LanguageModelling(2, 2).correct(out, y).tolist() == [[True, False], [True, True]]
    assert Classification(2, (1, 2, 2)).correct(out[:, 0], y[:, 0]).tolist() == [True, True]
