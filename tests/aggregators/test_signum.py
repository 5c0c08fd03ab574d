"""Signum with majority vote (gvq/aggregators/signum.py) on 2-4 gloo ranks: the int8 vote summed on the ring
equals the allgather of bits, both equal sign(sum_i sign(m_i)) computed by hand, ties give 0, the momentum
is the paper's and a resume from its state_dict continues as if uninterrupted; bytes are the wire's."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from gvq.aggregators.base import RunContext
from gvq.aggregators.signum import SignumAggregator
from gvq.compressors.signum import SignVote
from tests.helpers.dist import run_ranks

SLOW = pytest.mark.slow
SHAPES = [(4, 3, 2, 2), (4,), (6, 8)]          # 48 + 4 + 48 = 100 values
NUMEL, ITERS, BETA = 100, 5, 0.9
NO_EF = {"ef_decay": 1.0, "ef_units": "gradient"}      # Signum has no error feedback: its knobs at their defaults


def _grad(rank, it):
    g = torch.randn(NUMEL, generator=torch.Generator().manual_seed(100 * it + rank))
    g[:10] = 1.0 if rank % 2 == 0 else -1.0    # ranks split evenly on these: a tie at even N
    return g


def _run(agg, rank, world, iters, start=0):
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    agg.setup(params, RunContext(rank, world))
    out = []
    for it in range(start, start + iters):
        flat = _grad(rank, it)
        for p, v in zip(params, torch.split(flat, [math.prod(s) for s in SHAPES])):
            p.grad.copy_(v.view_as(p))
        stats = agg.aggregate(it)
        out.append((torch.cat([p.grad.reshape(-1) for p in params]).clone(), agg.momentum.clone(),
                    stats["bytes_sent"]))
    return out


def _make(vote, topology="ring"):
    return SignumAggregator(SignVote(vote), topology=topology, hop="auto", beta=BETA, **NO_EF)


def _votes(rank, world):
    int8 = _make("int8")
    bits = _make("bits", "allgather")
    res = {"int8": _run(int8, rank, world, ITERS), "bits": _run(bits, rank, world, ITERS)}
    first = _make("int8")                       # resumed after 3 iterations from a state_dict
    res["first"] = _run(first, rank, world, 3)
    resumed = _make("int8")
    state = first.state_dict()
    resumed.setup([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES], RunContext(rank, world))
    resumed.load_state_dict(state)
    res["resumed"] = _run_more(resumed, rank, world)
    for a in (int8, bits, first, resumed):
        a.close()
    return res


def _run_more(agg, rank, world):
    """``_run`` on an aggregator already set up (iterations 3.. of ``_grad``)."""
    params = agg.params
    out = []
    for it in range(3, ITERS):
        flat = _grad(rank, it)
        for p, v in zip(params, torch.split(flat, [math.prod(s) for s in SHAPES])):
            p.grad = v.view_as(p).clone()
        agg.aggregate(it)
        out.append((torch.cat([p.grad.reshape(-1) for p in params]).clone(), agg.momentum.clone()))
    return out


@pytest.fixture(scope="module", params=[2, 3, 4])
def votes(request, tmp_path_factory):
    return run_ranks(_votes, request.param, tmp_path_factory.mktemp("signum"))


@SLOW
def test_int8_vote_on_the_ring_equals_the_allgather_of_bits_on_every_rank(votes):
    for r in votes:
        for (a, _, _), (b, _, _) in zip(r["int8"], r["bits"]):
            assert torch.equal(a, b)
        assert torch.equal(r["int8"][-1][0], votes[0]["int8"][-1][0])


@SLOW
def test_the_vote_is_the_sign_of_the_summed_signs_of_the_paper_momentum(votes):
    world = len(votes)
    moms = [torch.zeros(NUMEL) for _ in range(world)]
    for it in range(ITERS):
        for rank in range(world):
            moms[rank] = moms[rank] * BETA + _grad(rank, it) * (1 - BETA)      # m <- beta m + (1 - beta) g
            assert torch.allclose(votes[rank]["int8"][it][1], moms[rank], atol=1e-6)
        tally = sum(torch.where(votes[rank]["int8"][it][1] >= 0, 1.0, -1.0) for rank in range(world))
        assert torch.equal(votes[0]["int8"][it][0], torch.sign(tally))
        ties = votes[0]["int8"][it][0][:10]
        assert torch.equal(ties, torch.zeros(10) if world % 2 == 0 else torch.ones(10))   # a tie: no step


@SLOW
def test_a_resume_from_the_state_dict_continues_the_uninterrupted_votes_bitwise(votes):
    for r in votes:
        for (a, ma, _), (b, mb) in zip(r["int8"][3:], r["resumed"]):
            assert torch.equal(a, b) and torch.equal(ma, mb)


@SLOW
def test_bytes_sent_are_the_wire_arithmetic(votes):
    world = len(votes)
    for rank, r in enumerate(votes):
        ring = sum(s.stop - s.start for s in _ring_sends(world, NUMEL)[rank])    # int8: 1 byte a value
        assert {b for _, _, b in r["int8"]} == {ring}
        assert ring <= 2 * math.ceil(NUMEL / world) * (world - 1)
        assert {b for _, _, b in r["bits"]} == {(world - 1) * math.ceil(NUMEL / 8)}   # n/8, forwarded N - 1 times


def _ring_sends(world, numel):
    """Per rank, the segments its additive ring sends (N - 1 reduce-scatter, N - 1 allgather steps)."""
    from gvq.compressors.base import split_on_cuts
    segs = split_on_cuts(list(range(numel + 1)), world)
    return [[segs[(r - i) % world] for i in range(world - 1)] + [segs[(r + 1 - i) % world] for i in range(world - 1)]
            for r in range(world)]


def test_int8_vote_past_127_ranks_and_a_server_are_refused_in_one_line():
    with pytest.raises(ValueError, match="N <= 127: use aggregator.compressor.vote=bits"):
        _make("int8").bind([torch.nn.Parameter(torch.zeros(3))], RunContext(0, 128))
    for vote, topology, hop in (("int8", "ps", "auto"), ("bits", "ring", "auto"), ("int8", "ring", "reencode")):
        with pytest.raises(ValueError, match=f"aggregator.topology={topology} \\(hop={hop}\\): the majority vote"):
            SignumAggregator(SignVote(vote), topology=topology, hop=hop, beta=BETA, **NO_EF)
    with pytest.raises(ValueError, match="beta"):
        SignumAggregator(SignVote(), topology="ring", hop="auto", beta=1.0, **NO_EF)


@SLOW
@pytest.mark.parametrize("vote,topology", [("int8", "ring"), ("bits", "allgather")])
def test_signum_trains_the_cnn_and_logs_the_bytes_of_its_wire(tmp_path, vote, topology):
    """Through the launcher at N = 2: the int8 ring sends each value's byte once (2(N - 1)/N = 1), the
    allgather its n/8 bytes of bits once (N - 1)."""
    from gvq.models import DigitsCNN
    from tests.helpers.launch import launch_job
    code, summary = launch_job(tmp_path, "aggregator=signum", f"aggregator.compressor.vote={vote}",
                               f"aggregator.topology={topology}", "optim.lr=0.001", "optim.momentum=0",
                               "logger=csv", "logger.progress=false", "iterations=6", "eval_every=6",
                               "world_size=2", "batch_size=16")
    assert code == 0, summary
    numel = sum(p.numel() for p in DigitsCNN(num_classes=10, in_channels=1, width=16).parameters())
    df = pd.read_csv(tmp_path / "metrics.csv")
    assert set(df.bytes_sent) == {numel if vote == "int8" else math.ceil(numel / 8)}
    assert math.isfinite(summary["final_test_loss"])


def test_a_run_with_sgd_momentum_is_refused_in_one_line():
    """Signum's momentum is its own (beta): SGD's on top of the votes trains the CNN to chance, so the run's
    validation (``Aggregator.check_run``) refuses it; momentum-free SGD and AdamW (no momentum key) pass."""
    with pytest.raises(ValueError, match=r"^aggregator=signum keeps the momentum itself .*optim.momentum=0.9$"):
        SignumAggregator.check_run({"optim": {"momentum": 0.9, "nesterov": False}})
    with pytest.raises(ValueError, match="aggregator=signum"):
        SignumAggregator.check_run({"optim": {"momentum": 0.0, "nesterov": True}})
    SignumAggregator.check_run({"optim": {"momentum": 0.0, "nesterov": False}})
    SignumAggregator.check_run({"optim": {"lr": 1e-3, "weight_decay": 0.1}})
