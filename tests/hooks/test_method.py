"""gvq/hooks/method.py: a method in a user's own DDP loop on 2 gloo ranks — local SGD through MethodSync equals
torch's own ``PeriodicModelAverager(period=H)`` on the same batches; between syncs DDP communicates no
gradient (its comm hook is never called) and the aggregator sends nothing; a resume from the script's own
checkpoint taken mid-period equals the uninterrupted run bitwise; a step whose backward ran outside
``no_sync``, a misspelt method key, an unknown method and an aggregator that cannot average a vector are
refused in one line; DeMo sends its payloads every step.  On 4 ranks as 2 nodes x 2, DiLoCo with
method.workers=node through MethodSync equals the training loop's calls of the method, its inner steps on
the intra-node links only."""
from __future__ import annotations

import io
import warnings

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from gvq.hooks import MethodSync
from gvq.schema.errors import ConfigError
from tests.helpers.dist import run_ranks
from tests.helpers.errors import assert_one_line_unchained

pytestmark = pytest.mark.slow

STEPS, H = 9, 3


def _net() -> torch.nn.Module:
    torch.manual_seed(0)                      # the same start on every rank
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def _step(ddp, opt, sync, rank, it):
    g = torch.Generator().manual_seed(1000 * rank + it)       # each rank its own data
    x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
    opt.zero_grad(set_to_none=False)
    with sync.no_sync():
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()
    return sync.after_step()


def _counting(calls: list):
    """DDP's own all-reduce hook, each call recorded (DDP calls a hook once per bucket it communicates)."""
    def hook(state, bucket):                        # (DDP refuses string annotations)
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)
    return hook


def _against_torch(rank, world):
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    ours, theirs = DistributedDataParallel(_net()), _net()
    opt_a = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    sync = MethodSync.from_config("local_sgd", ours, {"method.every": H})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        averager = PeriodicModelAverager(period=H, warmup_steps=0)
    gaps, bytes_sent = [], []
    for it in range(STEPS):
        bytes_sent.append(_step(ours, opt_a, sync, rank, it).get("bytes_sent", 0))
        g = torch.Generator().manual_seed(1000 * rank + it)
        x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
        opt_b.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(theirs(x), y).backward()
        opt_b.step()
        averager.average_parameters(theirs.parameters())
        gaps.append(max(float((a - b).abs().max()) for a, b in zip(ours.module.parameters(), theirs.parameters())))
    sync.close()
    return gaps, bytes_sent


def test_local_sgd_in_a_ddp_loop_equals_torchs_periodic_model_averager(tmp_path):
    """Within 1e-6 at every step (float32 sums in another order: gvq's ring against torch's all-reduce), the
    parameters averaged right after step 0, then every H, as torch does; gvq's bytes at those steps only."""
    for rank, (gaps, sent) in enumerate(run_ranks(_against_torch, 2, tmp_path)):
        assert max(gaps) < 1e-6, (rank, gaps)
        assert [s > 0 for s in sent] == [it % H == 0 for it in range(STEPS)], sent


def _communication(rank, world):
    ddp = DistributedDataParallel(_net())
    calls: list = []
    ddp.register_comm_hook(None, _counting(calls))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    sync = MethodSync.from_config("local_sgd", ddp, {"method.every": H, "method.start_iter": 2})
    rows = []
    for it in range(STEPS):
        before = len(calls)
        row = _step(ddp, opt, sync, rank, it)
        same = [p.detach().clone() for p in ddp.module.parameters()]
        rows.append((len(calls) - before, row["synced"], row.get("bytes_sent", 0), same))
    refused = None
    x = torch.randn(8, 5)
    ddp(x).sum().backward()                     # outside no_sync on a local step (iteration 9: local)
    opt.step()
    try:
        sync.after_step()
    except ValueError as e:
        refused = str(e)
    sync.close()
    return rows, refused


def test_no_gradient_is_communicated_between_syncs(tmp_path):
    """Post-local SGD, start_iter 2, every 3: DDP's hook called at steps 0-1 only (gradients averaged, by
    DDP), never on a local step; the aggregator sends at the parameter syncs (2, 5, 8) only; replicas equal
    after every sync, apart between.  A backward outside no_sync on a local step is refused."""
    ranks = run_ranks(_communication, 2, tmp_path)
    for rows, refused in ranks:
        assert [calls > 0 for calls, *_ in rows] == [it < 2 for it in range(STEPS)]
        assert [synced for _, synced, *_ in rows] == [int(it in (0, 1, 2, 5, 8)) for it in range(STEPS)]
        assert [sent > 0 for _, _, sent, _ in rows] == [it in (2, 5, 8) for it in range(STEPS)]
        assert refused is not None and "outside sync.no_sync()" in refused and "\n" not in refused
    (a, _), (b, _) = ranks
    equal = [all(torch.equal(p, q) for p, q in zip(ra[3], rb[3])) for ra, rb in zip(a, b)]
    assert equal == [it in (0, 1, 2, 5, 8) for it in range(STEPS)]


def _run(rank, steps, start=None):
    """DiLoCo (every 4, Nesterov outer step, rar) over ``steps``; from ``start`` (a checkpoint's bytes) if
    given.  Returns the parameters, the method's state and the checkpoint at the end."""
    ddp = DistributedDataParallel(_net())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    sync = MethodSync.from_config("diloco", ddp, {"method.every": 4})
    if start is not None:
        ckpt = torch.load(io.BytesIO(start), weights_only=False)
        ddp.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        sync.load_state_dict(ckpt["gvq"])
    for it in range(sync.iteration, steps):
        _step(ddp, opt, sync, rank, it)
    buf = io.BytesIO()
    torch.save({"model": ddp.module.state_dict(), "opt": opt.state_dict(), "gvq": sync.state_dict()}, buf)
    state = sync.state_dict()
    sync.close()
    return [p.detach().clone() for p in ddp.module.parameters()], state, buf.getvalue()


def _resume(rank, world):
    whole, whole_state, _ = _run(rank, 10)
    _, _, ckpt = _run(rank, 6)                  # stopped after step 5: mid-period (syncs after 3, 7)
    resumed, resumed_state, _ = _run(rank, 10, ckpt)
    other = torch.load(io.BytesIO(ckpt), weights_only=False)["gvq"]
    other["rank"] = 1 - rank
    try:
        _run(rank, 6, _saved({**torch.load(io.BytesIO(ckpt), weights_only=False), "gvq": other}))
        refused = None
    except ValueError as e:
        refused = str(e)
    return whole, whole_state, resumed, resumed_state, refused


def _saved(ckpt: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    return buf.getvalue()


def test_a_resume_mid_period_from_the_scripts_checkpoint_is_bitwise(tmp_path):
    """Each rank's own checkpoint (its model, its inner optimizer, sync.state_dict(): the global copy, the
    outer momentum, the step) after step 5 of DiLoCo every 4, resumed to step 10: every parameter, the global
    copy and the outer momentum equal the uninterrupted run's bit for bit; another rank's state is refused."""
    for whole, whole_state, resumed, resumed_state, refused in run_ranks(_resume, 2, tmp_path):
        assert all(torch.equal(a, b) for a, b in zip(whole, resumed))
        assert torch.equal(whole_state["method"]["global"], resumed_state["method"]["global"])
        m = [s["method"]["outer"]["state"][0]["momentum_buffer"] for s in (whole_state, resumed_state)]
        assert torch.equal(*m) and m[0].abs().sum() > 0
        assert whole_state["iteration"] == resumed_state["iteration"] == 10
        assert refused is not None and "not this rank's" in refused


@pytest.mark.parametrize("method,overrides,aggregator,says", [
    ("diloco", {"method.evry": 30}, "rar", "method.evry: unknown key; did you mean method.every?"),
    ("dilocco", {}, "rar", "method=dilocco: no such option; did you mean method=diloco?"),
    ("local_sgd", {"method.every": 0}, "rar", "method.every=0: must be an integer >= 1"),
    ("diloco", {"compressor.bitz": 4}, "qsgd", "compressor.bitz"),
    ("diloco", {}, "ddp", "not a gvq ring aggregator"),
])
def test_a_bad_method_or_aggregator_is_refused_in_one_line(method, overrides, aggregator, says):
    """Refused before any process group is needed (no ranks here), as the CLI refuses it."""
    with pytest.raises(ConfigError) as e:
        MethodSync.from_config(method, None, overrides, aggregator=aggregator)
    assert_one_line_unchained(e.value)
    assert says in str(e.value), str(e.value)


def test_a_model_not_wrapped_in_ddp_is_refused():
    with pytest.raises(ValueError, match="hand it the DistributedDataParallel wrapper"):
        MethodSync.from_config("local_sgd", _net())


def _node_steps(rank, hooked, steps=7):
    """DiLoCo every 3 with workers=node at 2 x 2, each rank its own data: through MethodSync around a DDP over
    every rank (``hooked``) or as the training loop calls the method; per step every rank's parameters and
    this rank's row, and how often DDP's own all-reduce ran."""
    from gvq.aggregators.base import RunContext
    from gvq.comm.links import Cluster
    from gvq.hooks.method import compose_method
    over = {"method.every": 3, "method.workers": "node"}
    model, calls, rows = _net(), [], []
    if hooked:
        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(None, _counting(calls))
        sync = MethodSync.from_config("diloco", ddp, over, cluster=Cluster(2))
    else:
        from gvq.aggregators.rar import RingAllReduce
        agg, method = RingAllReduce(topology="ring"), compose_method("diloco", over)
        agg.setup(list(model.parameters()), method.aggregator_context(RunContext(rank, 4, cluster=Cluster(2))))
        method.setup(list(model.parameters()), agg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for it in range(steps):
        if hooked:
            row = _step(ddp, opt, sync, rank, it)
        else:
            g = torch.Generator().manual_seed(1000 * rank + it)
            x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            row = method.before_step(it)
            opt.step()
            row = {**row, **method.after_step(it)}
        rows.append((_everyone(model), row["bytes_sent"], row["bytes_inter"]))
    (sync if hooked else method).close()
    return rows, len(calls)


def _everyone(model) -> list[torch.Tensor]:
    """Every rank's parameters as one vector each."""
    import torch.distributed as dist
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    out = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(out, flat)
    return out


def _nodes(rank, world):
    from gvq.comm.links import Cluster
    refused = None
    try:
        MethodSync.from_config("diloco", DistributedDataParallel(_net()), {"method.workers": "node"},
                               cluster=Cluster(1))
    except ValueError as e:
        refused = str(e)
    return _node_steps(rank, True), _node_steps(rank, False), refused


def test_workers_node_in_a_ddp_loop_equals_the_training_loops(tmp_path):
    """4 gloo ranks as 2 nodes x 2 ranks: MethodSync's parameters equal the loop's within 1e-6 at every step
    (the same rings: bitwise in practice); a node's ranks identical after every step, the nodes apart but for
    the outer steps (iterations 2 and 5), where all four agree; DDP's own all-reduce never runs; an inner step
    sends the gradient's ring inside the node only (n values x 4 bytes at R = 2, nothing across), an outer
    step inter-node bytes too, as the loop's.  A flat cluster is refused in one line."""
    ranks, n = run_ranks(_nodes, 4, tmp_path), sum(p.numel() for p in _net().parameters())
    for it in (2, 5):                     # Δ across nodes: n values x 4 bytes from each node, split over its ranks
        inter = [hook[it][2] for (hook, _), _, _ in ranks]
        assert inter[0] + inter[1] == inter[2] + inter[3] == 4 * n and min(inter) > 0, inter
    for rank, ((hook, calls), (loop, _), refused) in enumerate(ranks):
        assert calls == 0
        assert refused is not None and "needs nodes of several ranks" in refused and "\n" not in refused
        for it, ((ph, sent, inter), (pl, sent_l, inter_l)) in enumerate(zip(hook, loop)):
            assert max(float((a - b).abs().max()) for a, b in zip(ph, pl)) < 1e-6, (rank, it)
            assert torch.equal(ph[0], ph[1]) and torch.equal(ph[2], ph[3]), (rank, it)
            outer = it in (2, 5)
            assert torch.equal(ph[0], ph[2]) == outer, (rank, it)
            assert (sent, inter) == (sent_l, inter_l), (rank, it)
            assert outer or (inter == 0 and sent == 4 * n), (rank, it)


def _demo(rank, world):
    ddp = DistributedDataParallel(_net())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    sync = MethodSync.from_config("demo", ddp)
    sent = [_step(ddp, opt, sync, rank, it)["bytes_sent"] for it in range(3)]
    sync.close()
    return sent, torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])


def test_demo_in_a_ddp_loop_sends_its_payloads_every_step(tmp_path):
    """DeMo keeps the gradients local and all-gathers its own payloads in before_step: through MethodSync it
    runs after backward as in the loop, so every step sends and the replicas stay identical."""
    (sent, a), (_, b) = run_ranks(_demo, 2, tmp_path)
    assert all(s > 0 for s in sent) and torch.equal(a, b)
