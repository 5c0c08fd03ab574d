"""method=local_sgd (gvq/methods/local_sgd.py): on 2 gloo ranks it equals torch's own
``PeriodicModelAverager(period=H, warmup_steps=0)`` run in the same test on the same batches; before
``start_iter`` it averages the gradients every step (post-local SGD), replicas identical throughout."""
from __future__ import annotations

import warnings

import torch

from gvq.aggregators.base import RunContext
from gvq.aggregators.rar import RingAllReduce
from gvq.methods.local_sgd import LocalSGD
from tests.helpers.dist import run_ranks

STEPS, H = 9, 3


def _model() -> torch.nn.Module:
    torch.manual_seed(0)                      # the same start on every rank
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def _batch(rank: int, it: int):
    g = torch.Generator().manual_seed(1000 * rank + it)       # each rank its own data
    return torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)


def _backward(model, opt, rank, it):
    x, y = _batch(rank, it)
    opt.zero_grad(set_to_none=False)
    torch.nn.functional.cross_entropy(model(x), y).backward()


def _gvq_and_torch(rank, world):
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    ours, theirs = _model(), _model()
    opt_a = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    agg = RingAllReduce(topology="ring")
    agg.setup(list(ours.parameters()), RunContext(rank, world))
    method = LocalSGD(every=H, start_iter=0)
    method.setup(list(ours.parameters()), agg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        averager = PeriodicModelAverager(period=H, warmup_steps=0)
    gaps, synced, sent = [], [], []
    for it in range(STEPS):
        _backward(ours, opt_a, rank, it)
        stats = method.before_step(it)
        opt_a.step()
        stats.update(method.after_step(it))
        _backward(theirs, opt_b, rank, it)
        opt_b.step()
        averager.average_parameters(theirs.parameters())
        gaps.append(max(float((a - b).abs().max()) for a, b in zip(ours.parameters(), theirs.parameters())))
        synced.append(stats["synced"])
        sent.append(stats["bytes_sent"])
    agg.close()
    return gaps, synced, sent


def test_local_sgd_equals_torchs_periodic_model_averager(tmp_path):
    """Averaged parameters through rar's ring (as Δ = θ_global − θ_local, an outer step of lr 1) against torch's
    all-reduce of the parameters: equal within 1e-6 at every step (float32 sums in another order), and the
    syncs on torch's schedule: right after step 0, then every H."""
    for rank, (gaps, synced, sent) in enumerate(run_ranks(_gvq_and_torch, 2, tmp_path)):
        assert max(gaps) < 1e-6, (rank, gaps)
        assert synced == [int(it % H == 0) for it in range(STEPS)]
        assert [s > 0 for s in sent] == [bool(s) for s in synced]      # bytes at syncs only


def _post_local(rank, world):
    from gvq.run.train import replicas_identical
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    agg = RingAllReduce(topology="ring")
    agg.setup(list(model.parameters()), RunContext(rank, world))
    method = LocalSGD(every=3, start_iter=4)
    method.setup(list(model.parameters()), agg)
    out = []
    for it in range(10):
        _backward(model, opt, rank, it)
        stats = method.before_step(it)
        opt.step()
        stats.update(method.after_step(it))
        out.append((stats["synced"], method.averages_gradients(it), replicas_identical(model)))
    agg.close()
    return out


def test_post_local_sgd_averages_gradients_until_start_iter(tmp_path):
    """start_iter=4: gradients averaged at steps 0-3 (replicas identical after each), then parameters at 4, 7
    (identical there), local steps between (replicas apart)."""
    rows = run_ranks(_post_local, 2, tmp_path)[0]
    assert [s for s, _, _ in rows] == [1, 1, 1, 1, 1, 0, 0, 1, 0, 0]
    assert [g for _, g, _ in rows] == [True] * 4 + [False] * 6
    assert [same for _, _, same in rows] == [True] * 5 + [False, False, True, False, False]
