"""The re-encode ring's hop fused on the Triton path (gvq/compressors/_triton_hop.py, launched by
_triton.py; ``Compressor.reencode_sum``): fed the same uniforms, the payload of decode + add + encode on the
torch path, and bitwise that of the Triton path's own decompress, add and compress; at most 2 launches a
hop (fp16: 1).  Proven on the CPU by Triton's interpreter on at most 5 buckets, a ragged last one."""
from __future__ import annotations

import contextlib
import os

import pytest
import torch

from gvq.compressors import _batch
from gvq.compressors import _kernels as kernels
from gvq.compressors._bucketing import clip_rows
from gvq.compressors._packing import unpack
from gvq.compressors.fp16 import FP16
from gvq.compressors.linear import Linear
from gvq.compressors.qsgd import QSGD
from gvq.compressors.signsgd import ScaledSignSGD
from gvq.compressors.terngrad import TernGrad
from tests.helpers.triton import MARKS, kernel_device

DEVICE = kernel_device()
pytestmark = MARKS

#: whose decoded values are on a grid when the received scales are powers of two (the decode's step a
#: power of two times the scale), so every sum the hop takes is exact: bitwise the torch path's
GRID_EXACT = {
    "qsgd2": lambda **kw: QSGD(bits=2, **kw),
    "qsgd5_levels": lambda **kw: QSGD(levels=5, **kw),
    "qsgd4_max": lambda **kw: QSGD(bits=4, norm="max", **kw),    # a maximum: exact whatever the decode
    "terngrad": TernGrad,
    "terngrad_clipped": lambda **kw: TernGrad(clip=2.5, **kw),
    "signsgd": ScaledSignSGD,
}
#: a step of scale / 7 or / 127: decoded values off any grid, so a norm's order moves its last bits
CODECS = {**GRID_EXACT, "qsgd4": lambda **kw: QSGD(bits=4, **kw), "qsgd8": lambda **kw: QSGD(bits=8, **kw)}
NUMEL = 64 * 16 * 9           # a conv weight's gradient: 4.5 buckets of 2048 (a ragged last one)


def grid_values(n=NUMEL, seed=0) -> torch.Tensor:
    """Integers within +-40 times 2^-10: sums of squares and of |v| exact in float32 in any order."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * 12).round().clamp(-40, 40) * 2.0 ** -10


def received(q, x, seed=1, pow2=False) -> torch.Tensor:
    """A payload from the ring's left neighbour: ``x`` encoded on the torch path; ``pow2``: its scales
    replaced by powers of two (any side floats are a valid wire format)."""
    payload = torch_encode(q, x, torch.rand(x.numel(), generator=torch.Generator().manual_seed(seed)))
    if pow2:
        side = payload[: q.layout(x.numel()).side_bytes].view(torch.float32)
        side.copy_(torch.ldexp(torch.ones(side.numel()), -5 - torch.arange(side.numel()) % 3))
    return payload


def torch_encode(q, x, u01):
    """The torch device path's compress (``_batch``), its dither replaced by ``u01`` (numel,)."""
    lay = q.layout(x.numel())
    m, width = _batch.batch_shape(lay)

    def supplied(like, lo):
        u = torch.zeros(m * width, device=like.device)
        u[: x.numel()] = u01.to(like.device)
        return (u + lo).view(like.shape)
    q.uniform = supplied
    os.environ["GVQ_FUSED"] = "0"      # the device path's ops on CPU tensors (no numba kernels)
    try:
        return _batch.compress_batch(q, x, lay, clip_rows)
    finally:
        del os.environ["GVQ_FUSED"]


def torch_hop(q, payload, local, u01):
    """Decode + add + encode as the torch device path takes them (the reference)."""
    partial = _batch.decompress_batch(q, payload, q.layout(local.numel()))
    partial += local
    return torch_encode(q, partial, u01)


def hop_case(name, x, local, pow2, seed=3):
    u01 = torch.rand(x.numel(), generator=torch.Generator().manual_seed(seed))
    mine_q, ref_q = CODECS[name](kernels="triton"), CODECS[name](kernels="torch")
    payload = received(ref_q, x, pow2=pow2)
    lay = mine_q.layout(x.numel())
    mine = mine_q.triton_reencode_sum(payload.to(DEVICE), local.to(DEVICE), lay, u01.to(DEVICE)).cpu()
    return mine_q, lay, mine, torch_hop(ref_q, payload, local, u01), (payload, u01)


@pytest.mark.parametrize("name", sorted(GRID_EXACT))
@pytest.mark.parametrize("numel", [NUMEL, 700])
def test_fused_hop_equals_decode_add_encode_on_the_torch_path(name, numel):
    """700 values: one bucket narrower than ``bucket``."""
    q, lay, mine, ref, _ = hop_case(name, grid_values(numel), grid_values(numel, seed=2), pow2=True)
    assert torch.equal(mine[: lay.side_bytes], ref[: lay.side_bytes])
    assert torch.equal(unpack(mine[lay.side_bytes:], lay), unpack(ref[lay.side_bytes:], lay))
    seg = slice(0, numel)
    torch.testing.assert_close(q.decompress(mine.to(DEVICE), seg).cpu(), _batch.decompress_batch(q, ref, lay),
                               rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(CODECS))
def test_fused_hop_on_any_floats_is_the_triton_paths_three_calls_and_near_the_torch_paths(name):
    """Against the Triton path's decompress, add and compress, bitwise (the same reductions); against the
    torch path, scales within float32 summation error and codes apart only where that crosses a level's
    edge (a few in thousands at most)."""
    x, local = torch.randn(NUMEL) * 1e-3, torch.randn(NUMEL) * 1e-3
    q, lay, mine, ref, (payload, u01) = hop_case(name, x, local, pow2=False)
    three = CODECS[name](kernels="triton")
    partial = three.decompress(payload.to(DEVICE), slice(0, NUMEL)) + local.to(DEVICE)
    assert torch.equal(mine, three.triton_compress(partial, lay, u01.to(DEVICE)).cpu())
    side, ref_side = mine[: lay.side_bytes].view(torch.float32), ref[: lay.side_bytes].view(torch.float32)
    torch.testing.assert_close(side, ref_side, rtol=1e-5, atol=0)
    codes, ref_codes = unpack(mine[lay.side_bytes:], lay), unpack(ref[lay.side_bytes:], lay)
    assert int((codes != ref_codes).sum()) <= max(2, NUMEL // 1000)


@pytest.mark.parametrize("name", ["qsgd4", "terngrad_clipped"])
def test_fused_hop_draws_as_a_compress_draws(name):
    """No uniforms supplied: the same Philox key and offsets as decompress + add + compress, so a codec
    seeded alike sends the same payload, and the next call draws fresh ones."""
    fused, three, seg = CODECS[name](kernels="triton"), CODECS[name](kernels="triton"), slice(0, NUMEL)
    fused.reseed(7)
    three.reseed(7)
    payload = received(CODECS[name](kernels="torch"), grid_values()).to(DEVICE)
    local = grid_values(seed=2).to(DEVICE)
    first = fused.reencode_sum(payload, local, seg)
    assert torch.equal(first, three.compress(three.decompress(payload, seg) + local, seg))
    assert not torch.equal(first, fused.reencode_sum(payload, local, seg))


def test_fp16_hop_equals_decode_add_encode():
    x, local, seg = torch.randn(NUMEL) * 10, torch.randn(NUMEL) * 10, slice(0, NUMEL)
    payload = FP16(kernels="torch").compress(x, seg)
    mine = FP16(kernels="triton").reencode_sum(payload.to(DEVICE), local.to(DEVICE), seg).cpu()
    assert torch.equal(mine, FP16(kernels="torch").reencode_sum(payload, local, seg))


class Labels:
    """A stopwatch that records the labels it was asked to time."""

    def __init__(self):
        self.seen = []

    def __call__(self, label):
        self.seen.append(label)
        return contextlib.nullcontext()


@pytest.mark.parametrize("name", sorted(CODECS) + ["fp16"])
def test_a_hop_is_at_most_2_launches_timed_as_compress(name):
    q = FP16(kernels="triton") if name == "fp16" else CODECS[name](kernels="triton")
    x, seg = grid_values().to(DEVICE), slice(0, NUMEL)
    payload, clock = q.compress(x, seg), Labels()
    with kernels.count_launches() as c:
        q.reencode_sum(payload, x, seg, clock)
    assert 1 <= c.launches <= (1 if name == "fp16" else 2), c.by_name
    assert clock.seen == ["compress"]


@pytest.mark.parametrize("make", [lambda: QSGD(kernels="torch"), lambda: FP16(kernels="torch"),
                                  lambda: Linear(kernels="triton")])
def test_other_paths_keep_decompress_add_compress(make):
    """The torch path launches nothing; a fitted quantizer's hop is its Triton decompress and compress."""
    q, x, seg, clock = make(), grid_values()[:2048].to(DEVICE), slice(0, 2048), Labels()
    payload = q.compress(x, seg)
    with kernels.count_launches() as c:
        q.reencode_sum(payload, x, seg, clock)
    assert clock.seen == ["decompress", "add", "compress"]
    assert c.launches == (3 if isinstance(q, Linear) else 0), c.by_name


@pytest.mark.parametrize("name", ["qsgd4", "signsgd", "fp16"])
def test_a_non_finite_sum_raises_at_the_check(name):
    q = FP16(kernels="triton") if name == "fp16" else CODECS[name](kernels="triton")
    x, seg = grid_values().to(DEVICE), slice(0, NUMEL)
    payload = q.compress(x, seg)
    q.check_health()
    x[5000] = float("nan")
    q.reencode_sum(payload, x, seg)
    with pytest.raises(ValueError, match="NaN or Inf"):
        q.check_health()
