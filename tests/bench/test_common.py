"""gvq/bench/common.py: garbage collected only where the bench says, never on the interpreter's own."""
from __future__ import annotations

import gc

import pytest

from gvq.bench.common import collections_untimed


class _Node:
    def __init__(self):
        self.me = self                          # a reference cycle: only a collection frees it


def _collections_while(fn) -> int:
    """How many collections the interpreter ran while ``fn`` ran (gc's own callbacks count them)."""
    starts = []

    def seen(phase, info):
        if phase == "start":
            starts.append(info["generation"])
    gc.callbacks.append(seen)
    try:
        fn()
    finally:
        gc.callbacks.remove(seen)
    return len(starts)


def _garbage():
    """Far more cyclic objects than a young collection waits for: with collection on, one runs."""
    for _ in range(10 * max(gc.get_threshold()[0], 1)):
        _Node()


def test_no_collection_runs_inside_only_the_one_the_bench_calls_and_the_state_is_restored():
    assert gc.isenabled()
    assert _collections_while(_garbage) > 0                            # the probe does see collections
    with collections_untimed() as collect:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        assert _collections_while(_garbage) == 0
        assert _collections_while(collect) == 1
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_disabled_collector_stays_disabled_after():
    gc.disable()
    try:
        with collections_untimed():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_language_models_timed_step_is_a_window_of_tokens_scored_per_token():
    """Every timed step (bench train, predict's calibrations) asks the model's workload for its inputs: a
    model with a context (gpt_tiny) takes windows of token ids and a next token per position, the CNN and
    ResNets images and one label each, as their configs declare; the loss is the run's, per token for a
    language model."""
    import torch

    from gvq.bench.common import build_model, model_shapes, model_workload
    assert model_workload("gpt_tiny", 256).sample_shape == (64,)
    assert model_workload("cnn", 10).sample_shape == (1, 8, 8)
    assert model_workload("resnet20", 10).sample_shape == (3, 32, 32)
    assert [model_workload(m, 10, s).in_channels for m, s in (("gpt_tiny", (64,)), ("cnn", None),
                                                               ("resnet20", None))] == [1, 1, 3]
    g = torch.Generator().manual_seed(0)
    work = model_workload("gpt_tiny", 256, (16,))
    x, y = work.synthetic_batch(3, g)
    assert x.shape == y.shape == (3, 16) and x.dtype == y.dtype == torch.int64 and int(x.max()) < 256
    net = build_model("gpt_tiny", 256, work.in_channels)
    loss = work.loss(net(x), y)
    manual = torch.nn.functional.cross_entropy(net(x).reshape(-1, 256), y.reshape(-1))
    assert loss.item() == pytest.approx(manual.item(), rel=1e-6) and loss.item() == pytest.approx(5.545, abs=0.1)
    xi, yi = model_workload("cnn", 10).synthetic_batch(4, g)
    assert xi.shape == (4, 1, 8, 8) and yi.shape == (4,) and xi.dtype == torch.float32
    assert sum(s.numel() for s in model_shapes("gpt_tiny", 256)) == 834_304    # the tied embedding once


def test_a_benchs_mode_is_named_by_the_values_its_set_gives_it():
    """``gvq.bench aggregate`` / ``train`` take options with ``grid.set``: bench.yaml's PowerSGD runs at rank
    6, so its records and tables say ``powersgd rank=6`` (they said ``powersgd``, a rank-2 run's name); a
    value that restates the default, or a mode that is no option, is not part of it."""
    from gvq.bench.common import setting_name
    from gvq.schema.compose import load_grid
    assert setting_name("powersgd", load_grid("bench").set) == "powersgd rank=6"
    assert setting_name("qsgd", ["qsgd:aggregator.compressor.bits=4", "K=x1"]) == "qsgd"
    assert setting_name("torch_ddp", ["K=x1"]) == "torch_ddp" and setting_name("allreduce", []) == "allreduce"
