"""Where a :class:`~gvq.workloads.base.Workload` comes from: a run's loaded data set (the composed
``dataset`` config, instantiated), or, for a tool that times a model without its data, the model's composed
config: the input its model class declares it is built for (``default_input``: the GPT's own context, the
CNN's digit, the ResNets' CIFAR image), or an explicit one input's shape.  Never a model's name."""
from __future__ import annotations

from gvq.models import default_input
from gvq.workloads.base import Workload
from gvq.workloads.classification import Classification
from gvq.workloads.language import LanguageModelling


def of_shape(num_classes: int, shape, bytes_per_token: float = 1.0) -> Workload:
    """The workload of inputs of ``shape``: a window of tokens ``(T,)``, else an image ``(C, H, W)``."""
    shape = tuple(shape)
    if len(shape) == 1:
        return LanguageModelling(num_classes, shape[0], bytes_per_token)
    return Classification(num_classes, shape)


def of_data(data) -> Workload:
    """A run's workload: text (the data set knows its bytes per token) or images (its channels)."""
    if data.bytes_per_token is not None:
        return LanguageModelling(data.num_classes, data.x_train.shape[1], data.bytes_per_token)
    return Classification(data.num_classes, (data.in_channels, *data.x_train.shape[2:]))


def of_model(model_cfg, num_classes: int, shape=None) -> Workload:
    """A tool's workload for the composed ``model_cfg`` (``compose(["model=gpt_tiny", "model.context=32"])
    .model``): inputs of ``shape``, else the input the model declares (a GPT's: a window of its
    ``model.context``)."""
    return of_shape(num_classes, shape or default_input(model_cfg))
