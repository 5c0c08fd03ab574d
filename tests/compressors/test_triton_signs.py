"""The Triton paths of EF-SignSGD, 1-bit SGD, Signum's vote and random-k (gvq/compressors/_triton_grace.py,
_triton_signs.py, _triton_randomk.py), proven on the CPU by Triton's interpreter (or compiled on a GPU).
Against the torch reference in each codec's file: Signum's votes and random-k's payloads (positions, values,
scaled or not) bitwise; EF-SignSGD's and 1-bit SGD's sign bits bitwise and their side floats within 2e-6
relative (a group's sum is added in another order: blocks then a tree, against index_add's one by one;
on CUDA index_add has no fixed order either), each path decoding the other's payload bitwise as its own.
At most 3 launches a compress and 2 a decompress, the same at two depths, with no torch compute op and no
host read between them.  Inputs of a few groups of at most 5k values (the interpreter is slow)."""
from __future__ import annotations

import pytest
import torch

from gvq.bench.opcount import count_ops
from gvq.compressors import _kernels as kernels
from gvq.compressors.efsignsgd import EFSignSGD
from gvq.compressors.onebit import OneBit
from gvq.compressors.randomk import RandomK
from gvq.compressors.signum import SignVote
from tests.compressors.test_triton_grace import NO_KERNEL_OPS
from tests.helpers.triton import MARKS, kernel_device

DEVICE = kernel_device()
pytestmark = MARKS

SHAPES = [(40, 75), (1500,), (7,), (493,)]            # 5000 values: a group over SIGN_BLOCK, a tiny one
N = 5000
GROUPED = {
    "efsignsgd_tensor": lambda **kw: EFSignSGD(**kw).grouped(SHAPES),
    "efsignsgd_bucket": lambda **kw: EFSignSGD("bucket", 1200, **kw),
    "onebit_tensor": lambda **kw: OneBit(**kw).grouped(SHAPES),
    "onebit_column": lambda **kw: OneBit("column", **kw).grouped(SHAPES),
}
RANDOMK = {       # fewer values: each bucket's 64-round search is slow interpreted
    "unscaled": lambda **kw: RandomK(0.03, 1000, **kw),
    "scaled": lambda **kw: RandomK(0.02, 1000, True, **kw),
    "one_scope": lambda **kw: RandomK(0.01, None, **kw),
}
RANDOMK_N = 2300                                      # two full buckets and a ragged one


def gradient(n=N, seed=0) -> torch.Tensor:
    """Normal values with zeros of both signs, exact ties and a one-signed stretch (an empty side)."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    x[::13], x[5::17], x[3::19] = 0.0, -0.0, 0.75
    x[3000:3007] = x[3000:3007].abs()                 # the 7-value tensor: no value below 0
    return x[:n]


def side_bits(q, payload, seg):
    n_groups = q.triton_table(seg, "cpu")[0].shape[1]
    head = 4 * q.n_side * n_groups
    return payload[:head].clone().view(torch.float32), payload[head:]


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(GROUPED))
def test_grouped_signs_equal_the_torch_path(name):
    mine, ref, seg = GROUPED[name](kernels="triton"), GROUPED[name](kernels="torch"), slice(0, N)
    x = gradient().to(DEVICE)
    p, r = mine.compress(x, seg).cpu(), ref.compress(x.cpu(), seg)
    assert p.dtype == r.dtype and p.numel() == r.numel()
    (side, bits), (rside, rbits) = side_bits(mine, p, seg), side_bits(ref, r, seg)
    assert torch.equal(bits, rbits)
    torch.testing.assert_close(side, rside, rtol=2e-6, atol=1e-30)
    for payload in (p, r):                             # either path decodes either payload, bitwise alike
        dec = mine.decompress(payload.to(DEVICE), seg).cpu()
        assert torch.equal(dec.view(torch.int32), ref.decompress(payload, seg).view(torch.int32))


def test_grouped_signs_of_a_segment_that_cuts_groups_and_sits_unaligned():
    """A ring segment cuts its first and last group; a payload at an odd offset of a larger buffer."""
    make, seg = GROUPED["onebit_tensor"], slice(2950, 4321)
    mine, ref = make(kernels="triton"), make(kernels="torch")
    x = gradient()[seg].to(DEVICE)
    p = mine.compress(x, seg)
    buffer = torch.cat([torch.zeros(1, dtype=torch.uint8, device=DEVICE), p])
    assert torch.equal(mine.decompress(buffer[1:], seg).cpu(), ref.decompress(p.cpu(), seg))
    assert torch.equal(side_bits(mine, p.cpu(), seg)[1], side_bits(ref, ref.compress(x.cpu(), seg), seg)[1])


@pytest.mark.cuda
@pytest.mark.parametrize("vote", ["int8", "bits"])
def test_signum_votes_equal_the_torch_paths_bitwise(vote):
    mine, ref, seg = SignVote(vote, kernels="triton"), SignVote(vote, kernels="torch"), slice(0, 1001)
    x = gradient(1001).to(DEVICE)
    x[7] = float("nan")                                # votes -1, as x >= 0 says
    p, r = mine.compress(x, seg).cpu(), ref.compress(x.cpu(), seg)
    assert p.dtype == r.dtype and torch.equal(p, r)
    payload = r + r + r if vote == "int8" else r       # an int8 sum of votes decodes as it is
    assert torch.equal(mine.decompress(payload.to(DEVICE), seg).cpu(), ref.decompress(payload, seg))


def drawn(name, **kw):
    q = RANDOMK[name](**kw)
    q.begin_vector(3, 11, 2)
    return q


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(RANDOMK))
def test_randomk_positions_payload_and_decode_equal_the_torch_paths_bitwise(name):
    mine, ref, seg = drawn(name, kernels="triton"), drawn(name, kernels="torch"), slice(0, RANDOMK_N)
    x = gradient(RANDOMK_N).to(DEVICE)
    p, r = mine.compress(x, seg).cpu(), ref.compress(x.cpu(), seg)
    assert torch.equal(mine.positions(seg, DEVICE).cpu(), ref.positions(seg, "cpu"))
    assert torch.equal(p.view(torch.int32), r.view(torch.int32))
    dec = mine.decompress(r.to(DEVICE), seg).cpu()
    assert torch.equal(dec.view(torch.int32), ref.decompress(r, seg).view(torch.int32))


def test_randomk_segment_draws_the_whole_vectors_positions_and_nan_raises_at_the_check():
    """A ring segment of whole buckets draws what the whole vector draws there (counters are positions
    in the vector), and a NaN input is seen at the iteration's check, not inside the call."""
    mine, seg = drawn("unscaled", kernels="triton"), slice(1000, 2300)
    whole = mine.positions(slice(0, RANDOMK_N), DEVICE)
    assert torch.equal(mine.positions(seg, DEVICE) + 1000, whole[whole >= 1000])
    x = gradient(RANDOMK_N)[seg].to(DEVICE)
    x[5] = float("nan")
    mine.compress(x, seg)
    with pytest.raises(ValueError, match="NaN or Inf"):
        mine.check_health()


CALLS = {"efsignsgd": (GROUPED["efsignsgd_tensor"], 2, 1), "onebit": (GROUPED["onebit_column"], 2, 1),
         "signum_int8": (lambda **kw: SignVote(**kw), 1, 1), "signum_bits": (lambda **kw: SignVote("bits", **kw), 1, 1),
         "randomk": (RANDOMK["scaled"], 2, 2)}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_call_is_a_few_launches_with_no_device_op_or_host_read_between(name):
    """Counted, not run: a fresh random-k key draws its positions in the compress (2 launches); the
    decompress after it reuses them."""
    make, most_c, most_d = CALLS[name]
    q, seg, x = make(kernels="triton"), slice(0, N), gradient().to(DEVICE)
    payload = q.compress(x, seg)                       # warm: the tables, made once per segment
    q.begin_vector(0, 1, 0)
    with count_ops() as ops, kernels.count_launches(run=False) as c:
        q.compress(x, seg)
    with count_ops() as dops, kernels.count_launches(run=False) as d:
        q.decompress(payload, seg)
    assert c.launches == most_c <= 3 and d.launches == most_d <= 2, (c.by_name, d.by_name)
    assert ops.syncs == dops.syncs == 0
    assert set(ops.by_name) | set(dops.by_name) <= NO_KERNEL_OPS, (ops.by_name, dops.by_name)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_launches_are_flat_in_depth(name):
    """A program per group or bucket: ResNet-20's and ResNet-110's gradients take the same launches
    (counted, not run)."""
    from gvq.bench.common import model_shapes
    counts = []
    for depth in (20, 110):
        shapes = model_shapes(f"resnet{depth}", 10)
        n = sum(s.numel() for s in shapes)
        q, seg = CALLS[name][0](kernels="triton").grouped(shapes), slice(0, n)
        with kernels.count_launches(run=False) as c:
            payload = q.compress(torch.zeros(n, device=DEVICE), seg)
        with kernels.count_launches(run=False) as d:
            q.decompress(payload, seg)
        counts.append((c.by_name, d.by_name))
    assert counts[0] == counts[1] and counts[0][0] and counts[0][1]


def test_host_tensors_keep_the_torch_path_unless_triton_is_asked_for():
    x, seg = gradient(), slice(0, N)
    for make, _, _ in CALLS.values():
        q = make()
        with kernels.count_launches() as c:
            q.decompress(q.compress(x, seg), seg)
        assert c.launches == 0
