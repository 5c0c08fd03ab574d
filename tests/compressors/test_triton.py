"""The Triton path of the scalar quantizers and fp16 (gvq/compressors/_triton.py), proven on the CPU by
Triton's interpreter (the fitted Linear-s, ORQ-s, BinGrad-b and BinGrad-pb too): fed the torch device
path's uniforms, the same codes and decoded values; drawing its own, unbiased, fresh every call and
replayed from a checkpoint; at most 3 launches a compress and 2 a decompress.  Inputs of at most 16
buckets (the interpreter is slow)."""
from __future__ import annotations

import os

import pytest
import torch

from gvq.compressors import _batch, _triton
from gvq.compressors import _kernels as kernels
from gvq.compressors._bucketing import clip_rows
from gvq.compressors._packing import unpack
from gvq.compressors.bingrad_b import BinGradB
from gvq.compressors.bingrad_pb import BinGradPB
from gvq.compressors.fp16 import FP16
from gvq.compressors.linear import Linear
from gvq.compressors.orq import ORQ
from gvq.compressors.qsgd import QSGD
from gvq.compressors.signsgd import ScaledSignSGD
from gvq.compressors.terngrad import TernGrad
from tests.helpers.triton import MARKS, kernel_device

#: where the kernels run: CPU tensors through the interpreter (make test), or compiled on the GPU, where
#: make gpu-check runs the tests marked ``cuda`` (the rest feed CPU tensors to the interpreter)
DEVICE = kernel_device()
pytestmark = MARKS

CODECS = {
    "qsgd2": lambda **kw: QSGD(bits=2, **kw),
    "qsgd4": lambda **kw: QSGD(bits=4, **kw),
    "qsgd8": lambda **kw: QSGD(bits=8, **kw),
    "qsgd4_max": lambda **kw: QSGD(bits=4, norm="max", **kw),
    "qsgd5_levels": lambda **kw: QSGD(levels=5, **kw),
    "terngrad": TernGrad,
    "terngrad_clipped": lambda **kw: TernGrad(clip=2.5, **kw),
    "signsgd": ScaledSignSGD,
    "linear5": Linear,
    "linear9_bucket1024": lambda **kw: Linear(levels=9, bucket=1024, **kw),
    "orq5": ORQ,
    "bingrad_b": BinGradB,
    "bingrad_b_mean": lambda **kw: BinGradB(threshold="mean", **kw),
    "bingrad_pb": BinGradPB,
}
#: ORQ-9's third halving round, proven on the any-floats inputs only (seconds a call here)
FACTORIES = {**CODECS, "orq9_bucket1024": lambda **kw: ORQ(levels=9, bucket=1024, **kw)}
#: unbiased (stochastic rounding, no clipping, which biases the outliers by design): one of each alphabet
UNBIASED = ["qsgd2", "qsgd4", "qsgd5_levels", "terngrad", "linear5", "orq5"]
#: whose scale is a maximum: exact on any float input (sums are exact only on the grid input); the fitted
#: levels sum nothing but integer counts, so they are exact on any floats too
MAX_SCALED = ["qsgd4_max", "terngrad"]
FITTED = ["linear5", "linear9_bucket1024", "orq5", "orq9_bucket1024"]
#: whose side floats are sums of values (norms, BinGrad's means and b1): bitwise on the grid input only
SUMMED = ["qsgd4", "signsgd", "terngrad_clipped", "bingrad_b", "bingrad_b_mean", "bingrad_pb"]
CONV = (64, 16, 3, 3)        # a conv weight's gradient: 9216 values, 4.5 buckets of 2048 (a ragged last one)


def grid_gradient(shape=CONV, seed=0) -> torch.Tensor:
    """Laplace values on a grid of 2^-10 within +-40 steps: every bucket's sum of squares and of |v| is
    exact in float32 in any order, so both paths' scales agree bitwise (on arbitrary floats a reduction's
    order moves its last bit)."""
    g = torch.Generator().manual_seed(seed)
    lap = torch.distributions.Laplace(0.0, 8.0).sample(shape).flatten()
    lap = lap[torch.randperm(lap.numel(), generator=g)]
    return lap.round().clamp(-40, 40) * 2.0 ** -10


def float_gradient(shape=CONV, seed=0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).flatten() * 1e-3


def torch_path(q, x, u01):
    """The torch device path (``_batch``: what CUDA tensors take with ``kernels=torch``), its dither
    replaced by ``u01`` (numel,) shifted as its own draws are."""
    lay = q.layout(x.numel())
    m, width = _batch.batch_shape(lay)

    def supplied(like, lo):
        u = torch.zeros(m * width, device=like.device)
        u[: x.numel()] = u01
        return (u + lo).view(like.shape)
    q.uniform = supplied
    os.environ["GVQ_FUSED"] = "0"      # the device path's ops on CPU tensors (no numba dither lanes)
    try:
        payload = _batch.compress_batch(q, x, lay, clip_rows)
        return payload, _batch.decompress_batch(q, payload, lay)
    finally:
        del os.environ["GVQ_FUSED"]


def triton_path(q, x, u01=None):
    lay, seg = q.layout(x.numel()), slice(0, x.numel())
    payload = q.triton_compress(x, lay, u01) if u01 is not None else q.compress(x, seg)
    return payload, q.decompress(payload, seg)


def assert_same_payload(q, mine, ref, numel):
    """Side floats bitwise, codes equal (padding digits of the last word aside: the torch path leaves
    its batch's padding there), as the wire carries them."""
    lay = q.layout(numel)
    assert torch.equal(mine[: lay.side_bytes], ref[: lay.side_bytes])
    assert torch.equal(unpack(mine[lay.side_bytes:], lay), unpack(ref[lay.side_bytes:], lay))


def compare_paths(name, x, seed=3):
    u01 = torch.rand(x.numel(), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    x = x.to(DEVICE)
    mine_q, ref_q = FACTORIES[name](kernels="triton"), FACTORIES[name](kernels="torch")
    mine, mine_dec = triton_path(mine_q, x, u01)
    ref, ref_dec = torch_path(ref_q, x, u01)
    assert_same_payload(mine_q, mine, ref, x.numel())
    assert torch.equal(mine_dec, ref_dec)
    return mine_dec.cpu()


# ---- the same codes as the torch path, fed the same uniforms -------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(CODECS))
def test_codes_and_decoded_values_equal_the_torch_paths(name):
    compare_paths(name, grid_gradient())


@pytest.mark.parametrize("name", MAX_SCALED)
def test_max_scaled_codecs_equal_the_torch_path_on_any_floats(name):
    compare_paths(name, float_gradient())


@pytest.mark.parametrize("name", FITTED)
@pytest.mark.parametrize("numel", [CONV[0] * CONV[1] * 9, 700])
def test_fitted_levels_equal_the_torch_paths_on_any_floats(name, numel):
    """700 values: one bucket narrower than ``bucket``, whose histogram has the torch batch's bins."""
    compare_paths(name, float_gradient()[:numel])


@pytest.mark.parametrize("make", [lambda: Linear(clip=2.0, kernels="triton"),
                                  lambda: Linear(fit="sorted", kernels="triton"),
                                  lambda: Linear(levels=_triton.FIT_MAX_LEVELS + 1, kernels="triton"),
                                  lambda: ORQ(levels=17, kernels="triton"),
                                  lambda: BinGradB(clip=2.0, kernels="triton"),
                                  lambda: BinGradPB(fit="sorted", kernels="triton")])
def test_fitted_quantizers_keep_the_torch_path_where_their_kernels_do_not_fit(make):
    with kernels.count_launches() as c:
        make().compress(grid_gradient()[:4096], slice(0, 4096))
    assert c.launches == 0


@pytest.mark.parametrize("name", SUMMED)
def test_summed_scales_agree_to_the_last_bits_on_any_floats(name):
    """On arbitrary floats a sum's order moves its last bits: scales within float32 summation error of
    one another, and a code differs only where that moves a value across a level's edge (a few in
    thousands at most)."""
    x, u01 = float_gradient(), torch.rand(CONV[0] * CONV[1] * 9, generator=torch.Generator().manual_seed(1))
    mine_q, ref_q = CODECS[name](kernels="triton"), CODECS[name](kernels="torch")
    (mine, _), (ref, _) = triton_path(mine_q, x, u01), torch_path(ref_q, x, u01)
    lay = mine_q.layout(x.numel())
    side, ref_side = mine[: lay.side_bytes].view(torch.float32), ref[: lay.side_bytes].view(torch.float32)
    torch.testing.assert_close(side, ref_side, rtol=1e-5, atol=0)
    codes, ref_codes = unpack(mine[lay.side_bytes:], lay), unpack(ref[lay.side_bytes:], lay)
    exact = name == "bingrad_b"        # its threshold is fitted on integer counts: codes exact on any floats
    assert int((codes != ref_codes).sum()) <= (0 if exact else max(2, x.numel() // 1000))


def test_fp16_payload_and_decode_equal_the_torch_paths():
    x = float_gradient() * 1e3
    mine_q, ref_q, seg = FP16(kernels="triton"), FP16(kernels="torch"), slice(0, x.numel())
    mine, ref = mine_q.compress(x, seg), ref_q.compress(x, seg)
    assert torch.equal(mine, ref)
    assert torch.equal(mine_q.decompress(mine, seg), ref_q.decompress(ref, seg))


@pytest.mark.parametrize("name", sorted(CODECS))
def test_one_value_and_all_zero_inputs_equal_the_torch_paths(name):
    compare_paths(name, torch.tensor([0.37]))
    assert torch.equal(compare_paths(name, torch.zeros(3000)), torch.zeros(3000))


# ---- the in-kernel draws -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", UNBIASED)
def test_in_kernel_draws_are_unbiased(name):
    """6 calls on 16 copies of a bucket: each value's mean within 5.5 standard errors, and their sum
    within 5 (the variance of rounding between two levels is known exactly: step^2 f (1 - f), f the
    position between them)."""
    n = 256
    base = grid_gradient(seed=4)[:n]
    q, x = CODECS[name](kernels="triton", bucket=n), base.repeat(16)
    samples = torch.cat([triton_path(q, x)[1].view(16, -1) for _ in range(6)]).double()
    ref = torch_path(CODECS[name](kernels="torch", bucket=n), base, torch.zeros(n))[1].double()
    step = torch_path(CODECS[name](kernels="torch", bucket=n), base, torch.full((n,), 1 - 2 ** -24))[1] - ref
    f = ((base - ref) / step.clamp(min=1e-30)).clamp(0, 1)
    se = (step * step * f * (1 - f) / samples.shape[0]).sqrt()
    excess = (samples.mean(0) - base.double()).abs() - 5.5 * se - 1e-6 * float(base.abs().max())
    assert float(excess.max()) <= 0
    z = float((samples.mean(0) - base.double()).sum() / se.pow(2).sum().sqrt())
    assert abs(z) < 5


@pytest.mark.parametrize("name", ["qsgd4", "terngrad_clipped", "linear5", "orq5", "bingrad_pb"])
def test_two_calls_draw_fresh_dithers_and_a_checkpoint_replays_them(name, tmp_path):
    q, fresh = CODECS[name](kernels="triton"), CODECS[name](kernels="triton")
    q.reseed(11)
    x, seg = grid_gradient(), slice(0, CONV[0] * CONV[1] * 9)
    first = q.compress(x, seg)
    torch.save(q.state_dict(), tmp_path / "s.pt")
    second = q.compress(x, seg)
    assert not torch.equal(first, second)
    fresh.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert torch.equal(fresh.compress(x, seg), second)


# ---- health, launches, the path's choice ---------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CODECS) + ["fp16"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_inputs_raise_at_the_check_as_on_the_torch_path(name, bad):
    q = FP16(kernels="triton") if name == "fp16" else CODECS[name](kernels="triton")
    x = grid_gradient()[:4096]
    x[3000] = bad
    q.compress(x, slice(0, x.numel()))
    with pytest.raises(ValueError, match="NaN or Inf"):
        q.check_health()


def test_fp16_out_of_range_raises_at_the_check():
    q = FP16(kernels="triton")
    q.compress(torch.tensor([1.0, -7e4]), slice(0, 2))
    with pytest.raises(ValueError, match="beyond float16"):
        q.check_health()


@pytest.mark.parametrize("name", sorted(CODECS) + ["fp16"])
def test_a_call_is_at_most_3_launches_to_compress_and_2_to_decompress(name):
    q = FP16(kernels="triton") if name == "fp16" else CODECS[name](kernels="triton")
    x, seg = grid_gradient(), slice(0, CONV[0] * CONV[1] * 9)
    with kernels.count_launches() as c:
        payload = q.compress(x, seg)
    with kernels.count_launches() as d:
        q.decompress(payload, seg)
    assert 1 <= c.launches <= 3 and 1 <= d.launches <= 2, (c.by_name, d.by_name)


def test_the_path_is_chosen_once_per_device(monkeypatch):
    q, x, seg = QSGD(kernels="triton"), grid_gradient(), slice(0, 4096)
    q.compress(x[:4096], seg)
    monkeypatch.setattr(kernels, "choose_path", lambda *a, **k: pytest.fail("asked again"))
    with kernels.count_launches() as c:
        q.compress(x[:4096], seg)
    assert c.launches == 2


def test_host_tensors_keep_their_path_unless_triton_is_asked_for():
    x, seg = grid_gradient(), slice(0, 4096)
    for q in (QSGD(), QSGD(kernels="torch"), FP16()):
        with kernels.count_launches() as c:
            q.compress(x[:4096], seg)
        assert c.launches == 0


def test_kernels_triton_without_triton_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(kernels, "triton_available", lambda: False)
    for make in (lambda: QSGD(kernels="triton"), lambda: FP16(kernels="triton")):
        with pytest.raises(ValueError, match=r"^kernels=triton: Triton is not installed[^\n]*$"):
            make()
    assert QSGD(kernels="auto").kernels == "auto"
