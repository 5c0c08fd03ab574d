"""Every compressor runs on its input's device: payloads, scratch, dither lanes, bases, Q matrices.

On ``meta`` tensors (PyTorch's data-less device) any host tensor mixed into the computation raises, so a
host allocation cannot come back unseen on a machine without a GPU; the same calls run on CUDA where it
is visible (and skip elsewhere), there also against the host's results.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gvq.compressors.base import Compressor
from gvq.compressors.bingrad_b import BinGradB
from gvq.compressors.bingrad_pb import BinGradPB
from gvq.compressors.dgc import DGC
from gvq.compressors.efsignsgd import EFSignSGD
from gvq.compressors.fp16 import FP16
from gvq.compressors.gradiveq.codec import GradiVeQ
from gvq.compressors.linear import Linear
from gvq.compressors.natural import Natural
from gvq.compressors.onebit import OneBit
from gvq.compressors.orq import ORQ
from gvq.compressors.powersgd import PowerSGD
from gvq.compressors.qsgd import QSGD
from gvq.compressors.randomk import RandomK
from gvq.compressors.signsgd import ScaledSignSGD
from gvq.compressors.signum import SignVote
from gvq.compressors.terngrad import TernGrad
from gvq.compressors.topk import TopK
from gvq.compressors.topk_chunk import ChunkTopK

PKG = Path(__file__).resolve().parents[2] / "gvq" / "compressors"
SHAPES = [torch.Size([16, 3, 3, 3]), torch.Size([16]), torch.Size([32, 16, 3, 3]), torch.Size([10, 32])]
N = 5000 + 123                                      # whole buckets and a ragged tail

SCALAR = {                                          # module -> instances (every knob that changes code paths)
    "base": [Compressor()],
    "qsgd": [QSGD(bits=4, norm="max"), QSGD(levels=5)],
    "terngrad": [TernGrad(), TernGrad(clip=2.5)],
    "signsgd": [ScaledSignSGD()],
    "linear": [Linear()],
    "orq": [ORQ(levels=5), ORQ(levels=17)],
    "bingrad_pb": [BinGradPB()],
    "bingrad_b": [BinGradB()],
    "fp16": [FP16()],
    "efsignsgd": [EFSignSGD(), EFSignSGD("bucket")],
    "onebit": [OneBit(), OneBit("column").grouped([(109, 47)])],     # 109 x 47 = N
    "signum": [SignVote("int8"), SignVote("bits")],
    "randomk": [RandomK(), RandomK(scale=True)],
    "natural": [Natural()],
    "topk": [TopK(), TopK(scope="bucket", values="float16", indices="packed"), TopK(scope="global"),
             TopK(ratio=0.05).grouped([(109, 47)])],
    "topk_chunk": [ChunkTopK()],
    "dgc": [DGC(ratio=0.01), DGC(ratio=0.01).grouped([(109, 47)])],
}
DEVICES = ["meta", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device visible")])]


def test_every_compressor_module_is_covered():
    files = {p.stem for p in PKG.glob("*.py") if not p.name.startswith("_")}
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    assert files | packages == set(SCALAR) | {"powersgd", "gradiveq"}     # the helpers (_*.py) run inside


def _data(device: str, n: int) -> torch.Tensor:
    if device == "meta":
        return torch.empty(n, device="meta")
    return torch.distributions.Laplace(0.0, 1.0).sample((n,)).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("codec", [c for cs in SCALAR.values() for c in cs], ids=lambda c: c.name)
def test_scalar_codecs_stay_on_the_inputs_device(codec, device):
    seg, x = slice(0, N), _data(device, N)
    payload = codec.compress(x, seg)
    out = codec.decompress(payload, seg)
    assert payload.device.type == out.device.type == device
    assert (payload.dtype, payload.numel()) == (codec.payload_spec(seg)[0], codec.payload_spec(seg)[1])
    assert out.shape == (N,)
    if device == "cuda" and not getattr(codec, "stochastic", False):          # same codes as the host's
        host = codec.decompress(codec.compress(x.cpu(), seg), seg)
        torch.testing.assert_close(out.cpu(), host, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("basis_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("pool", [False, True])
def test_gradiveq_fits_and_codes_on_the_inputs_device(device, basis_dtype, pool):
    codec = GradiVeQ(K="auto", basis_dtype=basis_dtype, pool=pool, world_size=2)
    codec.bind(SHAPES)
    n = codec.layout.numel
    codec.fit(_data(device, 6 * n).view(6, n))
    assert all(t.device.type == device for t in codec.pca.tensors())
    seg = slice(0, n)
    payload = codec.compress(_data(device, n), seg)
    out = codec.decompress(payload + payload, seg)                 # summed in the compressed domain
    assert payload.device.type == out.device.type == device and out.shape == (n,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("warm_start", [True, False])
def test_powersgd_passes_stay_on_the_inputs_device(device, warm_start):
    state = PowerSGD(SHAPES, rank=2, min_compression_rate=2.0, warm_start=warm_start)
    seg, x = slice(0, state.numel), _data(device, state.numel)
    state.begin()
    p = state.p_stage.compress(x, seg)
    state.p_stage.decompress(p + p, seg)
    q = state.q_stage.compress(x, seg)
    out = state.q_stage.decompress(q + q, seg)
    assert p.device.type == q.device.type == out.device.type == device
    assert all(m.device.type == device for m in state.q.values())   # Q kept with the gradient


@pytest.mark.parametrize("device", DEVICES)
def test_state_resumed_on_the_host_follows_the_data_to_its_device(device):
    """A checkpoint loads on the host; the next call on a device tensor draws its dither there (on CUDA from
    the device's own generator, seeded from the checkpoint's), not from host state mixed with device data;
    and a resume is a resume there too: the same checkpoint draws the same numbers, and the state saved
    after a device call resumes the next one."""
    x, seg = torch.randn(5000), slice(0, 5000)
    host = QSGD(bits=4)
    host.compress(x, seg)                                   # lanes drawn on the host

    def resumed(state: dict) -> QSGD:
        q = QSGD(bits=4)
        q.load_state_dict(state)
        return q

    first = resumed(host.state_dict())
    out = first.compress(x.to(device), seg)
    assert out.device.type == torch.device(device).type
    if torch.device(device).type == "meta":                # meta tensors draw nothing
        return
    torch.testing.assert_close(resumed(host.state_dict()).compress(x.to(device), seg).cpu(), out.cpu())
    saved = first.state_dict()
    follow = first.compress(x.to(device), seg)
    assert not torch.equal(follow.cpu(), out.cpu())        # fresh randomness every call
    torch.testing.assert_close(resumed(saved).compress(x.to(device), seg).cpu(), follow.cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ["fit", "resume", "restricted"])
def test_gradiveq_fitted_on_the_host_follows_the_gradient_to_its_device(device, path):
    """A fit relayed through the host, a checkpoint loaded on the CPU, a bucket's restricted codec, then a
    gradient on ``device``: every tensor the codec holds moves there before it mixes with the gradient
    (on meta, a host tensor left behind raises, as a host mean added to a CUDA gradient did)."""
    host = GradiVeQ(K="auto", world_size=2)
    host.bind(SHAPES)
    n = host.layout.numel
    host.fit(torch.randn(6, n))
    codec = host
    if path == "resume":
        codec = GradiVeQ(K="auto", world_size=2)
        codec.load_state_dict(host.state_dict())
    elif path == "restricted":
        codec = host.restricted_to([2, 3])
        n = codec.layout.numel
    g, seg = _data(device, n), slice(0, n)
    codec.track(g)
    payload = codec.compress(g, seg)
    out = codec.decompress(payload, seg)
    assert {d.type for d in codec.devices()} == {torch.device(device).type}
    assert payload.device.type == out.device.type == torch.device(device).type
    if device != "meta":
        torch.testing.assert_close(out.cpu(), host.restricted_to([2, 3]).decompress(
            host.restricted_to([2, 3]).compress(g.cpu(), seg), seg) if path == "restricted"
            else host.decompress(host.compress(g.cpu(), seg), seg), rtol=1e-4, atol=1e-5)
