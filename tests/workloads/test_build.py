"""Where a workload comes from: a run's data set (its kind, classes, input and bytes per token), or a
tool's composed model config (the input the model declares), never the model's name."""
from __future__ import annotations

import torch
from hydra.utils import instantiate

from gvq.data import TensorData
from gvq.data.tokens import TokenData
from gvq.schema.compose import compose
from gvq.workloads import Classification, LanguageModelling, of_data, of_model, of_shape


def test_a_runs_workload_is_its_data_sets():
    images = TensorData(torch.zeros(4, 2, 5, 6), torch.zeros(4, dtype=torch.int64), torch.zeros(2, 2, 5, 6),
                        torch.zeros(2, dtype=torch.int64), num_classes=7, in_channels=2)
    work = of_data(images)
    assert isinstance(work, Classification) and (work.num_classes, work.sample_shape) == (7, (2, 5, 6))
    ids = torch.zeros(4, 9, dtype=torch.int64)
    text = TokenData(ids, ids, ids, ids, num_classes=300, in_channels=1, bytes_per_token=2.5)
    work = of_data(text)
    assert isinstance(work, LanguageModelling) and (work.num_classes, work.context) == (300, 9)
    assert work.bytes_per_token == 2.5 and work.in_channels == 1


def test_the_digits_run_builds_the_cnn_its_workload_says():
    cfg = compose(["dataset=digits", "model=cnn"])
    work = of_data(instantiate(cfg.dataset))
    assert (work.sample_shape, work.num_classes, work.in_channels) == ((1, 8, 8), 10, 1)


def test_a_tools_synthetic_shape_follows_the_model_config_not_its_name():
    """A GPT with a non-default context (a block size no option file names) gets windows of that length;
    the same name with a shape given gets that shape."""
    for context in (64, 32, 200):
        cfg = compose(["model=gpt_tiny", f"model.context={context}"])
        work = of_model(cfg.model, 256)
        assert work.sample_shape == (context,)
        x, y = work.synthetic_batch(2)
        assert x.shape == y.shape == (2, context)
        net = instantiate(cfg.model, num_classes=256, in_channels=work.in_channels)
        assert net(x).shape == (2, context, 256)                         # the model takes what it declared
    assert of_model(compose(["model=gpt_small"]).model, 256).sample_shape == (256,)
    assert of_model(compose(["model=gpt_tiny"]).model, 256, [16]).sample_shape == (16,)


def test_an_image_models_input_is_its_declared_one_or_the_shape_given():
    assert of_model(compose(["model=cnn"]).model, 10).sample_shape == (1, 8, 8)
    assert of_model(compose(["model=resnet56"]).model, 100).sample_shape == (3, 32, 32)
    work = of_model(compose(["model=resnet20"]).model, 10, [1, 28, 28])
    assert work.sample_shape == (1, 28, 28) and work.in_channels == 1
    assert of_shape(10, (4, 6, 6)).synthetic_batch(2)[0].shape == (2, 4, 6, 6)
