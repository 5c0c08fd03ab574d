"""Models, one file each: CIFAR ResNets (He et al. 2016, sec. 4.2), a small CNN for the 8x8 digits images, and a
small GPT for byte-level language modelling.

Built from Hydra (``conf/model/*.yaml``), with the class count and input channels taken from the
data set::

    python cli.py model=resnet32 dataset=cifar100      # ResNet-32 (He et al.'s CIFAR depth)
    python cli.py model=cnn dataset=digits             # the default: DigitsCNN
    python cli.py model=gpt_tiny dataset=austen optim=adamw   # a transformer LM on Austen's novels

    hydra.utils.instantiate(cfg.model, num_classes=ds.num_classes, in_channels=ds.in_channels)

The ResNets use option-A shortcuts (identity; at a stage change stride-2 subsampling and zero-padded
channels), so every weight tensor except BN affine parameters and the classifier is a 3x3 conv
kernel: the gradient compressors act on those.
"""
from gvq.models.cnn import DigitsCNN
from gvq.models.gpt import GPT
from gvq.models.resnet import RESNET_WIDTHS, BasicBlock, ResNet, ShortcutA, resnet20, resnet32, resnet56, resnet110


def default_input(model_cfg) -> tuple[int, ...]:
    """One input's shape the model of ``model_cfg`` (a composed ``model`` node) is built for when a tool
    names no data set, as its ``_target_`` declares it (``default_input``): ``(C, H, W)`` or ``(T,)``."""
    from hydra.utils import get_object
    return tuple(get_object(model_cfg["_target_"]).default_input(model_cfg))


__all__ = ["GPT", "RESNET_WIDTHS", "BasicBlock", "DigitsCNN", "ResNet", "ShortcutA", "resnet20", "resnet32",
           "resnet56", "resnet110", "default_input"]
