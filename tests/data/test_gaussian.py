"""gvq/data/gaussian.py: synthetic CIFAR-shaped data."""
from __future__ import annotations


import torch

from gvq import data as D


def test_synthetic_shapes_and_learnable():
    s = D.synthetic(num_classes=5, n_train=200, n_test=50, image_size=16, channels=2, seed=3)
    assert s.x_train.shape == (200, 2, 16, 16) and s.x_test.shape == (50, 2, 16, 16)
    assert (s.num_classes, s.in_channels, s.augment) == (5, 2, False)
    assert s.y_train.max() < 5 and s.y_train.dtype == torch.int64
    assert torch.equal(s.x_train, D.synthetic(5, 200, 50, 16, 2, seed=3).x_train)
    means = torch.stack([s.x_train[s.y_train == c].mean(0) for c in range(5)]).flatten(1)
    pred = torch.cdist(s.x_test.flatten(1), means).argmin(1)
    assert (pred == s.y_test).float().mean() > 0.9
