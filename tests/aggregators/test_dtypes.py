"""gvq/aggregators/dtypes.py: every ring option keeps each parameter's dtype (float32, float64, bfloat16,
float16) or refuses it at setup in one line, on a mixed-dtype model:

* through the DDP hook (one bucket per dtype) on 2 gloo ranks, every option of ``hook_options()`` in one
  spawn: each parameter keeps its dtype, weights stay finite and equal across ranks, rar's mean is the
  ranks' mean at each dtype's own precision, powersgd and gradiveq reach their compressed phase;
* post-backward (``setup`` + ``aggregate``, one flat gradient in the widest dtype) at one rank;
* GradiVeQ refuses float64 in one line naming the option, the dtype and what to do.
"""
from __future__ import annotations

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from gvq.aggregators.base import RunContext
from gvq.aggregators.dtypes import widest_dtype
from gvq.hooks import GvqHookState, gvq_hook
from gvq.hooks.config import build_aggregator, hook_options
from tests.helpers.dist import run_cases

F32, F64, BF16, F16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
MIXED = (F64, BF16, F16)                      # the linear layers' dtypes after a float32 conv
NO_F64 = (F32, BF16, F16)
REFUSES_F64 = {"gradiveq", "gradiveq_bf16", "gradiveq_pooled"}
#: short schedules: powersgd compresses from the second step, gradiveq samples two steps then compresses
SHORT = {"powersgd": {"start_iter": 1, "min_compression_rate": 0.5},
         "gradiveq": {"L_t": 2, "warmup": 0, "monitor_threshold": None}}
STEPS = 3


class Mixed(torch.nn.Module):
    """A float32 conv (GradiVeQ's groups), then linear layers of the given dtypes, each fed its own."""

    def __init__(self, dtypes=MIXED):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        widths = [64, 8, 8, 3]
        self.fcs = torch.nn.ModuleList(torch.nn.Linear(a, b, dtype=d)
                                       for a, b, d in zip(widths, widths[1:], dtypes))

    def forward(self, x):
        h = torch.relu(self.conv(x)).flatten(1)
        for fc in self.fcs:
            h = fc(h.to(fc.weight.dtype))
        return h.float()


def _overrides(option: str) -> dict:
    return SHORT.get(option.split("_")[0], {})


def _batch(rank: int, it: int):
    g = torch.Generator().manual_seed(10 * it + rank)
    return torch.randn(4, 1, 6, 6, generator=g), torch.randint(0, 3, (4,), generator=g)


def _refusal(option: str, dtypes, build) -> str | None:
    """The one-line refusal of ``build(option, Mixed(dtypes))``, or None where it is built."""
    try:
        build(option, Mixed(dtypes)).close()
    except ValueError as e:
        return str(e)
    return None


def _train_through_hook(rank, world, option):
    """``option`` as DDP's hook on the mixed model (without float64 where it refuses it): the refusal,
    the final weights, each step's local and averaged gradients, the last step's measurements."""
    def build(name, net):
        return GvqHookState.from_config(name, net.parameters(), _overrides(name), seed=1, timeout_s=30.0)
    refused = _refusal(option, MIXED, build) if option in REFUSES_F64 else None   # (the others train on it)
    torch.manual_seed(0)
    net = Mixed(NO_F64 if option in REFUSES_F64 else MIXED)
    ddp = DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    local, averaged = [], []
    with build(option, net) as state:
        ddp.register_comm_hook(state, gvq_hook)
        for it in range(STEPS):
            x, y = _batch(rank, it)
            loss = torch.nn.functional.cross_entropy(net(x), y)          # this rank's own gradient
            local.append(torch.autograd.grad(loss, list(net.parameters())))
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            averaged.append([p.grad.clone() for p in net.parameters()])
            opt.step()
        stats = state.iteration_stats()
    return refused, [p.detach().clone() for p in net.parameters()], local, averaged, stats


def _assert_mean(local0, local1, averaged):
    """Each averaged gradient is the ranks' mean within two roundings of its own dtype."""
    for g0, g1, avg in zip(local0, local1, averaged):
        mean = (g0.double() + g1.double()) / 2
        bound = 2 * torch.finfo(avg.dtype).eps * float((g0.double().abs() + g1.double().abs()).max())
        assert float((avg.double() - mean).abs().max()) <= bound, avg.dtype


@pytest.mark.slow
def test_every_hook_option_keeps_each_parameters_dtype_or_refuses_it_in_one_line(tmp_path):
    options = tuple(hook_options())
    results = run_cases(_train_through_hook, 2, tmp_path, tuple((o,) for o in options), timeout_per_case=30.0)
    for option in options:
        (refused, w0, local0, avg0, stats), (_, w1, local1, _, _) = results[(option,)]
        kept = NO_F64 if option in REFUSES_F64 else MIXED
        assert [w.dtype for w in w0] == [F32, F32] + [d for d in kept for _ in "wb"], option
        assert all(torch.isfinite(w).all() for w in w0), option
        assert all(torch.equal(a, b) for a, b in zip(w0, w1)), f"{option}: replicas differ"
        if option in REFUSES_F64:
            assert refused.startswith("gvq: gradiveq: float64 parameters are not supported (") \
                and "\n" not in refused, refused
        if option == "rar":
            for step in range(STEPS):
                _assert_mean(local0[step], local1[step], avg0[step])
        if option == "powersgd":
            assert stats["compression_error"] > 0            # P and Q ran, float32 for the 16-bit buckets
        if option in REFUSES_F64:
            assert stats["phase"] == "compress"


def _post_backward(option: str, net: torch.nn.Module):
    agg = build_aggregator(option, **_overrides(option))
    agg.setup(list(net.parameters()), RunContext(0, 1, seed=1))
    return agg


@pytest.mark.parametrize("option", hook_options())
def test_post_backward_keeps_each_parameters_dtype_in_one_flat_gradient_of_the_widest(option):
    refused = _refusal(option, MIXED, _post_backward)
    assert (refused is not None) == (option in REFUSES_F64), refused
    torch.manual_seed(0)
    net = Mixed(NO_F64 if refused else MIXED)
    agg = _post_backward(option, net)
    assert agg.bucket is None                   # no single buffer holds grads of several dtypes
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for it in range(STEPS):
        x, y = _batch(0, it)
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(net(x), y).backward()
        own = [p.grad.clone() for p in net.parameters()]
        stats = agg.aggregate(it)
        assert [p.grad.dtype for p in net.parameters()] == [p.dtype for p in net.parameters()], option
        if option == "rar":                     # one rank: the mean is its own gradient, bit for bit
            assert all(torch.equal(a, p.grad) for a, p in zip(own, net.parameters()))
        opt.step()
    assert all(torch.isfinite(p).all() for p in net.parameters()), option
    if option == "powersgd":
        assert stats["compression_error"] > 0
    agg.close()


def test_the_flat_gradient_and_error_memories_are_in_the_widest_dtype():
    net = Mixed()
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    ef_qsgd = build_aggregator("qsgd", _target_="gvq.aggregators.error_feedback.ErrorFeedbackAggregator")
    ef_qsgd.setup(list(net.parameters()), RunContext(0, 1))
    sixteen = Mixed((BF16, BF16, BF16)).to(BF16)
    aggs = [_post_backward("rar", net), _post_backward("powersgd", net), ef_qsgd,
            _post_backward("powersgd", sixteen)]
    rar, powersgd, ef, powersgd16 = aggs
    flat = rar.flatten()
    assert flat.dtype == F64 and bool((flat == 1).all())
    flat.mul_(1 + 2.0 ** -40)                   # below float32's precision: kept for the float64 layer
    rar.unflatten(flat)
    assert float(net.fcs[0].weight.grad[0, 0]) == 1 + 2.0 ** -40 and net.fcs[1].weight.grad.dtype == BF16
    assert powersgd.feedback.memory.dtype == F64 and powersgd.low_rank.dtype == F64 and ef.feedback.memory.dtype == F64
    assert powersgd16.low_rank.dtype == F32 and powersgd16.feedback.memory.dtype == F32   # no bf16 QR: float32
    for agg in aggs:
        agg.close()


@pytest.mark.parametrize("dtypes,at_least,widest", [
    ((F32, F64), None, F64), ((BF16, F16), None, F32), ((BF16,), F32, F32), ((F64,), F32, F64),
    ((), None, F32)])
def test_widest_dtype_loses_no_value_of_any(dtypes, at_least, widest):
    assert widest_dtype(dtypes, at_least) == widest
