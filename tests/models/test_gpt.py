"""The small GPT: its size at gpt_tiny's shape, causal attention, the tied embedding, its refusals, and the
option files composing with a text data set."""
from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from gvq.models import GPT


def test_gpt_tiny_shape_has_the_issue_s_parameter_count():
    """4 x 4 x 128, context 64, bytes: 834,304 parameters (the tied output layer counted once)."""
    model = GPT(num_classes=256)
    assert sum(p.numel() for p in model.parameters()) == 834_304
    assert model.head.weight is model.tok.weight


def test_a_future_token_never_changes_an_earlier_logit():
    torch.manual_seed(0)
    model = GPT(num_classes=256, layers=2, heads=2, width=32, context=16).eval()
    x = torch.randint(0, 256, (3, 16))
    for t in (0, 7, 15):
        changed = x.clone()
        changed[:, t] = (changed[:, t] + 1) % 256
        with torch.no_grad():
            a, b = model(x), model(changed)
        torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=1e-6)
        assert (a[:, t:] - b[:, t:]).abs().max() > 1e-4      # the changed position and later ones do see it


def test_logits_are_per_position_and_scored_by_the_flattened_loss():
    model = GPT(num_classes=11, layers=1, heads=1, width=8, context=5)
    out = model(torch.randint(0, 11, (2, 5)))
    assert out.shape == (2, 5, 11)
    with pytest.raises(ValueError, match="model.context=5"):
        model(torch.zeros(1, 6, dtype=torch.long))


@pytest.mark.parametrize("kwargs,key", [({"in_channels": 3}, "in_channels"),
                                        ({"width": 30, "heads": 4}, "model.width")])
def test_refusals_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        GPT(num_classes=256, **kwargs)


@pytest.mark.parametrize("model", ["gpt_tiny", "gpt_small"])
def test_yaml_instantiates_on_a_text_file(compose_cfg, tmp_path, model):
    path = tmp_path / "corpus.txt"
    path.write_bytes(bytes(range(256)) * 12)
    cfg = compose_cfg(f"model={model}", "dataset=text", f"dataset.path={path}", "dataset.context=32", "optim=adamw")
    data = instantiate(cfg.dataset)
    net = instantiate(cfg.model, num_classes=data.num_classes, in_channels=data.in_channels)
    with torch.no_grad():
        assert net(data.inputs(data.x_test[:2])).shape == (2, 32, 256)
