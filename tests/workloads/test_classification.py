"""Images: the model's input channels and a synthetic batch follow the workload's input shape."""
from __future__ import annotations

import torch

from gvq.workloads import Classification


def test_a_synthetic_batch_is_images_and_one_label_each_of_the_declared_shape():
    for shape in ((1, 8, 8), (3, 32, 32), (2, 5, 7)):
        work = Classification(4, shape)
        x, y = work.synthetic_batch(6, torch.Generator().manual_seed(0))
        assert x.shape == (6, *shape) and x.dtype == torch.float32
        assert y.shape == (6,) and y.dtype == torch.int64 and 0 <= int(y.min()) and int(y.max()) < 4
        assert work.in_channels == shape[0]


def test_an_image_run_adds_no_columns_and_no_summary_keys():
    work = Classification(10, (1, 8, 8))
    row = {"test_loss": 1.0}
    work.row_metrics(row, targets=1000, step_s=0.5)
    assert row == {"test_loss": 1.0} and work.extra_fields == () and work.summary_metrics(1.0, 10, 1.0) == {}
