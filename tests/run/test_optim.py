"""The optimizers (conf/optim): built from the composed option, AdamW's decay on 2-D weights only, the
schedule keys kept out of the builders, and clipping applied to the averaged gradient."""
from __future__ import annotations

import csv
import math

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from gvq.methods.every_step import EveryStep
from gvq.models import GPT
from gvq.run import optim
from gvq.run.train import lr_lambda, step
from gvq.workloads import Classification
from tests.helpers.data import write_digits_as_cifar
from tests.helpers.launch import launch_job


def _built(compose_cfg, *overrides):
    o = OmegaConf.to_container(compose_cfg(*overrides).optim, resolve=True)
    return o, optim.build_optimizer(o, GPT(num_classes=16, layers=1, heads=1, width=8, context=4))


def test_adamw_decays_two_dimensional_weights_only(compose_cfg):
    o, opt = _built(compose_cfg, "optim=adamw", "optim.weight_decay=0.3", "optim.betas=[0.8,0.9]")
    assert isinstance(opt, torch.optim.AdamW)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.3 and plain["weight_decay"] == 0.0 and decayed["betas"] == (0.8, 0.9)
    assert all(p.dim() == 2 for p in decayed["params"]) and all(p.dim() == 1 for p in plain["params"])
    model_params = {id(p) for g in opt.param_groups for p in g["params"]}
    assert len(model_params) == sum(len(g["params"]) for g in opt.param_groups)   # the tied weight once
    assert o["clip_norm"] == 1.0 and o["warmup_iters"] == 50


def test_sgd_is_built_from_its_keys_and_the_schedule_stays_the_run_s(compose_cfg):
    o, opt = _built(compose_cfg, "optim.lr=0.2", "optim.momentum=0.5", "optim.warmup_iters=4")
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["lr"] == 0.2 and opt.defaults["momentum"] == 0.5
    f = lr_lambda(o, 20)
    assert [f(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(12) == pytest.approx(0.5 * (1 + math.cos(math.pi / 2)))


@pytest.mark.parametrize("bad", ["optim.clip_norm=0", "optim.betas=[0.9,1.0]", "optim.eps=0"])
def test_out_of_range_values_are_refused_naming_the_key(compose_cfg, bad):
    from gvq.run.validate import validate
    from gvq.schema.errors import ConfigError
    with pytest.raises(ConfigError, match=bad.split("=")[0].replace(".", r"\.")):
        validate(compose_cfg("optim=adamw", bad))


class _Doubling:
    """An aggregator that doubles every gradient (a stand-in for one whose average differs from the
    local gradient): whatever clipping sees, it must see this."""
    inside_backward, max_abs, bucket = False, float("inf"), None

    def __init__(self, model):
        self.model = model

    def aggregate(self, it):
        for p in self.model.parameters():
            p.grad.mul_(2.0)
        return {}


def _every_step(model, agg):
    """``agg`` and the default method bound to it (the gradients averaged every step), and the workload
    (cross-entropy over the model's 2 classes)."""
    method = EveryStep()
    method.setup(list(model.parameters()), agg)
    return agg, method, Classification(2, (3,))


def test_clipping_applies_to_the_averaged_gradient(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2, bias=False)
        before = model.weight.detach().clone()
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        x, y = torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1])
        step(model, opt, *_every_step(model, _Doubling(model)), x, y, 0, clip_norm=1e-3)
        moved = (before - model.weight.detach()).norm()
        assert moved == pytest.approx(1e-3, rel=1e-4)           # clipped after doubling: exactly the norm
        model.weight.data.copy_(before)
        step(model, opt, *_every_step(model, _Doubling(model)), x, y, 1, clip_norm=None)
        assert (before - model.weight.detach()).norm() > 1e-2              # unclipped: the doubled gradient
    finally:
        dist.destroy_process_group()


def test_sgd_warms_up_by_default_and_only_the_recorded_presets_pin_it_off(compose_cfg):
    assert compose_cfg().optim.warmup_iters == 50
    assert compose_cfg("dataset=cifar10").optim.warmup_iters == 50        # a user's own CIFAR-format data
    for preset in ("fmnist_compare", "fmnist_tta", "fmnist_orq", "fmnist_gradiveq", "quick_compare",
                   "peers_compare", "digits_gradiveq", "paper_gradiveq", "paper_orq"):
        assert compose_cfg(f"experiment={preset}").optim.warmup_iters == 0, preset


@pytest.mark.slow
def test_the_default_cnn_run_on_cifar_format_batches_ramps_its_lr_without_a_loss_spike(tmp_path):
    # the first gradients of the CNN on CIFAR-format images are 10-30x the later ones; at the full lr the
    # first steps spiked the loss to 2-3x its start and left the net at chance (docs/results.md, "Defaults
    # on CIFAR-format data"): by default the lr ramps from lr/50, so the first steps are small
    root = write_digits_as_cifar(tmp_path / "data")
    run = tmp_path / "run"
    code, summary = launch_job(run, "dataset=cifar10", f"dataset.root={root}", "aggregator=qsgd", "logger=csv",
                               "iterations=20", "eval_every=20")
    assert code == 0 and summary["status"] == "completed", summary
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    lr = [float(r["lr"]) for r in rows]
    assert lr == pytest.approx([0.05 * (i + 1) / 50 for i in range(20)], rel=1e-6)
    loss = [float(r["train_loss"]) for r in rows]
    assert all(math.isfinite(v) for v in loss) and max(loss) < 1.5 * loss[0], loss
