"""The Triton path of the low-rank codecs' steps between their GEMMs (gvq/compressors/_triton_lowrank.py),
proven on the CPU by Triton's interpreter: GradiVeQ's device path, PowerSGD's two passes and PowerSGD's
error memory equal to the torch path's (bitwise where the kernel only moves values, within float rounding
where it adds), on a few layers of a ResNet-20's gradient shapes; and the launches of each call."""
from __future__ import annotations

import pytest
import torch

from gvq.aggregators.base import RunContext
from gvq.aggregators.powersgd import PowerSGDAggregator
from gvq.compressors import _kernels as kernels
from gvq.compressors.base import split_on_cuts
from gvq.compressors.gradiveq.codec import GradiVeQ
from gvq.compressors.powersgd import PowerSGD
from gvq.schema.options import PowerSGDSchema, knobs
from tests.helpers.triton import MARKS, kernel_device
from tests.helpers.rings import powersgd_passes

DEVICE = kernel_device()
pytestmark = MARKS

#: a ResNet-20's stem, two 16-channel convs, a down-sampling stage's 32-channel convs and 1x1 shortcut,
#: their batch-norm vectors and the classifier
SHAPES = [(16, 3, 3, 3), (16,), (16,), (16, 16, 3, 3), (16,), (16,), (16, 16, 3, 3), (16,), (16,),
          (32, 16, 3, 3), (32,), (32,), (32, 32, 3, 3), (32,), (32,), (32, 16, 1, 1), (32,), (10, 32), (10,)]


def _gradient(n: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(DEVICE) * 1e-2


# ---- GradiVeQ ------------------------------------------------------------------------------------------
def _gradiveq(kernels: str, basis_dtype: str, world_size: int) -> GradiVeQ:
    comp = GradiVeQ(world_size=world_size, basis_dtype=basis_dtype, kernels=kernels).bind(SHAPES)
    samples = torch.randn(12, comp.layout.numel, generator=torch.Generator().manual_seed(1))
    return comp.fit(samples.to(DEVICE))


@pytest.mark.parametrize("basis_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_gradiveq_payload_and_decoding_equal_the_torch_paths(basis_dtype, world_size, monkeypatch):
    """float32: the kernel only gathers the GEMMs' results and the raw values, so bitwise; bf16 adds the
    mean term after the GEMMs (beta = -1/N), where a fused multiply-add may round once where torch rounds
    twice."""
    monkeypatch.setenv("GVQ_FUSED", "0")            # the device path on CPU tensors
    mine, ref = _gradiveq("triton", basis_dtype, world_size), _gradiveq("torch", basis_dtype, world_size)
    n = mine.layout.numel
    g = _gradient(n)
    tol = {} if basis_dtype == "bfloat16" else {"rtol": 0, "atol": 0}
    for seg in [slice(0, n), *split_on_cuts(mine.cuts(n), 3)]:
        payload, ref_payload = mine.compress(g[seg], seg), ref.compress(g[seg], seg)
        torch.testing.assert_close(payload, ref_payload, **tol)
        torch.testing.assert_close(mine.decompress(ref_payload, seg), ref.decompress(ref_payload, seg), **tol)


@pytest.mark.parametrize("basis_dtype", ["float32", "bfloat16"])
def test_gradiveq_is_one_launch_a_call_each_way(basis_dtype, monkeypatch):
    monkeypatch.setenv("GVQ_FUSED", "0")
    comp = _gradiveq("triton", basis_dtype, 2)
    n = comp.layout.numel
    g, seg = _gradient(n), split_on_cuts(comp.cuts(n), 3)[1]
    payload = comp.compress(g[seg], seg)
    with kernels.count_launches() as c:
        payload = comp.compress(g[seg], seg)
    with kernels.count_launches() as d:
        comp.decompress(payload, seg)
    assert (c.by_name, d.by_name) == ({"lay_out": 1}, {"lay_out": 1})


@pytest.mark.skipif(DEVICE != "cpu", reason="the host's paths: CPU tensors")
def test_gradiveq_on_the_host_keeps_its_per_piece_gemms_and_auto_its_torch_ops(monkeypatch):
    g = _gradient(_gradiveq("torch", "float32", 2).layout.numel)
    seg = slice(0, g.numel())
    with kernels.count_launches() as c:
        _gradiveq("triton", "float32", 2).compress(g, seg)           # numba's host path
        monkeypatch.setenv("GVQ_FUSED", "0")
        _gradiveq("auto", "float32", 2).compress(g, seg)             # auto: Triton on CUDA only
    assert c.launches == 0


# ---- PowerSGD ------------------------------------------------------------------------------------------
#: rank 4 at a lower rate: a 2 x 50 matrix travels at rank 2, so the warm start's padding columns count
SETTINGS = {"rank2": (2, 2.0, SHAPES), "rank4_padded": (4, 0.5, SHAPES + [(2, 50)])}


def _powersgd_pair(setting: str, dtype):
    rank, rate, shapes = SETTINGS[setting]
    return [PowerSGD(shapes, rank, rate, warm_start=True, seed=3, dtype=dtype, kernels=k) for k in ("triton", "torch")]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_powersgd_passes_equal_the_torch_paths(setting, dtype):
    """Three iterations (the warm start carried), whole and cut in segments: outputs, P^ and next Q
    within float rounding (the Gram trace is a sum, whose order may differ)."""
    mine, ref = _powersgd_pair(setting, dtype)
    tol = {"rtol": 1e-4, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
    cuts = mine.cuts()
    for it, segs in enumerate([[slice(0, mine.numel)], [slice(0, cuts[5]), slice(cuts[5], mine.numel)]] * 2):
        x = _gradient(mine.numel, seed=it, dtype=dtype)
        torch.testing.assert_close(powersgd_passes(mine, x, segs), powersgd_passes(ref, x, segs), **tol)
        for got, want in ((mine.q, ref.q), (mine.phat, ref.phat)):
            assert got.keys() == want.keys()
            for i in got:
                torch.testing.assert_close(got[i], want[i], **tol)
        torch.testing.assert_close(mine.store.raw, ref.store.raw, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_zero_block_keeps_its_warm_start_q_and_stays_finite(dtype):
    """The all-zero Gram matrix takes the floor (in float64 below float32's range: read in the matrices'
    dtype), and the short Q is not kept."""
    lr = _powersgd_pair("rank2", dtype)[0]
    q0 = {i: q.clone() for i, q in lr.q.items()}
    x = _gradient(lr.numel, dtype=dtype)
    x[lr.blocks[0].start: lr.blocks[0].stop] = 0
    out = powersgd_passes(lr, x, [slice(0, lr.numel)])
    assert torch.isfinite(out).all() and all(torch.isfinite(q).all() for q in lr.q.values())
    assert torch.equal(lr.q[0], q0[0]) and not torch.allclose(lr.q[3], q0[3])


def test_powersgd_launches_a_call():
    """Pass P: its compress none (a gather, GEMMs, a concatenation), its decompress the unpacking and one
    shift; pass Q: its compress none, its decompress one shift and the kept Q."""
    lr = _powersgd_pair("rank2", torch.float32)[0]
    x, seg = _gradient(lr.numel), slice(0, lr.numel)
    powersgd_passes(lr, x, [seg])
    counts = {}
    for stage in (lr.p_stage, lr.q_stage):
        with kernels.count_launches() as c:
            payload = stage.compress(x, seg)
        with kernels.count_launches() as d:
            stage.decompress(payload, seg)
        counts[stage.name] = (c.by_name, d.by_name)
    assert counts == {"powersgd-P": ({}, {"unpack_p": 1, "shift_gram": 1}),
                      "powersgd-Q": ({}, {"shift_gram": 1, "keep_q": 1})}


# ---- PowerSGD's error memory ---------------------------------------------------------------------------
def _aggregator(kernels: str, params):
    agg = PowerSGDAggregator(**knobs(PowerSGDSchema, rank=2, start_iter=0, kernels=kernels))
    agg.setup(params, RunContext(0, 1, seed=5))
    return agg


def test_powersgd_memory_and_mean_equal_the_torch_paths():
    """Three averages on one rank: the mean, the memory (raw blocks 0) and P^ as the torch path's; the
    memory's M - mean within float rounding (torch multiplies by 1/N, the kernel divides)."""
    params = [torch.nn.Parameter(torch.zeros(s, device=DEVICE)) for s in SHAPES]
    mine, ref = _aggregator("triton", params), _aggregator("torch", params)
    try:
        for it in range(3):
            x = _gradient(sum(p.numel() for p in params), seed=10 + it)
            out = []
            for agg in (mine, ref):
                agg.start_iteration(it)
                bucket = agg.bucket_of(x.clone(), agg.everything, it)
                with kernels.count_launches() as c:
                    agg.average(bucket)
                out.append((bucket.flat, agg.feedback.memory.clone(), c.by_name))
            (flat, memory, launches), (ref_flat, ref_memory, _) = out
            torch.testing.assert_close(flat, ref_flat, rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(memory, ref_memory, rtol=1e-5, atol=1e-7)
            assert launches["feed_memory"] == 1 and launches["keep_residual"] == 1
        raw = [slice(b.start, b.stop) for b in mine.low_rank.blocks if not b.rank]
        assert raw and all(bool((mine.feedback.memory[s] == 0).all()) for s in raw)
        assert mine.feedback.memory.abs().sum() > 0
    finally:
        mine.close()
        ref.close()


@pytest.mark.parametrize("ranks", [2, 3])
def test_powersgd_residual_is_zero_on_raw_blocks_and_the_mean_exact(ranks):
    """Past one rank the sum differs from this rank's M: e = M - sum / N, 0 on the raw blocks; the
    kernel's ``flat / N`` bitwise torch's division."""
    params = [torch.nn.Parameter(torch.zeros(s, device=DEVICE)) for s in SHAPES]
    mine, ref = _aggregator("triton", params), _aggregator("torch", params)
    try:
        n = sum(p.numel() for p in params)
        memory, total = _gradient(n, seed=20), _gradient(n, seed=21) * ranks
        out = []
        for agg in (mine, ref):
            e, flat = memory.clone(), total.clone()
            agg.feedback.keep_mean_(e, flat, ranks, agg._raw(agg.everything),
                                    lambda: agg._raw_mask(agg.everything, e.device))
            out.append((e, flat))
        (e, flat), (ref_e, ref_flat) = out
        torch.testing.assert_close(flat, ref_flat, rtol=0, atol=0)
        torch.testing.assert_close(e, ref_e, rtol=1e-5, atol=1e-7)
        raw = [slice(b.start, b.stop) for b in mine.low_rank.blocks if not b.rank]
        assert raw and all(bool((e[s] == 0).all()) for s in raw) and e.abs().sum() > 0
    finally:
        mine.close()
        ref.close()
