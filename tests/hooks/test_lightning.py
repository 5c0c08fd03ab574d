"""gvq.hooks.lightning.GvqHook with real Lightning on 2 CPU gloo ranks: the hook averages every optimizer
step (with accumulation too), rar trains bitwise as Lightning's DDP without it, qsgd / powersgd / gradiveq
train (bf16-mixed too), a fit resumed from Lightning's checkpoint equals the uninterrupted fit, and a
strategy that is not DDP is refused in one line."""
from __future__ import annotations

import os

import pytest
import torch

from tests.helpers.dist import run_ranks

pytestmark = pytest.mark.slow
pl = pytest.importorskip("lightning.pytorch")
GvqHook = pytest.importorskip("gvq.hooks.lightning").GvqHook

BATCHES = 4                                   # per epoch and rank
OPTIONS = {"rar": {}, "qsgd": {}, "powersgd": {"start_iter": 2},
           "gradiveq": {"warmup": 1, "L_t": 3, "L_c": 50, "monitor_threshold": None}}


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                       torch.nn.Linear(4 * 6 * 6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def weights(self):
        return torch.cat([p.detach().reshape(-1) for p in self.parameters()])


def _data(rank):
    g = torch.Generator().manual_seed(rank)
    ds = torch.utils.data.TensorDataset(torch.randn(8 * BATCHES, 1, 8, 8, generator=g),
                                        torch.randint(0, 4, (8 * BATCHES,), generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=8)


def _fit(rank, option=None, epochs=1, ckpt=None, resume=None, **trainer):
    """One fit on this rank's data; returns (weights, the hook's iterations, the last iteration's stats)."""
    hook = GvqHook(option, OPTIONS[option], seed=1) if option else None
    t = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=epochs, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                   use_distributed_sampler=False, callbacks=[hook] if hook else [], **trainer)
    module = Module()
    t.fit(module, _data(rank), ckpt_path=resume)
    if ckpt:
        t.save_checkpoint(ckpt)
    if hook is None:
        return module.weights(), 0, {}
    return module.weights(), hook.state.iteration, hook.state.iteration_stats()


def _clients(rank, world, root):
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1")      # Lightning's view of the group run_ranks started
    out = {"none": _fit(rank)}
    for option in OPTIONS:
        out[option] = _fit(rank, option, epochs=2)
    out["accumulate"] = _fit(rank, "qsgd", accumulate_grad_batches=2)
    out["bf16"] = _fit(rank, "qsgd", precision="bf16-mixed")
    out["rar_once"] = _fit(rank, "rar")
    _fit(rank, "powersgd", ckpt=f"{root}/powersgd.ckpt")
    out["resumed"] = _fit(rank, "powersgd", epochs=2, resume=f"{root}/powersgd.ckpt")
    return out


def test_the_callback_averages_every_step_as_lightnings_ddp_and_resumes(tmp_path):
    ranks = run_ranks(_clients, 2, tmp_path, str(tmp_path), timeout=500.0)
    r0, r1 = ranks
    assert torch.equal(r0["rar_once"][0], r0["none"][0]) and r0["rar_once"][1] == BATCHES   # rar: bitwise DDP
    for case in ("none", *OPTIONS, "accumulate", "bf16", "resumed"):
        assert torch.isfinite(r0[case][0]).all(), case
        torch.testing.assert_close(r0[case][0], r1[case][0], rtol=0, atol=1e-6, msg=case)   # replicas
    for option in OPTIONS:
        assert r0[option][1] == 2 * BATCHES, option                 # every optimizer step, both epochs
        if option != "rar":
            assert r0[option][2]["compression_error"] > 0, option  # compressing by the end
    assert r0["accumulate"][1] == BATCHES // 2                      # one averaging per optimizer step
    assert r0["bf16"][2]["compression_error"] > 0
    torch.testing.assert_close(r0["resumed"][0], r0["powersgd"][0], rtol=0, atol=1e-6)
    assert r0["resumed"][1] == 2 * BATCHES                          # the checkpoint's count went on


def test_a_strategy_that_is_not_ddp_is_refused_in_one_line():
    t = pl.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, callbacks=[GvqHook("rar")])
    with pytest.raises(ValueError, match="GvqHook: Lightning strategy SingleDeviceStrategy is not DDP") as e:
        t.fit(Module(), _data(0))
    assert "\n" not in str(e.value)


def test_a_callback_torn_down_before_fit_started_has_nothing_to_close():
    hook = GvqHook("rar")
    hook.teardown(None, None, "fit")                 # Lightning tears down after a setup failure too
    assert hook.state is None
