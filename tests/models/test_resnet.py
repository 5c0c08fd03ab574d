"""The CIFAR ResNets (parameter counts, shapes, depth validation), and every image model/dataset option
composed together.

    .venv/bin/python -m pytest -q tests/models/
"""
from __future__ import annotations

import math

import pytest
import torch
from hydra.utils import instantiate

from gvq import models as M
from tests.helpers.data import write_fake_cifar


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def conv_weights_by_width(model) -> dict[int, int]:
    out: dict[int, int] = {}
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            out[m.out_channels] = out.get(m.out_channels, 0) + m.weight.numel()
    return out


# ------------------------------------------------------------------------------------------ models

def test_resnet32_cifar100_counts():
    model = M.resnet32(num_classes=100)
    assert n_params(model) == 470_004
    widths = conv_weights_by_width(model)
    assert widths == {16: 23_472, 32: 87_552, 64: 350_208}
    assert sum(widths.values()) == 461_232
    assert not any(isinstance(m, torch.nn.Conv2d) and m.bias is not None for m in model.modules())


@pytest.mark.parametrize("fn,depth,expected", [  # the published option-A counts for 10 classes
    (M.resnet20, 20, 269_722), (M.resnet32, 32, 464_154),
    (M.resnet56, 56, 853_018), (M.resnet110, 110, 1_727_962)])
def test_resnet_family_counts(fn, depth, expected):
    model = fn(num_classes=10)
    assert n_params(model) == expected
    n = (depth - 2) // 6
    # Weighted layers: stem + 2 convs per block + fc = 6n + 2; no 1x1 projection convs (option A).
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) + 1 == depth
    assert all(c.kernel_size == (3, 3) for c in convs)
    bn = 2 * (16 + 2 * n * (16 + 32 + 64))
    assert n_params(model) == sum(conv_weights_by_width(model).values()) + bn + 64 * 10 + 10


def test_forward_shapes():
    x = torch.randn(2, 3, 32, 32)
    assert M.resnet20(num_classes=100)(x).shape == (2, 100)
    assert M.ResNet(14, num_classes=7, in_channels=1)(torch.randn(3, 1, 8, 8)).shape == (3, 7)
    cnn = M.DigitsCNN(num_classes=10, in_channels=1)
    assert cnn(torch.randn(4, 1, 8, 8)).shape == (4, 10)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in cnn.modules())
    assert len(list(cnn.buffers())) == 0
    conv = sum(p.numel() for p in cnn.parameters() if p.dim() == 4)
    assert conv / n_params(cnn) > 0.85


@pytest.mark.parametrize("depth", [21, 2, 33, 0])
def test_bad_depth_raises(depth):
    with pytest.raises(ValueError, match="model.depth"):
        M.ResNet(depth, num_classes=10)


def test_shortcut_a_subsamples_and_zero_pads():
    x = torch.randn(2, 16, 8, 8)
    y = M.ShortcutA(16, 32, stride=2)(x)
    assert y.shape == (2, 32, 4, 4)
    assert torch.equal(y[:, 8:24], x[:, :, ::2, ::2])
    assert y[:, :8].abs().sum() == 0 and y[:, 24:].abs().sum() == 0


def test_kaiming_init_scale():
    conv = M.resnet56(num_classes=10).layer3[0].conv2.weight  # fan_in 576 -> std sqrt(2/576)
    assert abs(conv.std().item() - math.sqrt(2 / 576)) < 0.005


# ------------------------------------------------------------------------------------------- hydra

@pytest.mark.parametrize("model,dataset,classes,chans", [
    ("cnn", "digits", 10, 1), ("resnet20", "cifar10", 10, 3), ("resnet32", "cifar100", 100, 3),
    ("resnet56", "synthetic", 100, 3), ("resnet110", "digits", 10, 1), ("cnn", "fashion_mnist", 10, 1),
    ("resnet20", "fashion_mnist", 10, 1), ("resnet32", "fashion_mnist", 10, 1)])
def test_yaml_instantiates(compose_cfg, request, tmp_path, monkeypatch, model, dataset, classes, chans):
    monkeypatch.setenv("GVQ_DATA", str(tmp_path))
    if dataset.startswith("cifar"):
        write_fake_cifar(tmp_path, classes)
    if dataset == "fashion_mnist":
        monkeypatch.setenv("GVQ_DATA", str(request.getfixturevalue("fashion_root")))
    cfg = compose_cfg(f"model={model}", f"dataset={dataset}")
    ds = instantiate(cfg.dataset)
    assert (ds.num_classes, ds.in_channels) == (classes, chans)
    net = instantiate(cfg.model, num_classes=ds.num_classes, in_channels=ds.in_channels)
    with torch.no_grad():
        assert net(ds.inputs(ds.x_test[:2])).shape == (2, classes)
