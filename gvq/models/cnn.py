"""A small CNN for the 8x8 digits images."""
from __future__ import annotations

import torch
import torch.nn as nn

from gvq.models._layers import conv3x3, kaiming_init


class DigitsCNN(nn.Module):
    """Small CNN for 8x8 images, no BatchNorm (replicas stay identical with no buffers to sync).

    conv3x3(c->w) ReLU, conv3x3(w->2w) ReLU, maxpool -> 4x4, conv3x3(2w->2w) ReLU, maxpool -> 2x2,
    flatten, linear(8w -> classes).  Its 9cw + 54w^2 conv weights are most of its parameters (the rest:
    5w conv biases and the classifier's 8w x classes + classes).
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 16):
        super().__init__()
        if width < 1:
            raise ValueError(f"model.width={width!r}: must be a positive int")
        w = width
        self.features = nn.Sequential(
            conv3x3(in_channels, w, bias=True), nn.ReLU(),
            conv3x3(w, 2 * w, bias=True), nn.ReLU(), nn.MaxPool2d(2),
            conv3x3(2 * w, 2 * w, bias=True), nn.ReLU(), nn.MaxPool2d(2),
        )
        # Adaptive pooling to 2x2 lets the same net take bigger inputs (e.g. 32x32) in smoke tests.
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(8 * w, num_classes)
        kaiming_init(self)

    @staticmethod
    def default_input(cfg) -> tuple[int, ...]:
        """One input it is built for when a tool names no data set: a digit, 1 x 8 x 8."""
        return (1, 8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))
