"""Top-k's and natural compression's Triton paths (gvq/compressors/_triton_grace.py, _triton_topk.py,
_triton_natural.py), proven on the CPU by Triton's
interpreter (or compiled on a GPU): the same kept set and values as the torch reference, bitwise, per
scope (tensor, ragged bucket, global), ties to the lower index, values float32 or float16, indices int32
or packed, and either path decodes the other's payload; at most 3 launches a compress and 2 a decompress,
the same at two depths, with no torch compute op and no host read between them.  Natural compression: fed
the torch path's uniforms, the same payload bitwise; drawing its own, unbiased within E[C(x)^2] <= 9/8 x^2,
fresh every call and replayed from a checkpoint; one launch each way.  Inputs of a few scopes of
at most 4k values (the interpreter is slow)."""
from __future__ import annotations

import pytest
import torch

from gvq.bench.opcount import count_ops
from gvq.compressors import _kernels as kernels
from gvq.compressors import _triton_grace
from gvq.compressors.natural import Natural
from gvq.compressors.topk import TopK
from gvq.compressors.topk_chunk import ChunkTopK
from tests.helpers.triton import MARKS, kernel_device

DEVICE = kernel_device()
pytestmark = MARKS

SHAPES = [(40, 75), (1500,), (7,), (493,)]            # 5000 values: a scope over MAX_BLOCK, a tiny one
N = 5000
SETTINGS = {
    "tensor": lambda **kw: TopK(0.03, **kw).grouped(SHAPES),
    "tensor_fp16_packed": lambda **kw: TopK(0.05, values="float16", indices="packed", **kw).grouped(SHAPES),
    "bucket_ragged_packed": lambda **kw: TopK(0.02, scope="bucket", bucket=1200, indices="packed", **kw),
    "global": lambda **kw: TopK(0.01, scope="global", **kw),
    "ratio_1": lambda **kw: TopK(1.0, scope="bucket", bucket=1024, **kw),
}
#: every aten op a Triton-path call may dispatch: allocations and views, none of which runs on the device
NO_KERNEL_OPS = {"aten.empty.memory_format", "aten.view.dtype", "aten.detach.default", "aten.slice.Tensor",
                 "aten.view.default", "aten._reshape_alias.default", "aten.alias.default"}


def gradient(seed=0, ties=True) -> torch.Tensor:
    """Laplace values (|v| exponential, a random sign), and (``ties``) runs of equal magnitudes of both
    signs and zeros, which the threshold cuts through."""
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(N).exponential_(generator=g) * torch.randn(N, generator=g).sign()
    if ties:
        x[::7] = 2.5 * torch.where(torch.arange(0, N, 7) % 2 == 0, 1.0, -1.0)
        x[3::11] = 0.0
    return x


def kept(q, payload, seg):
    """The kept (position, value) pairs in position order: the set, whatever order a path writes."""
    pos, vals = q.unpack(payload, seg)
    order = torch.argsort(pos)
    return pos[order], vals[order]


def both(name, x, **kw):
    mine, ref, seg = SETTINGS[name](kernels="triton", **kw), SETTINGS[name](kernels="torch", **kw), slice(0, N)
    x = x.to(DEVICE)
    return mine, ref, seg, mine.compress(x, seg), ref.compress(x, seg)


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_the_kept_set_values_and_decode_equal_the_torch_paths(name):
    mine, ref, seg, p, r = both(name, gradient())
    assert p.dtype == r.dtype and p.numel() == r.numel()
    (pos, vals), (rpos, rvals) = kept(mine, p, seg), kept(ref, r, seg)
    assert torch.equal(pos, rpos) and torch.equal(vals.view(torch.uint8), rvals.view(torch.uint8))
    dec = mine.decompress(p, seg)
    assert torch.equal(dec.view(torch.int32), ref.decompress(r, seg).view(torch.int32))
    assert torch.equal(mine.decompress(r, seg), dec) and torch.equal(ref.decompress(p, seg), dec)


def test_ties_go_to_the_lower_index_and_slots_are_in_index_order():
    """All magnitudes equal: each scope keeps its first k, written in that order."""
    q, seg = TopK(0.01, scope="bucket", bucket=1000, kernels="triton"), slice(0, 3000)
    x = torch.where(torch.arange(3000) % 3 == 0, -1.5, 1.5).to(DEVICE)
    pos, vals = q.unpack(q.compress(x, seg), seg)
    assert pos.tolist() == [b + i for b in (0, 1000, 2000) for i in range(10)]
    assert torch.equal(vals.cpu(), x.cpu()[pos.cpu()])


def test_nan_inf_and_float64_inputs_as_the_torch_path():
    """NaN ranks above Inf above every number, as on the torch path; a float64 input ranks and travels as
    its float32 rounding."""
    x = gradient(seed=2).double() * (1 + 1e-12)
    x[[5, 4000]], x[77] = float("nan"), float("-inf")
    mine, ref, seg, p, r = both("tensor", x)
    (pos, vals), (rpos, rvals) = kept(mine, p, seg), kept(ref, r, seg)
    assert torch.equal(pos, rpos) and torch.equal(vals.view(torch.int32), rvals.view(torch.int32))
    assert {5, 4000, 77} <= set(pos.tolist())


@pytest.mark.parametrize("name", ["tensor_fp16_packed", "global"])
def test_a_call_is_a_few_launches_with_no_device_op_or_host_read_between(name):
    q, seg, x = SETTINGS[name](kernels="triton"), slice(0, N), gradient().to(DEVICE)
    payload = q.compress(x, seg)                           # warm: the plan and its scope table, made once
    with count_ops() as ops, kernels.count_launches(run=False) as c:
        q.compress(x, seg)
    with count_ops() as dops, kernels.count_launches(run=False) as d:
        q.decompress(payload, seg)
    assert 1 <= c.launches <= 3 and 1 <= d.launches <= 2, (c.by_name, d.by_name)
    assert ops.syncs == dops.syncs == 0
    assert set(ops.by_name) | set(dops.by_name) <= NO_KERNEL_OPS, (ops.by_name, dops.by_name)


@pytest.mark.parametrize("depth", [20, 110])
def test_launches_are_flat_in_depth(depth):
    """A program per scope: ResNet-20's and ResNet-110's tensor scopes take the same launches (counted,
    not run)."""
    from gvq.bench.common import model_shapes
    shapes = model_shapes(f"resnet{depth}", 10)
    n = sum(s.numel() for s in shapes)
    q, seg = TopK(0.01, indices="packed", kernels="triton").grouped(shapes), slice(0, n)
    with kernels.count_launches(run=False) as c:
        payload = q.compress(torch.zeros(n, device=DEVICE), seg)
    with kernels.count_launches(run=False) as d:
        q.decompress(payload, seg)
    assert c.by_name == {"topk_select": 1, "pack_indices": 1} and d.by_name == {"zero_fill": 1, "topk_scatter": 1}


def test_host_tensors_keep_the_torch_path():
    x, seg = gradient()[:4096], slice(0, 4096)
    for q in (TopK(), TopK(kernels="torch"), ChunkTopK()):
        with kernels.count_launches() as c:
            q.decompress(q.compress(x, seg), seg)
        assert c.launches == 0


def test_kernels_triton_without_triton_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(kernels, "triton_available", lambda: False)
    with pytest.raises(ValueError, match=r"^kernels=triton: Triton is not installed[^\n]*$"):
        TopK(kernels="triton")
    with pytest.raises(ValueError, match="kernels='gpu'"):
        TopK(kernels="gpu")


# ---- natural compression -------------------------------------------------------------------------------
def test_natural_payload_equals_the_torch_paths_given_its_uniforms():
    """Values of every kind (normal, subnormal, zeros of both signs, powers of two, huge, Inf, NaN) and a
    length that leaves a partial sign byte."""
    x = torch.cat([torch.randn(3001) * 3, torch.tensor([0.0, -0.0, 1e-40, -3e-39, 0.25, -8.0, 3e38, -3.4e38,
                                                          float("inf"), float("nan")])])
    n, seg = x.numel(), slice(0, x.numel())
    u16 = torch.randint(-2 ** 15, 2 ** 15, (2 * n,), dtype=torch.int16, generator=torch.Generator().manual_seed(1))
    ref = Natural(kernels="torch")
    ref.lanes.uniform16 = lambda *args, **kw: u16
    mine = Natural(kernels="triton")
    with kernels.count_launches() as c:
        p = _triton_grace.natural_compress(mine, x.to(DEVICE), u16.view(torch.int32).to(DEVICE))
    r = ref.compress(x, seg)
    assert c.launches == 1 and torch.equal(p.cpu(), r)
    with kernels.count_launches() as d:
        dec = mine.decompress(p, seg)
    assert d.launches == 1 and torch.equal(dec.cpu().view(torch.int32), ref.decompress(r, seg).view(torch.int32))


def test_natural_draws_are_unbiased_fresh_and_replayed_from_a_checkpoint(tmp_path):
    base = torch.tensor([1.0, -1.25, 3.0, 0.7, -5.5e-3, 2.0 ** -20 * 1.6, 4.0 / 3.0, 0.0])
    q, x = Natural(kernels="triton"), base.repeat(512).to(DEVICE)
    q.reseed(5)
    seg = slice(0, x.numel())
    first = q.compress(x, seg)
    torch.save(q.state_dict(), tmp_path / "s.pt")
    second = q.compress(x, seg)
    assert not torch.equal(first, second)
    fresh = Natural(kernels="triton")
    fresh.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert torch.equal(fresh.compress(x, seg), second)
    samples = torch.stack([q.decompress(q.compress(x, seg), seg).cpu().view(512, -1) for _ in range(4)]).double()
    samples = samples.reshape(-1, base.numel())
    low = torch.exp2(torch.floor(torch.log2(base.abs().double().clamp(min=1e-300))))
    r = base.abs().double() / low
    se = (low * low * ((r - 1) * (2 - r)).clamp(min=0) / samples.shape[0]).sqrt()
    assert bool(((samples.mean(0) - base.double()).abs() <= 5.5 * se + 1e-12).all())
    assert bool((samples.pow(2).mean(0) <= 9 / 8 * base.double() ** 2 * 1.05 + 1e-30).all())
    assert torch.equal(samples[:, 0], torch.ones(samples.shape[0], dtype=torch.float64))    # powers of two: exact


def test_natural_non_finite_inputs_raise_at_the_check_on_the_triton_path():
    q, x = Natural(kernels="triton"), torch.randn(4096).to(DEVICE)
    x[3000] = float("nan")
    q.compress(x, slice(0, 4096))
    with pytest.raises(ValueError, match="NaN or Inf"):
        q.check_health()


def test_natural_call_is_one_launch_with_no_device_op_or_host_read_between():
    q, seg, x = Natural(kernels="triton"), slice(0, N), gradient().to(DEVICE)
    payload = q.compress(x, seg)
    with count_ops() as ops, kernels.count_launches(run=False) as c:
        q.compress(x, seg)
    with count_ops() as dops, kernels.count_launches(run=False) as d:
        q.decompress(payload, seg)
    assert c.by_name == {"natural_encode": 1} and d.by_name == {"natural_decode": 1}
    assert ops.syncs == dops.syncs == 0
    assert set(ops.by_name) | set(dops.by_name) <= NO_KERNEL_OPS, (ops.by_name, dops.by_name)
    with kernels.count_launches() as host:
        Natural().compress(x.cpu(), seg)
    assert host.launches == 0
