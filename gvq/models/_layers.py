"""Building blocks the models share."""
from __future__ import annotations

import torch.nn as nn


def conv3x3(cin: int, cout: int, stride: int = 1, bias: bool = False) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=bias)


def kaiming_init(model: nn.Module) -> None:
    """He-normal weights for convs and linears (BN keeps weight 1, bias 0)."""
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
