"""PowerSGD's two passes, batched per shape class (gvq/compressors/powersgd.py, _lowrank.py), against the
per-parameter formulas, in one process (a sum of one payload); and a DDP bucket's plan sharing the whole
plan's state whatever order its blocks come in."""
from __future__ import annotations

import pytest
import torch

from gvq.compressors.powersgd import PowerSGD, orthogonalize
from gvq.schema.options import PowerSGDSchema, knobs
from tests.helpers.rings import powersgd_passes

#: the aggregator's knobs its compressor takes, at rank 2
KNOBS = {k: v for k, v in knobs(PowerSGDSchema, rank=2).items() if k in ("rank", "min_compression_rate", "warm_start")}

# two classes of equal shape (repeated convs), a raw bias between them, an fc and a raw small matrix
SHAPES = [(6, 3, 3, 3), (6,), (6, 3, 3, 3), (8, 6, 3, 3), (8,), (6, 3, 3, 3), (10, 32), (3, 3), (8, 6, 3, 3)]


def _x(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


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
    lr = PowerSGD(SHAPES, **KNOBS, dtype=torch.float64)
    x = _x(lr.numel)
    cuts = lr.cuts()
    segs = [slice(0, lr.numel)] if cut is None else [slice(0, cuts[cut]), slice(cuts[cut], lr.numel)]
    q0 = {i: q.clone() for i, q in lr.q.items()}
    ref, q_next = _reference(lr, x, q0)
    assert torch.allclose(powersgd_passes(lr, x, segs), ref, atol=1e-10)
    assert len(lr.q) == 6 and all(torch.allclose(lr.q[i], q_next[i], atol=1e-10) for i in q_next)


def test_a_bucket_in_any_order_shares_the_whole_plans_state():
    """A DDP bucket lays its blocks out in its own order (reversed here, with a gap): its passes give each
    block what the whole plan gives it, from the whole plan's Q, and leave the next Q there.  Block 2 is
    left out: its class's blocks 0 and 5 are not neighbours in the store (two GEMMs for one class)."""
    whole = PowerSGD(SHAPES, **KNOBS, dtype=torch.float64)
    ids = [8, 6, 5, 3, 1, 0]
    sub = whole.subset(ids)
    x_whole = _x(whole.numel, 1)
    x_sub = torch.cat([x_whole[whole.blocks[i].start: whole.blocks[i].stop] for i in ids])
    q0 = {i: q.clone() for i, q in whole.q.items()}
    ref, q_next = _reference(whole, x_whole, q0)
    cuts = sub.cuts()
    assert len(sub.layout(slice(0, sub.numel), torch.device("cpu")).groups) == 4   # 3 classes, one split
    got = powersgd_passes(sub, x_sub, [slice(0, cuts[3]), slice(cuts[3], sub.numel)])
    for j, i in enumerate(ids):
        b = sub.blocks[j]
        assert torch.allclose(got[b.start: b.stop], ref[whole.blocks[i].start: whole.blocks[i].stop], atol=1e-10)
    for i in q0:          # blocks in the bucket moved on; block 2 (not in it) kept its Q
        moved = q_next[i] if i in ids else q0[i]
        assert torch.allclose(whole.q[i], moved, atol=1e-10), i


def test_state_dict_round_trips_and_refuses_another_model():
    a, b = PowerSGD(SHAPES, **KNOBS, seed=1), PowerSGD(SHAPES, **KNOBS, seed=2)
    assert not torch.equal(a.q[0], b.q[0])
    b.load_state_dict(a.state_dict())
    assert all(torch.equal(a.q[i], b.q[i]) for i in a.q)
    with pytest.raises(ValueError, match="differ from this model"):
        PowerSGD(SHAPES[:3], **KNOBS).load_state_dict(a.state_dict())


# ---- the orthogonalization: Cholesky QR made of batched products, against Householder QR ----

def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rotations(k: int, n: int, gen) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(k, n, n, generator=gen, dtype=torch.float64)).Q


def _ill_block(k: int, n: int, m: int, r: int, cond: float, gen):
    """M (k, n, m) with singular values from 1 down to 1/cond, and P = M Q for a Q in its top right
    singular space, so that P's own condition number is ``cond``: both in float32."""
    u, v = _rotations(k, n, gen)[..., :r], _rotations(k, m, gen)[..., :r]
    s = torch.logspace(0, -torch.log10(torch.tensor(cond)).item(), r, dtype=torch.float64)
    mat = (u * s) @ v.mT
    q = v @ _rotations(k, r, gen)
    return mat.float(), (mat @ q).float()


def _projection(q: torch.Tensor, mat: torch.Tensor) -> torch.Tensor:
    return q @ (q.mT @ mat)


def _assert_projections_agree(p: torch.Tensor, mat: torch.Tensor, rtol: float = 1e-3):
    """P^ P^T M by Cholesky QR equals it by Householder QR (column signs cancel) to ``rtol`` of ||M||."""
    got, ref = _projection(orthogonalize(p), mat), _projection(torch.linalg.qr(p).Q, mat)
    assert torch.isfinite(got).all()
    err = torch.linalg.matrix_norm(got - ref) / torch.linalg.matrix_norm(mat).clamp_min(1e-30)
    assert (err <= rtol).all(), err


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_cholesky_qr_gives_orthonormal_columns(dtype, atol):
    a = torch.randn(6, 50, 4, generator=_gen(), dtype=dtype)
    q = orthogonalize(a)
    assert torch.allclose(q.mT @ q, torch.eye(4, dtype=dtype).expand(6, 4, 4), atol=atol)
    assert torch.allclose(_projection(q, a), a, atol=100 * atol)          # it spans a's columns
    assert torch.allclose(orthogonalize(a[2]), q[2], atol=atol)           # one matrix as in a batch


@pytest.mark.parametrize("cond", [10.0, 1e6])
@pytest.mark.parametrize("n, m, r", [(16, 144, 4), (64, 27, 2), (10, 64, 1)])
def test_projection_equals_householder_qrs_on_well_and_ill_conditioned_blocks(cond, n, m, r):
    mat, p = _ill_block(5, n, m, r, cond, _gen(1))
    _assert_projections_agree(p, mat)


def test_projection_equals_householder_qrs_on_rank_deficient_blocks_without_nan():
    """M of rank 1 < r, with a zero column, all zero: short columns where QR invents directions, never NaN."""
    gen = _gen(2)
    rank1 = torch.randn(3, 32, 1, generator=gen) @ torch.randn(3, 1, 40, generator=gen)
    zero_col = torch.randn(3, 32, 40, generator=gen)
    zero_col[:, :, 5] = 0
    mats = torch.cat([rank1, zero_col, torch.zeros(1, 32, 40)])
    p = mats @ torch.randn(7, 40, 4, generator=gen)
    _assert_projections_agree(p, mats)
    p[:, :, 2] = 0              # a zero column of P: QR's stand-in direction is arbitrary, so only no NaN
    q = orthogonalize(p)
    assert torch.isfinite(q).all() and torch.isfinite(orthogonalize(torch.zeros(2, 8, 3))).all()


def test_a_zero_gradient_keeps_its_warm_start_q():
    """A block whose sum Q is rank-deficient keeps the Q it had (Cholesky QR would leave it short for good)."""
    lr = PowerSGD(SHAPES, **KNOBS)
    q0 = {i: q.clone() for i, q in lr.q.items()}
    x = _x(lr.numel).float()
    x[lr.blocks[0].start: lr.blocks[0].stop] = 0
    powersgd_passes(lr, x, [slice(0, lr.numel)])
    assert torch.equal(lr.q[0], q0[0]) and not torch.allclose(lr.q[3], q0[3])
    assert all(torch.isfinite(q).all() for q in lr.q.values())


def test_passes_orthogonalize_with_batched_products_not_householder_qr():
    """After its first call (layouts built), no pass runs a QR: products, Cholesky and triangular solves,
    and nothing read back to the host."""
    from gvq.bench.opcount import count_ops
    lr = PowerSGD(SHAPES, **KNOBS)
    x, seg = _x(lr.numel).float(), slice(0, lr.numel)
    powersgd_passes(lr, x, [seg])
    with count_ops() as c:
        powersgd_passes(lr, x, [seg])
    names = " ".join(c.by_name)
    assert "qr" not in names and "geqrf" not in names and c.syncs == 0, dict(c.by_name)
    assert c.by_name["aten.linalg_cholesky_ex.L"] == 6 and c.by_name["aten.linalg_solve_triangular.out"] == 6
