"""torch DDP as an aggregator (gvq/aggregators/ddp.py): mean gradients, byte estimates, training quality
against rar (with PowerSGD on our ring alongside)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from gvq.aggregators.base import RunContext
from gvq.aggregators.ddp import DDPAggregator
from gvq.schema.options import DDPSchema, knobs
from tests.helpers.dist import run_ranks


def _mean_grad_check(rank, world):
    """After backward through DDP, p.grad is the mean over ranks of the local gradients."""
    out = {}
    for hook in ("allreduce", "fp16"):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
        x = torch.randn(8, 5, generator=torch.Generator().manual_seed(rank))
        local = torch.autograd.grad(net(x).square().sum(), list(net.parameters()))
        agg = DDPAggregator(**knobs(DDPSchema, hook=hook))
        agg.setup(list(net.parameters()), RunContext(rank, world))
        model = agg.wrap(net)
        model(x).square().sum().backward()
        stats = {**agg.aggregate(0), "inside_compute_s": agg.inside_compute_s}
        means = [g.clone() for g in local]
        for m in means:
            dist.all_reduce(m)
        out[hook] = ([p.grad.clone() for p in net.parameters()], [m / world for m in means], stats)
    return out


@pytest.mark.slow
def test_ddp_leaves_the_mean_gradient_in_p_grad(tmp_path):
    for r in run_ranks(_mean_grad_check, 2, tmp_path):
        for hook, tol in (("allreduce", 1e-6), ("fp16", 2e-3)):
            grads, means, stats = r[hook]
            assert all(torch.allclose(g, m, rtol=tol, atol=tol) for g, m in zip(grads, means)), hook
            numel = sum(m.numel() for m in means)
            assert stats["bytes_sent"] == numel * (4 if hook == "allreduce" else 2)   # 2(N-1)/N = 1
            assert stats["comm_s"] >= stats["exposed_s"] >= 0 and stats["comm_s"] > 0
            # backward's wait for its last bucket is aggregate_s, and compute_s gives it back
            assert stats["aggregate_s"] >= stats["inside_compute_s"] == stats["exposed_s"]


def _bucket_counts(rank, world):
    """Buckets DDP all-reduces per iteration for a ~2 MB gradient: at DDP's defaults, and at 25 MB."""
    out = {}
    for cap in (None, 25.0):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512), torch.nn.Linear(512, 4))
        agg = DDPAggregator(**knobs(DDPSchema, bucket_cap_mb=cap))
        agg.setup(list(net.parameters()), RunContext(rank, world))
        model = agg.wrap(net)
        counts = []
        for _ in range(3):                            # DDP rebuilds its buckets after the first iteration
            model(torch.randn(4, 512)).sum().backward()
            counts.append(agg.aggregate(0)["buckets"])
        out[cap] = counts
    return out


@pytest.mark.slow
def test_ddp_keeps_its_small_first_bucket_unless_a_size_is_set(tmp_path):
    for r in run_ranks(_bucket_counts, 2, tmp_path):
        # from DDP's bucket rebuild on: its 1 MiB first bucket, so communication starts earlier
        assert all(n > 1 for n in r[None][1:]), r
        assert r[25.0][1:] == [1, 1], r                 # a size passed: one 25 MB bucket


TRAINED = ("rar", "ddp", "ddp_fp16", "ddp_powersgd", "powersgd")


def _train_all(rank, world, cfgs, root):
    from gvq.run.train import train
    out = {}
    for name, cfg in cfgs.items():
        summary = train(cfg, rank, world, f"{root}/{name}", {"run_dir": f"{root}/{name}"})
        out[name] = None if summary is None else summary["final_test_acc"]
    return out


@pytest.mark.slow
def test_ddp_aggregators_and_powersgd_train_digits_to_the_rar_band(compose_cfg, tmp_path):
    cfgs = {}
    for name in TRAINED:
        cfg = compose_cfg(f"aggregator={name}", "iterations=150", "eval_every=150", "logger=csv",
                          "logger.progress=false")
        cfgs[name] = OmegaConf.to_container(cfg, resolve=True)
        (tmp_path / name).mkdir()
    acc = run_ranks(_train_all, 2, tmp_path, cfgs, str(tmp_path), timeout=240)[0]
    assert acc["rar"] >= 0.9, acc
    for name in TRAINED[1:]:
        assert abs(acc[name] - acc["rar"]) <= 0.04, acc     # replicas equal: train() checks it



@pytest.mark.parametrize("make,key", [
    (lambda: DDPAggregator(**knobs(DDPSchema, hook="powersgd", rank=0)), "aggregator.rank"),
    (lambda: DDPAggregator(**knobs(DDPSchema, hook="powersgd", start_iter=1)), "aggregator.start_iter"),
])
def test_bad_knobs_raise_value_error_naming_the_key(make, key):
    with pytest.raises(ValueError, match=key):
        make()



def _powersgd_state_roundtrip(rank, world, path):
    def wrapped():
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(16, 12), torch.nn.ReLU(), torch.nn.Linear(12, 4))
        agg = DDPAggregator(**knobs(DDPSchema, hook="powersgd", rank=1, start_iter=2, min_compression_rate=0.5))
        agg.setup(list(net.parameters()), RunContext(rank, world))
        return agg, agg.wrap(net)

    agg, model = wrapped()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank))
    for it in range(4):
        model(x).square().sum().backward()
        agg.aggregate(it)
    torch.save(agg.state_dict(), f"{path}/{rank}.pt")
    fresh, _ = wrapped()
    fresh.load_state_dict(torch.load(f"{path}/{rank}.pt", weights_only=True))   # data only
    a, b = agg.timing.inner_state, fresh.timing.inner_state
    same_rng = all(bool((u == v).all()) if hasattr(u, "shape") else u == v
                   for u, v in zip(a.rng.get_state(), b.rng.get_state()))
    return a.iter, b.iter, same_rng


@pytest.mark.slow
def test_ddp_powersgd_state_is_data_and_carries_iteration_and_rng(tmp_path):
    for it_a, it_b, same_rng in run_ranks(_powersgd_state_roundtrip, 2, tmp_path, str(tmp_path)):
        assert it_a == it_b == 4 and same_rng


def test_powersgd_hook_memory_follows_parameters_across_rebucketing():
    """DDP re-buckets (a new instance after a resume, its first rebuild): the hook's error memory and P / Q,
    keyed by bucket, are cut per parameter on the old layout and rebuilt for the new one."""
    from types import SimpleNamespace

    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    from gvq.aggregators import ddp_memory
    st = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=1, min_compression_rate=1.0)
    shapes = [(8, 4), (3,), (8, 4), (5, 6)]                  # bias (3,) is never compressed
    state = SimpleNamespace(inner_state=st, shapes=shapes, buckets={}, pending=None)
    tag = {i: float(10 * (i + 1)) for i in range(4)}          # every element of parameter i holds tag[i]
    pq = {i: (shapes[i][0], shapes[i][1]) for i in (0, 2, 3)}   # P: n * 1, Q: m * 1 values

    def fill(b, params):
        ddp_memory.see_bucket(state, b, params)
        st.error_dict[b] = torch.cat([torch.full((math.prod(shapes[i]),), tag[i]) for i in params])
        layout = ddp_memory.pq_layout(state, params)
        st.p_memory_dict[b] = torch.cat([torch.full((pq[i][0],), tag[i] + 1) for i, _, _ in layout])
        st.q_memory_dict[b] = torch.cat([torch.full((pq[i][1],), tag[i] + 2) for i, _, _ in layout])

    fill(0, [3, 2]), fill(1, [1, 0])                          # the saved run's buckets
    ddp_memory.see_bucket(state, 0, [0, 1, 2, 3])             # re-bucketed: one bucket, model order
    assert state.buckets == {0: [0, 1, 2, 3]} and 1 not in st.error_dict
    want = torch.cat([torch.full((math.prod(shapes[i]),), tag[i]) for i in range(4)])
    assert torch.equal(st.error_dict[0], want)
    # the hook's layout: shape (8, 4) first (parameters 0 and 2), then (5, 6)
    assert [i for i, _, _ in ddp_memory.pq_layout(state, [0, 1, 2, 3])] == [0, 2, 3]
    assert torch.equal(st.p_memory_dict[0], torch.cat([torch.full((pq[i][0],), tag[i] + 1) for i in (0, 2, 3)]))
    assert torch.equal(st.q_memory_dict[0], torch.cat([torch.full((pq[i][1],), tag[i] + 2) for i in (0, 2, 3)]))


def _buffers_after_forward(rank, world):
    from gvq.aggregators.ddp import wrap_ddp
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    ddp = wrap_ddp(net, bucket_cap_mb=0.001)           # (construction copies rank 0's state to all)
    net[1].running_mean.fill_(float(rank))             # then each rank's own statistics
    ddp.eval()                                         # the forward leaves the running stats as they are
    ddp(torch.ones(2, 4))
    return net[1].running_mean.clone(), ddp.bucket_bytes_cap


@pytest.mark.slow
def test_wrap_ddp_keeps_each_ranks_buffers_and_takes_the_bucket_cap(tmp_path):
    """Every gvq comparison wraps the model one way (the DDP options, the overlapped hook, the benches'
    torch DDP): DDP's per-forward buffer broadcast off, so no mode sends more than it is charged for."""
    (mean0, cap), (mean1, _) = run_ranks(_buffers_after_forward, 2, tmp_path)
    assert torch.equal(mean0, torch.zeros(4)) and torch.equal(mean1, torch.ones(4))   # not rank 0's
    assert cap == int(0.001 * 1024 * 1024)


#: a two-block GPT: a 1.7 MB gradient, more than DDP's first bucket (1 MB), so DDP's default buckets are two
TWO_BUCKET_LM = ["dataset=text", "dataset.context=16", "dataset.n_test=16", "model=gpt_tiny", "model.layers=2",
                 "model.context=16", "optim=adamw", "iterations=14", "eval_every=14", "batch_size=4", "logger=csv",
                 "logger.progress=false"]


@pytest.mark.slow
def test_ddp_powersgd_at_its_defaults_trains_a_model_larger_than_one_default_bucket(compose_cfg, tmp_path):
    """Past ``start_iter`` (10), where torch's PowerSGD hook starts compressing: with DDP's default buckets
    (two here) the ranks posted its all-reduces in different orders and the run died (SIGABRT), hung, or ended
    with different replicas; ``train`` raises on any of those."""
    text = tmp_path / "corpus.txt"
    text.write_text("".join(f"Line {i} of a short text the test writes for itself.\n" for i in range(200)))
    cfg = OmegaConf.to_container(compose_cfg("aggregator=ddp_powersgd", *TWO_BUCKET_LM, f"dataset.path={text}"),
                                 resolve=True)
    assert cfg["aggregator"]["start_iter"] < cfg["iterations"]
    (tmp_path / "psgd").mkdir()
    acc = run_ranks(_train_all, 2, tmp_path, {"psgd": cfg}, str(tmp_path), timeout=240)[0]
    assert acc["psgd"] is not None
