"""gvq.hooks.group: the hook averages over the ranks DDP averages over, and every state on a channel of its
own.  4 gloo ranks with DDP over the subgroups {0, 1} and {2, 3} (``new_group`` and ``new_subgroups``):
rar equals DDP's own all-reduce bitwise in each subgroup; compressed options keep each subgroup's replicas
identical and the two subgroups apart.  Two hooked models in one process, one joint backward or one after
the other: rar equals no hook bitwise, compressed options keep the ranks identical, and the processes exit
cleanly (a spawn fails on a non-zero exit).  Misuse is one line, early."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gvq.hooks import GvqHookState, gvq_hook
from gvq.hooks.group import hook_parameters, place_in
from tests.helpers.dist import run_ranks

FAST = {"rar": None, "qsgd": None, "powersgd": {"start_iter": 1},
        "gradiveq": {"warmup": 1, "L_t": 2, "L_c": 50, "monitor_threshold": None}}
STEPS = 4


def _net(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5))


def _data(rank: int, it: int, which: int = 0):
    g = torch.Generator().manual_seed(1000 * which + 10 * it + rank)
    return torch.randn(8, 12, generator=g), torch.randint(0, 5, (8,), generator=g)


def _flat(net) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def _train_in_subgroups(rank, world, option, how):
    """DDP over this rank's half ({0, 1} or {2, 3}), with (``option``) or without (None) the hook."""
    if how == "new_subgroups":
        mine, _ = dist.new_subgroups(group_size=2)
    elif how == "late":                                    # the state first, over every rank
        return _registered_late(rank)
    else:
        halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]   # every rank makes both, in order
        mine = halves[rank // 2]
    net = _net(rank // 2)                                  # each half its own replica
    ddp = DistributedDataParallel(net, process_group=mine, bucket_cap_mb=0.001)
    state = None
    if option is not None:          # handed the wrapper, or its parameters (the wrapper is then found)
        given = ddp if how != "parameters" else net.parameters()
        state = GvqHookState.from_config(option, given, FAST[option], seed=3, timeout_s=60.0)
        ddp.register_comm_hook(state, gvq_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for it in range(STEPS):
        x, y = _data(rank, it)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    stats = state.iteration_stats() if state else {}
    if state:
        state.close()
    return _flat(net), stats.get("buckets", 0)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["new_group", "new_subgroups", "parameters"])
def test_rar_in_ddp_subgroups_equals_ddps_own_allreduce_bitwise(tmp_path, how):
    plain = run_ranks(_train_in_subgroups, 4, tmp_path / "plain", None, how)
    hooked = run_ranks(_train_in_subgroups, 4, tmp_path / "rar", "rar", how)
    for r in range(4):
        assert torch.equal(hooked[r][0], plain[r][0]), f"rank {r}: rar through the hook differs from DDP's"
        assert hooked[r][1] >= 1                                      # the hook averaged it
    assert not torch.equal(plain[0][0], plain[2][0])                  # the halves are different replicas


@pytest.mark.slow
@pytest.mark.parametrize("option", ["qsgd", "powersgd", "gradiveq"])
def test_compressed_options_average_within_each_subgroup_only(tmp_path, option):
    w = [r[0] for r in run_ranks(_train_in_subgroups, 4, tmp_path, option, "new_group")]
    assert torch.equal(w[0], w[1]) and torch.equal(w[2], w[3])        # each half's replicas agree
    assert not torch.equal(w[1], w[2])                                # and the halves were not mixed
    assert all(torch.isfinite(x).all() for x in w)


def _registered_late(rank):
    """A state built on the parameters before their DDP exists (so over every rank), then registered on
    a DDP over a subgroup: its first backward refuses, naming what to build it from."""
    halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    net = _net(0)
    state = GvqHookState.from_config("rar", net.parameters(), timeout_s=60.0)
    ddp = DistributedDataParallel(net, process_group=halves[rank // 2])
    ddp.register_comm_hook(state, gvq_hook)
    x, y = _data(rank, 0)
    try:
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
    except Exception as e:          # what backward raised is the result
        return str(e), 0
    finally:
        state.close()
    return "", 0


@pytest.mark.slow
def test_a_state_registered_on_a_ddp_over_other_ranks_refuses_at_its_first_backward(tmp_path):
    for said, _ in run_ranks(_train_in_subgroups, 4, tmp_path, "rar", "late"):
        assert "averages over global ranks" in said and "from_config(option, ddp)" in said


# -- several hooked models in one process -----------------------------------------------------------

def _two_models(rank, world, option, joint, repeat):
    """Models A and B, each DDP with its own state; ``joint``: one backward of lossA + lossB, else one
    backward each.  Returns both models' final parameters (``repeat`` fresh pairs, one after another)."""
    out = []
    for _ in range(repeat):
        nets = [_net(0), _net(1)]
        # without the hook each DDP gets a group of its own too: on one shared group two reducers' own
        # all-reduces, launched in whatever order backward readies their buckets, could meet each other
        groups = [dist.new_group([0, 1]) if option is None else None for _ in nets]
        ddps = [DistributedDataParallel(n, bucket_cap_mb=0.001, process_group=g) for n, g in zip(nets, groups)]
        states = []
        if option is not None:
            for ddp in ddps:
                states.append(GvqHookState.from_config(option, ddp, FAST[option], seed=3, timeout_s=60.0))
                ddp.register_comm_hook(states[-1], gvq_hook)
        opts = [torch.optim.SGD(n.parameters(), lr=0.1) for n in nets]
        for it in range(STEPS):
            losses = []
            for k, ddp in enumerate(ddps):
                x, y = _data(rank, it, k)
                losses.append(torch.nn.functional.cross_entropy(ddp(x), y))
            for o in opts:
                o.zero_grad()
            if joint:
                (losses[0] + losses[1]).backward()
            else:
                for loss in losses:
                    loss.backward()
            for o in opts:
                o.step()
        for s in states:
            s.close()
        out.append([_flat(n) for n in nets])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("joint", [True, False], ids=["joint", "sequential"])
def test_two_hooked_models_each_average_their_own_gradients(tmp_path, joint):
    plain = run_ranks(_two_models, 2, tmp_path / "plain", None, joint, 1)
    hooked = run_ranks(_two_models, 2, tmp_path / "rar", "rar", joint, 3)
    for r in range(2):
        for rep in hooked[r]:
            for k in range(2):
                assert torch.equal(rep[k], plain[r][0][k]), f"rank {r}, model {k}: rar differs from DDP's"


@pytest.mark.slow
@pytest.mark.parametrize("option", ["qsgd", "gradiveq"])
def test_two_compressed_hooked_models_keep_their_replicas_identical(tmp_path, option):
    a, b = run_ranks(_two_models, 2, tmp_path, option, True, 1)
    for k in range(2):
        assert torch.equal(a[0][k], b[0][k]) and torch.isfinite(a[0][k]).all()


# -- misuse: one line, before anything runs -----------------------------------------------------------

def test_what_a_state_is_given_is_checked_in_one_line():
    net = _net(0)
    assert hook_parameters(net)[0] == list(net.parameters())
    for bad, says in ((None, "params=NoneType"), ([], "holds no parameters"), (net.parameters, "params=method"),
                      ([net], "holds a Sequential")):
        with pytest.raises(ValueError, match=says) as e:
            hook_parameters(bad)
        assert "\n" not in str(e.value) and "model.parameters()" in str(e.value)
    for rank, world in ((2, 2), (0, 0), (-1, 2), (True, 2)):
        with pytest.raises(ValueError, match=r"^gvq hook: rank=") as e:
            place_in(None, rank, world)
        assert "\n" not in str(e.value)
    assert place_in(None, 1, 3) == (1, 3)


def test_a_process_group_given_without_torch_distributed_is_refused_in_one_line():
    from gvq.hooks.group import ring_ranks
    assert not dist.is_initialized()                 # the test process never joins a group (ranks do)
    with pytest.raises(ValueError, match="a process group was given but torch.distributed is not initialized"):
        ring_ranks(object())
    assert ring_ranks(None) is None
