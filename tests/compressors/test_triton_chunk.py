"""SparseLoCo's chunked top-k on its Triton path (gvq/compressors/_triton_grace.py, _triton_chunk.py), proven
on the CPU by Triton's interpreter (or compiled on a GPU), against the torch reference in
gvq/compressors/topk_chunk.py: the same kept set and value cells per chunk (ties to the lower index); the
sigmas within 1e-6 relative (a chunk's squares are summed in another order: a tree over slots in index
order, against index_add over slots best first); either path decodes either payload, and a payload decodes
bitwise alike on both.  At most 3 launches a compress and 2 a decompress, the same at two depths, with no
torch compute op and no host read between them.  A few chunks of at most 2k values (the interpreter is
slow)."""
from __future__ import annotations

import pytest
import torch

from gvq.bench.opcount import count_ops
from gvq.compressors import _kernels as kernels
from gvq.compressors import _packing
from gvq.compressors.topk_chunk import ChunkTopK
from tests.compressors.test_triton_grace import NO_KERNEL_OPS, gradient
from tests.helpers.triton import MARKS, kernel_device

DEVICE = kernel_device()
pytestmark = MARKS

N = 3000
SETTINGS = {          # a ragged last chunk in each; k * bits not a whole number of bytes in the second
    "sparseloco": dict(k=32, chunk=2048),
    "three_bits_tight": dict(k=21, chunk=1000, bits=3, clip=2.0),
}


def cells(q, payload, seg):
    """(positions, value cells) in position order, and the sigmas, of a payload."""
    plan = q.plan(seg)
    side, vbytes, _ = q.layout_bytes(plan)
    payload = payload.cpu()
    codes = _packing.unpack_bits(payload[side: side + vbytes], q.bits, plan.k)
    pos, _ = q.unpack(payload, seg)
    order = torch.argsort(pos)
    return pos[order], codes[order], payload[:side].clone().view(torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_the_kept_set_cells_and_decode_equal_the_torch_paths(name):
    mine, ref = (ChunkTopK(**SETTINGS[name], kernels=path) for path in ("triton", "torch"))
    seg = slice(0, N)
    x = gradient()[:N]
    p, r = mine.compress(x.to(DEVICE), seg), ref.compress(x, seg)
    assert p.dtype == r.dtype and p.numel() == r.numel()
    (pos, codes, sigma), (rpos, rcodes, rsigma) = cells(mine, p, seg), cells(ref, r, seg)
    assert torch.equal(pos, rpos) and torch.equal(codes, rcodes)
    torch.testing.assert_close(sigma, rsigma, rtol=1e-6, atol=0.0)
    for payload in (p.cpu(), r):                  # either path decodes either payload, bitwise alike
        dec = mine.decompress(payload.to(DEVICE), seg).cpu()
        assert torch.equal(dec.view(torch.int32), ref.decompress(payload, seg).view(torch.int32))


def test_an_all_zero_chunk_sends_sigma_0_and_decodes_to_zeros():
    q, seg = ChunkTopK(k=8, chunk=512, kernels="triton"), slice(0, 1024)
    x = torch.cat([torch.zeros(512), gradient()[:512]]).to(DEVICE)
    p = q.compress(x, seg)
    assert float(p[:4].clone().view(torch.float32)) == 0.0
    dec = q.decompress(p, seg).cpu()
    assert not dec[:512].any() and dec[512:].count_nonzero() == 8


def test_a_call_is_a_few_launches_with_no_device_op_or_host_read_between():
    q, seg, x = ChunkTopK(**SETTINGS["sparseloco"], kernels="triton"), slice(0, N), gradient()[:N].to(DEVICE)
    payload = q.compress(x, seg)                  # warm: the plan and its tables, made once
    q.decompress(payload, seg)
    with count_ops() as ops, kernels.count_launches(run=False) as c:
        q.compress(x, seg)
    with count_ops() as dops, kernels.count_launches(run=False) as d:
        q.decompress(payload, seg)
    assert c.by_name == {"topk_select": 1, "chunk_codes": 1, "pack_two": 1}
    assert d.by_name == {"zero_fill": 1, "chunk_scatter": 1}
    assert ops.syncs == dops.syncs == 0
    assert set(ops.by_name) | set(dops.by_name) <= NO_KERNEL_OPS, (ops.by_name, dops.by_name)


def test_launches_are_flat_in_depth():
    """A program per chunk: ResNet-20's and ResNet-110's gradients take the same launches (counted, not
    run)."""
    from gvq.bench.common import model_shapes
    counts = []
    for depth in (20, 110):
        n = sum(s.numel() for s in model_shapes(f"resnet{depth}", 10))
        q, seg = ChunkTopK(kernels="triton"), slice(0, n)
        with kernels.count_launches(run=False) as c:
            payload = q.compress(torch.zeros(n, device=DEVICE), seg)
        with kernels.count_launches(run=False) as d:
            q.decompress(payload, seg)
        counts.append((c.by_name, d.by_name))
    assert counts[0] == counts[1] and sum(counts[0][0].values()) == 3 and sum(counts[0][1].values()) == 2
