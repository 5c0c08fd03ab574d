"""Models: CIFAR ResNets (He et al. 2016, sec. 4.2) and a small CNN for the 8x8 digits images.

Built from Hydra (``conf/model/*.yaml``), with the class count and input channels taken from the
data set::

    python cli.py model=resnet32 dataset=cifar100      # ResNet-32 (He et al.'s CIFAR depth)
    python cli.py model=cnn dataset=digits             # the default: DigitsCNN

    hydra.utils.instantiate(cfg.model, num_classes=ds.num_classes, in_channels=ds.in_channels)

The ResNets use option-A shortcuts (identity; at a stage change stride-2 subsampling and zero-padded
channels), so every weight tensor except BN affine parameters and the classifier is a 3x3 conv
kernel: the gradient compressors act on those.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

RESNET_WIDTHS = (16, 32, 64)


def conv3x3(cin: int, cout: int, stride: int = 1, bias: bool = False) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=bias)


class ShortcutA(nn.Module):
    """Option-A shortcut: subsample by ``stride``, zero-pad channels up to ``cout``; no weights."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.stride, self.extra = stride, cout - cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride > 1:
            x = x[:, :, ::self.stride, ::self.stride]
        if self.extra:
            # Pad half the new channels on each side (as the reference CIFAR implementations do).
            x = F.pad(x, (0, 0, 0, 0, self.extra // 2, self.extra - self.extra // 2))
        return x


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN, plus the shortcut, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1, self.bn1 = conv3x3(cin, cout, stride), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = conv3x3(cout, cout), nn.BatchNorm2d(cout)
        same = stride == 1 and cin == cout
        self.shortcut = nn.Identity() if same else ShortcutA(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-(6n+2) for 32x32 images: stem conv 16, 3 stages of n blocks (16/32/64), pool, fc."""

    def __init__(self, depth: int, num_classes: int, in_channels: int = 3):
        super().__init__()
        if not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
            raise ValueError(f"model.depth={depth!r}: a CIFAR ResNet needs depth 6n+2 with n >= 1 "
                             "(20, 32, 44, 56, 110, ...)")
        n = (depth - 2) // 6
        self.depth = depth
        w0 = RESNET_WIDTHS[0]
        self.conv1, self.bn1 = conv3x3(in_channels, w0), nn.BatchNorm2d(w0)
        stages, cin = [], RESNET_WIDTHS[0]
        for i, width in enumerate(RESNET_WIDTHS):
            blocks = []
            for j in range(n):
                blocks.append(BasicBlock(cin, width, stride=2 if (i > 0 and j == 0) else 1))
                cin = width
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nn.Linear(cin, num_classes)
        _kaiming_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _kaiming_init(model: nn.Module) -> None:
    """He-normal weights for convs and linears (BN keeps weight 1, bias 0)."""
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def resnet20(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    return ResNet(20, num_classes, in_channels)


def resnet32(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    return ResNet(32, num_classes, in_channels)


def resnet56(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    return ResNet(56, num_classes, in_channels)


def resnet110(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    return ResNet(110, num_classes, in_channels)


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
        _kaiming_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))
