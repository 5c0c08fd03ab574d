"""CUDA graphs around GradiVeQ's device path (gvq/compressors/_graphs.py): replayed calls equal eager ones,
a capture the driver refuses falls back with one warning; on the host nothing is captured."""
from __future__ import annotations

import pytest
import torch

from gvq.compressors._graphs import Graphed
from gvq.compressors.base import split_on_cuts
from gvq.compressors.gradiveq.codec import GradiVeQ

SHAPES = [(16, 3, 3, 3), (16,), (16, 16, 3, 3), (32, 16, 3, 3), (32, 32, 3, 3), (10, 32), (10,)]



def test_on_the_host_the_call_runs_as_it_is():
    calls = []
    g = Graphed(lambda x: calls.append(1) or x * 2, "test")
    x = torch.randn(10)
    torch.testing.assert_close(g(x), x * 2)
    assert calls == [1] and g.captured is None and not g.refused


@pytest.mark.parametrize("basis_dtype", ["float32", "bfloat16"])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")
def test_gradiveq_replayed_equals_eager_on_cuda(basis_dtype, monkeypatch):
    monkeypatch.setenv("GVQ_FUSED", "0")
    comp = GradiVeQ(world_size=2, basis_dtype=basis_dtype).bind(SHAPES)
    n = comp.layout.numel
    comp.fit(torch.randn(8, n, device="cuda"))
    g = torch.randn(n, device="cuda")
    segs = split_on_cuts(comp.cuts(n), 3)
    out = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("GVQ_CUDA_GRAPHS", flag)
        for _ in range(3):                              # capture, then replays
            pays = [comp.compress(g[s], s) for s in segs]
            outs = [comp.decompress(p, s) for p, s in zip(pays, segs)]
        out[flag] = pays + outs
    for a, b in zip(out["0"], out["1"]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(out["1"], out["1"][1:]))   # fresh tensors


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")
def test_a_refused_capture_falls_back_to_the_eager_call():
    g = Graphed(lambda x: x * float(x.sum()), "a host read")       # a sync cannot be captured
    x = torch.ones(4, device="cuda")
    with pytest.warns(RuntimeWarning, match="CUDA graph refused"):
        torch.testing.assert_close(g(x), x * 4)
    assert g.refused
    torch.testing.assert_close(g(x), x * 4)
