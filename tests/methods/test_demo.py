"""method=demo (gvq/methods/demo.py): the DCT round trip; the momentum as error feedback (what was sent plus
what is left is the momentum before extraction); on 2 gloo ranks the all-gathered mean equals the mean of
every rank's sparse sends decoded here by scipy's DCT; replicas bitwise identical after every step on
different data; bytes at the widths the all-gather carried; a resume through state_dict bitwise; the
inner optimizer, the aggregator and a misspelt key refused in one line; world_size 1 runs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.fft
import torch
import torch.distributed as dist

from gvq.aggregators.base import RunContext
from gvq.aggregators.rar import RingAllReduce
from gvq.methods.demo import DeMo, decode, dct_matrix, encode
from gvq.run.validate import ConfigError, validate
from tests.helpers.cli import cli_in_process
from tests.helpers.dist import run_ranks
from tests.helpers.launch import launch_job
from tests.methods.test_diloco import SMALL, full_and_resumed

PLAIN_SGD = ["optim=sgd", "optim.momentum=0", "optim.clip_norm=null", "optim.lr=1e-3"]


def test_the_dct_is_scipys_orthonormal_dct_ii_and_k_equal_chunk_round_trips():
    """Coefficients equal scipy's ``dct(norm="ortho")`` of each chunk; with k = chunk every coefficient is
    sent and decode(encode(m)) is m within float32 rounding."""
    m = torch.randn(13, 16, generator=torch.Generator().manual_seed(0))
    basis = dct_matrix(16)
    ref = scipy.fft.dct(m.double().numpy(), type=2, norm="ortho", axis=-1)
    np.testing.assert_allclose((m @ basis.T).numpy(), ref, rtol=0, atol=1e-5)
    idx, val = encode(m, basis, 16)
    assert torch.allclose(decode(idx, val, basis), m, rtol=0, atol=1e-5)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))   # 66 values


def _backward(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()


def test_what_was_sent_plus_what_remains_is_the_momentum_before_extraction():
    """One rank, k = 2 of 8: after a step the momentum holds beta·m + g minus the inverse DCT of its top-2
    coefficients per chunk, the same top-2 coefficients are now 0 in it, and the rest untouched."""
    model = _model()
    method = DeMo(k=2, chunk=8, beta=0.9)
    method.setup(list(model.parameters()), RingAllReduce(topology="ring"))
    for it in range(3):
        _backward(model, it)
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        before = method.momentum.clone() * 0.9
        before.view(-1)[: g.numel()] += g
        method.before_step(it)
        idx, val = encode(before, method.basis, 2)
        sent = decode(idx, val, method.basis)
        assert sent.abs().sum() > 0 and not torch.allclose(method.momentum, before)
        assert torch.allclose(method.momentum + sent, before, rtol=0, atol=1e-6)
        left = method.momentum @ method.basis.T
        assert torch.allclose(left.gather(-1, idx), torch.zeros_like(val), atol=1e-6)
        assert torch.allclose(left.scatter(-1, idx, 0.0), (before @ method.basis.T).scatter(-1, idx, 0.0), atol=1e-6)


def _two_ranks(rank, world):
    """Each rank its own data; its own sends computed beside the method's, and what the all-gather carried."""
    from gvq.run.train import replicas_identical
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.0)
    agg = RingAllReduce(topology="ring")
    agg.setup(list(model.parameters()), RunContext(rank, world))
    method = DeMo(k=2, chunk=8, beta=0.9)
    method.setup(list(model.parameters()), agg)
    wide = DeMo(k=3, chunk=300)                            # one chunk past 256: int32 indices
    wide.setup(list(model.parameters()), agg)
    carried, real = [], dist.all_gather

    def spy(out, t, *a, **kw):
        carried.append(t.numel() * t.element_size())
        return real(out, t, *a, **kw)

    rows = []
    dist.all_gather = spy
    try:
        for it in range(4):
            _backward(model, 1000 * rank + it)
            own = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()
            before = method.momentum.clone() * 0.9
            before.view(-1)[: own.numel()] += own
            sends = encode(before, method.basis, 2)
            stats = method.before_step(it)
            sign = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()
            opt.step()
            rows.append({"own": own, "sends": sends, "sign": sign, "stats": stats, "same": replicas_identical(model)})
        carried_narrow = list(carried)
        wide_stats = wide.before_step(4)
    finally:
        dist.all_gather = real
    agg.close()
    return rows, carried_narrow, wide_stats, carried[len(carried_narrow):]


def _mean_of_sends_here(sends, chunks: int, chunk: int) -> np.ndarray:
    """Per coefficient, the mean over the ranks that sent it, and scipy's inverse DCT: written out."""
    total, count = np.zeros((chunks, chunk)), np.zeros((chunks, chunk))
    for idx, val in sends:
        for c in range(chunks):
            for i, v in zip(idx[c].tolist(), val[c].tolist()):
                total[c, i] += v
                count[c, i] += 1
    return scipy.fft.idct(total / np.maximum(count, 1), type=2, norm="ortho", axis=-1).reshape(-1)


def test_two_ranks_step_by_the_sign_of_the_mean_of_their_sends_with_bitwise_replicas_and_exact_bytes(tmp_path):
    """2 gloo ranks, different data, k = 2 of 8, 4 steps: each rank's gradient differs, yet every rank writes
    the sign of the mean (over the ranks that sent each coefficient) of both ranks' sends decoded here, and
    the replicas are bitwise identical after every step.  bytes_sent = bytes_received = (N − 1) × the
    payload, C·k·(1 + 4) bytes with uint8 indices (int32 past chunk 256: C·k·(4 + 4)), which is what the
    all-gather carried."""
    ranks = run_ranks(_two_ranks, 2, tmp_path)
    (rows0, carried0, wide0, wide_carried0), (rows1, _, _, _) = ranks
    chunks = -(-66 // 8)
    for a, b in zip(rows0, rows1):
        assert not torch.equal(a["own"], b["own"]) and a["same"] and b["same"]
        assert torch.equal(a["sign"], b["sign"])
        ref = _mean_of_sends_here([a["sends"], b["sends"]], chunks, 8)[:66]
        clear = np.abs(ref) > 1e-6                              # the sign of ~0 may round either way
        assert clear.mean() > 0.9
        np.testing.assert_array_equal(a["sign"].numpy()[clear], np.sign(ref[clear]))
        payload = chunks * 2 * (1 + 4)
        assert a["stats"]["bytes_sent"] == a["stats"]["bytes_received"] == (2 - 1) * payload
    assert carried0 == [chunks * 2 * (1 + 4)] * 4
    assert wide0["bytes_sent"] == wide0["bytes_received"] == 1 * 3 * (4 + 4) == wide_carried0[0]


def _resumed(rank, world):
    """6 steps straight; 3 steps, the method's state_dict (and the model's) into fresh objects, 3 more; and the
    same without the method's state: the momentum is what makes the first two agree."""
    def steps(model, method, opt, its):
        for it in its:
            _backward(model, 1000 * rank + it)
            method.before_step(it)
            opt.step()

    def fresh(model=None):
        model = model or _model()
        agg = RingAllReduce(topology="ring")
        agg.setup(list(model.parameters()), RunContext(rank, world))
        method = DeMo(k=2, chunk=8)
        method.setup(list(model.parameters()), agg)
        return model, method, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.0), agg

    out = []
    for keep_state in (True, False):
        model, method, opt, agg = fresh()
        steps(model, method, opt, range(3))
        state, weights = method.state_dict(), {k: v.clone() for k, v in model.state_dict().items()}
        steps(model, method, opt, range(3, 6))
        agg.close()
        model2 = _model(seed=1)
        model2.load_state_dict(weights)
        model2, method2, opt2, agg2 = fresh(model2)
        if keep_state:
            method2.load_state_dict(state)
        steps(model2, method2, opt2, range(3, 6))
        agg2.close()
        out.append(all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters())))
    return out


def test_a_resume_through_state_dict_is_bitwise(tmp_path):
    assert run_ranks(_resumed, 2, tmp_path)[0] == [True, False]


def test_world_size_1_trains_and_a_two_rank_run_logs_its_bytes(tmp_path):
    """The one-worker control through the launcher (nothing sent), then 2 ranks (bytes every step)."""
    for world in (1, 2):
        run = tmp_path / f"w{world}"
        code, summary = launch_job(run, *SMALL, *PLAIN_SGD, f"world_size={world}", "method=demo", "iterations=4",
                                   "eval_every=4")
        assert code == 0 and summary["status"] == "completed" and summary["replicas_identical"], summary
        df = pd.read_csv(run / "metrics.csv")
        assert set(df.phase) == {"demo"} and (df.bytes_received == df.bytes_sent).all()
        assert ((df.bytes_sent > 0) == (world > 1)).all()


@pytest.mark.parametrize("override,line", [
    ("method.k=65", "method.k=65: must be <= method.chunk=64 (coefficients per chunk)"),
    ("method.chunk=0", "method.chunk=0: must be an integer >= 1"),
    ("method.beta=1", "method.beta=1.0: must be in [0, 1)"),
])
def test_an_out_of_range_knob_is_refused_in_one_line(compose_cfg, override, line):
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg("method=demo", *PLAIN_SGD, override))
    assert str(e.value) == line


@pytest.mark.parametrize("optim", [["optim=adamw"], ["optim=sgd"], [*PLAIN_SGD, "optim.nesterov=true"],
                                   [*PLAIN_SGD, "optim.clip_norm=1"]])
def test_an_inner_optimizer_other_than_plain_sgd_is_refused(compose_cfg, optim):
    """AdamW, SGD with momentum, Nesterov, clipping: each would reshape DeMo's sign step (plain SGD passes)."""
    validate(compose_cfg("method=demo", *PLAIN_SGD))
    with pytest.raises(ConfigError, match=r"^method=demo steps by a sign it decodes itself: needs optim=sgd"):
        validate(compose_cfg("method=demo", *optim))


def test_a_misspelt_key_is_one_line_naming_it():
    r = cli_in_process("method=demo", "method.chnk=32", "logger=csv")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("gvq: config error: method.chnk: unknown key; did you mean method.chunk?"), lines


def test_an_aggregator_inside_backward_is_refused_before_any_rank_starts(tmp_path):
    r = cli_in_process("method=demo", *PLAIN_SGD, "aggregator.overlap=true", "logger=csv",
                       f"hydra.run.dir={tmp_path}/run")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert lines[-1].startswith("gvq: config error: method=demo all-gathers its own payloads"), lines


def test_a_resume_from_a_checkpoint_equals_the_uninterrupted_run_bitwise(tmp_path):
    """Through the loop's checkpoints: 2 ranks checkpointed after iteration 4, resumed there, write the
    uninterrupted run's rows bitwise (times aside); each rank's momentum came back from its own file."""
    times = ["compute_s", "aggregate_s", "compress_s", "decompress_s", "wire_s", "stage_s", "wall_s", "real_wall_s"]
    a, b = full_and_resumed(tmp_path, [*SMALL, *PLAIN_SGD, "method=demo", "iterations=8", "eval_every=4"], 5, times)
    assert list(b.iteration) == list(range(8))
    pd.testing.assert_frame_equal(a, b)
