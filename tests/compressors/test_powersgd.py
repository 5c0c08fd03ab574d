"""PowerSGD's two passes, batched per shape class (gvq/compressors/powersgd.py, _lowrank.py), against the
per-parameter formulas, in one process (a sum of one payload); and a DDP bucket's plan sharing the whole
plan's state whatever order its blocks come in."""
from __future__ import annotations

import pytest
import torch

from gvq.compressors.powersgd import PowerSGD, orthogonalize

# two classes of equal shape (repeated convs), a raw bias between them, an fc and a raw small matrix
SHAPES = [(6, 3, 3, 3), (6,), (6, 3, 3, 3), (8, 6, 3, 3), (8,), (6, 3, 3, 3), (10, 32), (3, 3), (8, 6, 3, 3)]


def _x(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _passes(lr: PowerSGD, x: torch.Tensor, segs: list[slice]) -> torch.Tensor:
    """Both passes over ``segs`` (a sum of one), as the ring runs them: all of P, then all of Q."""
    lr.begin()
    for s in segs:
        lr.p_stage.decompress(lr.p_stage.compress(x[s], s), s)
    out = torch.empty_like(x)
    for s in segs:
        out[s] = lr.q_stage.decompress(lr.q_stage.compress(x[s], s), s)
    return out


def _reference(lr: PowerSGD, x: torch.Tensor, q0: dict):
    """Per block: P^ = orth(M Q), out = P^ (M^T P^)^T, next Q = orth(M^T P^); raw blocks pass through."""
    out, q_next = x.clone(), {}
    for i, b in enumerate(lr.blocks):
        if b.rank:
            m = x[b.start: b.stop].view(b.rows, b.cols)
            phat = orthogonalize(m @ q0[i])
            qsum = m.t() @ phat
            out[b.start: b.stop] = (phat @ qsum.t()).reshape(-1)
            q_next[i] = orthogonalize(qsum)
    return out, q_next


@pytest.mark.parametrize("cut", [None, 2, 5])
def test_batched_passes_equal_the_per_parameter_formulas(cut):
    lr = PowerSGD(SHAPES, rank=2, dtype=torch.float64)
    x = _x(lr.numel)
    cuts = lr.cuts()
    segs = [slice(0, lr.numel)] if cut is None else [slice(0, cuts[cut]), slice(cuts[cut], lr.numel)]
    q0 = {i: q.clone() for i, q in lr.q.items()}
    ref, q_next = _reference(lr, x, q0)
    assert torch.allclose(_passes(lr, x, segs), ref, atol=1e-10)
    assert len(lr.q) == 6 and all(torch.allclose(lr.q[i], q_next[i], atol=1e-10) for i in q_next)


def test_a_bucket_in_any_order_shares_the_whole_plans_state():
    """A DDP bucket lays its blocks out in its own order (reversed here, with a gap): its passes give each
    block what the whole plan gives it, from the whole plan's Q, and leave the next Q there.  Block 2 is
    left out: its class's blocks 0 and 5 are not neighbours in the store (two GEMMs for one class)."""
    whole = PowerSGD(SHAPES, rank=2, dtype=torch.float64)
    ids = [8, 6, 5, 3, 1, 0]
    sub = whole.subset(ids)
    x_whole = _x(whole.numel, 1)
    x_sub = torch.cat([x_whole[whole.blocks[i].start: whole.blocks[i].stop] for i in ids])
    q0 = {i: q.clone() for i, q in whole.q.items()}
    ref, q_next = _reference(whole, x_whole, q0)
    cuts = sub.cuts()
    assert len(sub.layout(slice(0, sub.numel), torch.device("cpu")).groups) == 4   # 3 classes, one split
    got = _passes(sub, x_sub, [slice(0, cuts[3]), slice(cuts[3], sub.numel)])
    for j, i in enumerate(ids):
        b = sub.blocks[j]
        assert torch.allclose(got[b.start: b.stop], ref[whole.blocks[i].start: whole.blocks[i].stop], atol=1e-10)
    for i in q0:          # blocks in the bucket moved on; block 2 (not in it) kept its Q
        moved = q_next[i] if i in ids else q0[i]
        assert torch.allclose(whole.q[i], moved, atol=1e-10), i


def test_state_dict_round_trips_and_refuses_another_model():
    a, b = PowerSGD(SHAPES, rank=2, seed=1), PowerSGD(SHAPES, rank=2, seed=2)
    assert not torch.equal(a.q[0], b.q[0])
    b.load_state_dict(a.state_dict())
    assert all(torch.equal(a.q[i], b.q[i]) for i in a.q)
    with pytest.raises(ValueError, match="differ from this model"):
        PowerSGD(SHAPES[:3], rank=2).load_state_dict(a.state_dict())
