"""CIFAR ResNets (He et al. 2016, sec. 4.2) with option-A shortcuts: every weight but BN's and the classifier's is a
3x3 conv kernel, which the gradient compressors act on."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gvq.models._layers import conv3x3, kaiming_init

RESNET_WIDTHS = (16, 32, 64)


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
        kaiming_init(self)

    @staticmethod
    def default_input(cfg) -> tuple[int, ...]:
        """One input it is built for when a tool names no data set: a CIFAR image, 3 x 32 x 32."""
        return (3, 32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _for_cifar(build):
    """A depth's constructor (a config's ``_target_``) declares the input its ResNet is built for."""
    build.default_input = ResNet.default_input
    return build


@_for_cifar
def resnet20(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    return ResNet(20, num_classes, in_channels)


@_for_cifar
def resnet32(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    return ResNet(32, num_classes, in_channels)


@_for_cifar
def resnet56(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    return ResNet(56, num_classes, in_channels)


@_for_cifar
def resnet110(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    return ResNet(110, num_classes, in_channels)
