"""gvq.hooks.checkpoint through accelerate on 2 gloo ranks: ``register_for_checkpointing(AllRanks(state))``
+ ``save_state`` / ``load_state`` resumes every option's hook equal to the uninterrupted run (each rank
gets back its own error memory, dither and samples), rar trains bitwise as accelerate's DDP without a hook,
and a checkpoint of another world size is refused."""
from __future__ import annotations

import os

import pytest
import torch

from gvq.hooks import GvqHookState, gvq_hook
from gvq.hooks.checkpoint import AllRanks
from tests.helpers.dist import run_ranks

pytestmark = pytest.mark.slow
accelerate = pytest.importorskip("accelerate")

STEPS, SAVE_AT = 8, 4
# each option compresses before the checkpoint, so its per-rank state is live when saved
OPTIONS = {"rar": {}, "qsgd": {}, "powersgd": {"start_iter": 2},
           "gradiveq": {"warmup": 1, "L_t": 3, "L_c": 50, "monitor_threshold": None},
           "randomk": {"compressor.ratio": 0.1}, "natural": {}}   # error feedback's memory; the per-rank lanes


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 6 * 6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _batch(rank, it):
    g = torch.Generator().manual_seed(100 * it + rank)
    return torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)


def _train(rank, option, steps, ckpt=None, resume=False):
    """Steps ``steps`` of one accelerate run; saves its state to ``ckpt`` after step SAVE_AT - 1, or first
    loads it (``resume``).  Returns the parameters."""
    acc = accelerate.Accelerator(cpu=True)
    net = _net()
    model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9))
    if option is None:                        # accelerate's DDP as it is, no hook
        return _steps(acc, model, opt, rank, steps), {}
    state = GvqHookState.from_config(option, net.parameters(), OPTIONS[option], seed=1)
    model.register_comm_hook(state, gvq_hook)
    acc.register_for_checkpointing(AllRanks(state))
    if resume:
        acc.load_state(ckpt)
    weights = _steps(acc, model, opt, rank, steps, None if resume else ckpt)
    stats = state.iteration_stats()
    state.close()
    return weights, stats


def _steps(acc, model, opt, rank, steps, ckpt=None):
    for it in steps:
        x, y = _batch(rank, it)
        opt.zero_grad()
        acc.backward(torch.nn.functional.cross_entropy(model(x), y))
        opt.step()
        if ckpt is not None and it == SAVE_AT - 1:
            acc.save_state(ckpt)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _resume_each(rank, world, root):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1")   # accelerate's view of the group
    out = {"none": _train(rank, None, range(STEPS))}
    for option in OPTIONS:
        ckpt = f"{root}/{option}"
        whole, stats = _train(rank, option, range(STEPS))
        _train(rank, option, range(SAVE_AT), ckpt)
        resumed, _ = _train(rank, option, range(SAVE_AT, STEPS), ckpt, resume=True)
        out[option] = whole, resumed, stats
    return out


def test_accelerate_save_and_load_state_resume_equal_to_the_uninterrupted_run(tmp_path):
    ranks = run_ranks(_resume_each, 2, tmp_path, str(tmp_path / "ckpt"), timeout=400.0)
    assert torch.equal(ranks[0]["rar"][0], ranks[0]["none"][0])        # rar: bitwise accelerate's own DDP
    for option in OPTIONS:
        (w0, r0, s0), (w1, r1, _) = ranks[0][option], ranks[1][option]
        torch.testing.assert_close(r0, w0, rtol=0, atol=1e-6, msg=f"{option}: resumed != uninterrupted")
        torch.testing.assert_close(r1, w1, rtol=0, atol=1e-6, msg=f"{option}: rank 1")
        torch.testing.assert_close(w0, w1, rtol=0, atol=1e-6, msg=f"{option}: replicas differ")
        if option != "rar":
            assert s0["compression_error"] > 0, f"{option}: not compressing at the end: {s0}"
    saved = torch.load(tmp_path / "ckpt" / "qsgd" / "custom_checkpoint_0.pkl", weights_only=True)
    assert [r["rank"] for r in saved["ranks"]] == [0, 1]       # both ranks' states, from rank 0's file


def _other_world(rank, world):
    net = _net()
    with GvqHookState.from_config("qsgd", net.parameters()) as state:
        view = AllRanks(state)
        saved = view.state_dict()
        view.load_state_dict(saved)                           # its own: taken
        try:
            view.load_state_dict({**saved, "world_size": 3, "ranks": saved["ranks"] * 2})
        except ValueError as e:
            return str(e)


def test_a_checkpoint_of_another_world_size_is_refused_in_one_line(tmp_path):
    for message in run_ranks(_other_world, 2, tmp_path):
        assert message == "gvq hook: a checkpoint of 3 ranks cannot resume on 2 (each rank's state is its own)"
