"""DGC's Triton path (gvq/compressors/_dgc_triton.py, _triton_dgc.py), proven on the CPU by Triton's
interpreter (or compiled on a GPU), against the torch reference in gvq/compressors/dgc.py: the same kept
set and values bitwise (the sampled threshold, the first of the ten tries to reach 0.8 k, the largest
candidates, at most k; a scope with fewer candidates than k fills its slots with zeros at the lowest
positions), the dense 1-D parts bitwise, at two iterations (two sample offsets), at ratio 1 and without a
layout; NaN, Inf and float64 inputs as the torch path, a NaN seen at the check; either path decodes either
payload.  2 launches a compress and 2 a decompress, the same at two depths, with no torch compute op and
no host read between them.  A few tensors of at most 3k values (the interpreter is slow)."""
from __future__ import annotations

import pytest
import torch

from gvq.bench.opcount import count_ops
from gvq.compressors import _kernels as kernels
from gvq.compressors.dgc import DGC
from tests.compressors.test_triton_grace import NO_KERNEL_OPS, gradient
from tests.helpers.triton import MARKS, kernel_device

DEVICE = kernel_device()
pytestmark = MARKS

SHAPES = [(40, 75), (30,), (20, 50), (7,), (12, 25)]      # 4337 values: a scope over a select's block
N = 4337
SETTINGS = {
    "tensor": lambda **kw: DGC(0.05, sample=0.1, **kw).grouped(SHAPES),
    "sparse_tensor": lambda **kw: DGC(0.2, **kw).grouped(SHAPES),     # the last tensor: < 0.8 k candidates
    "ratio_1": lambda **kw: DGC(1.0, **kw).grouped(SHAPES),
    "no_layout": lambda **kw: DGC(0.02, **kw),
}


def vector(seed=0) -> torch.Tensor:
    """Laplace values with runs of ties and zeros; the last tensor tiny but where iteration 1 samples it
    (each 30th from its 3rd, at r = 0.2): its threshold is then 1.5, which 10 values clear, < 0.8 k."""
    x = torch.cat([gradient(seed), gradient(seed + 1)])[:N]
    x[-300:] = 1e-6
    x[-297::30] = 1.5
    return x


def kept(q, payload, seg):
    """The sparse part's kept (position, value) pairs in position order, and the dense part."""
    plan = q.plan(seg)
    payload = payload.cpu()
    pos, vals = plan.topk.unpack(payload[: plan.inner_bytes], slice(0, plan.sparse.numel()))
    order = torch.argsort(pos)
    return pos[order], vals[order].view(torch.int32), payload[plan.inner_bytes:]


def pair(name, iteration):
    mine, ref = SETTINGS[name](kernels="triton"), SETTINGS[name](kernels="torch")
    for q in (mine, ref):
        q.begin_vector(0, iteration, 0)
    return mine, ref


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_the_kept_set_values_and_decode_equal_the_torch_paths(name):
    seg, x = slice(0, N), vector()
    for iteration in (1, 8):
        mine, ref = pair(name, iteration)
        p, r = mine.compress(x.to(DEVICE), seg), ref.compress(x, seg)
        assert p.dtype == r.dtype and p.numel() == r.numel()
        for got, want in zip(kept(mine, p, seg), kept(ref, r, seg)):
            assert torch.equal(got, want)
        dec = ref.decompress(r, seg)
        for payload in (p, r.to(DEVICE)):          # either path decodes either payload, bitwise alike
            assert torch.equal(mine.decompress(payload, seg).cpu().view(torch.int32), dec.view(torch.int32))
        assert torch.equal(ref.decompress(p.cpu(), seg), dec)


def test_a_scope_of_few_candidates_sends_fewer_than_k_as_the_torch_path():
    """The tiny tensor: fewer than 0.8 k values clear 0.8^9 t, so it sends them all, and zeros at its
    lowest other positions."""
    mine, ref = pair("sparse_tensor", 1)
    seg, x = slice(0, N), vector()
    p = mine.compress(x.to(DEVICE), seg)
    tk = mine.plan(seg).topk.plan(slice(0, mine.plan(seg).sparse.numel()))
    pos, vals, _ = kept(mine, p, seg)
    last = pos >= tk.starts[-1]
    assert int((vals[last] != 0).sum()) == 10 < tk.ks[-1] == int(last.sum())
    assert pos[last][:5].tolist() == [tk.starts[-1] + i for i in range(5)]
    assert torch.equal(kept(ref, ref.compress(x, seg), seg)[0], pos)


def test_nan_inf_and_float64_inputs_as_the_torch_path():
    """A float64 input is selected and sent as its float32 rounding; Inf is a candidate, NaN never (the
    check sees it instead, on either path)."""
    x = vector(seed=2).double() * (1 + 1e-12)
    x[[5, 2500]], x[77] = float("nan"), float("-inf")
    mine, ref = pair("tensor", 5)
    seg = slice(0, N)
    p, r = mine.compress(x.to(DEVICE), seg), ref.compress(x, seg)
    for got, want in zip(kept(mine, p, seg), kept(ref, r, seg)):
        assert torch.equal(got, want)
    pos = kept(mine, p, seg)[0].tolist()
    assert 77 in pos and 5 not in pos
    for q in (mine, ref):
        with pytest.raises(ValueError, match="NaN or Inf"):
            q.check_health()


def test_a_call_is_two_launches_with_no_device_op_or_host_read_between():
    q, seg, x = SETTINGS["tensor"](kernels="triton"), slice(0, N), vector().to(DEVICE)
    payload = q.compress(x, seg)                           # warm: the plan and its tables, made once
    q.begin_vector(0, 9, 0)
    with count_ops() as ops, kernels.count_launches(run=False) as c:
        q.compress(x, seg)
    with count_ops() as dops, kernels.count_launches(run=False) as d:
        q.decompress(payload, seg)
    assert c.by_name == {"dgc_select": 1, "dense_out": 1} and d.by_name == {"dense_in": 1, "topk_scatter": 1}
    assert ops.syncs == dops.syncs == 0
    assert set(ops.by_name) | set(dops.by_name) <= NO_KERNEL_OPS, (ops.by_name, dops.by_name)


@pytest.mark.parametrize("depth", [20, 110])
def test_launches_are_flat_in_depth(depth):
    """A program per sparse tensor and per run: ResNet-20's and ResNet-110's layouts take the same
    launches (counted, not run)."""
    from gvq.bench.common import model_shapes
    shapes = model_shapes(f"resnet{depth}", 10)
    n = sum(s.numel() for s in shapes)
    q, seg = DGC(0.001, kernels="triton").grouped(shapes), slice(0, n)
    with kernels.count_launches(run=False) as c:
        payload = q.compress(torch.zeros(n, device=DEVICE), seg)
    with kernels.count_launches(run=False) as d:
        q.decompress(payload, seg)
    assert c.by_name == {"dgc_select": 1, "dense_out": 1} and d.by_name == {"dense_in": 1, "topk_scatter": 1}


def test_host_tensors_keep_the_torch_path():
    x, seg = vector(), slice(0, N)
    for q in (DGC().grouped(SHAPES), DGC(kernels="torch")):
        with kernels.count_launches() as c:
            q.decompress(q.compress(x, seg), seg)
        assert c.launches == 0
