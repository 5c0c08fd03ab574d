"""Issue 48's op budget: every codec call a fixed few whole-tensor ops with no host sync, counted on CPU
tensors with the fused host kernels off (the path CUDA runs), on ResNet-20's and ResNet-110's gradients:
the count must not grow with depth (more layers, more buckets) and must stay within the budget."""
from __future__ import annotations

import pytest
import torch

from gvq.bench.common import make_aggregator, model_shapes
from gvq.bench.opcount import BUDGET, count_call, count_ops
from gvq.bench.quantizers import laplace_vector

WITHIN = ["fp16", "qsgd", "terngrad", "signsgd"]
#: not yet within budget (issue 48 open): strict, so a codec brought within it must move to WITHIN
PENDING = ["orq", "linear", "bingrad_b", "bingrad_pb"]


@pytest.fixture(autouse=True)
def torch_path(monkeypatch):
    monkeypatch.setenv("GVQ_FUSED", "0")


@pytest.fixture(scope="module")
def gradients():
    out = {}
    for model in ("resnet20", "resnet110"):
        n = sum(int(torch.Size(s).numel()) for s in model_shapes(model, 100))
        out[model] = laplace_vector(n)
    return out


def _counts(name: str, x: torch.Tensor) -> dict:
    comp = make_aggregator(name, []).compressor
    seg = slice(0, x.numel())
    payload = comp.compress(x, seg)
    return {"compress": count_call(lambda: comp.compress(x, seg)),
            "decompress": count_call(lambda: comp.decompress(payload, seg))}


def _check(name, gradients):
    small, deep = (_counts(name, gradients[m]) for m in ("resnet20", "resnet110"))
    for part in ("compress", "decompress"):
        assert deep[part].ops == small[part].ops, f"{name} {part}: ops grow with depth"
        assert small[part].syncs == 0, f"{name} {part}: host syncs {dict(small[part].by_name)}"
        assert small[part].ops <= BUDGET[name], f"{name} {part}: {small[part].ops} ops: {dict(small[part].by_name)}"


@pytest.mark.parametrize("name", WITHIN)
def test_codec_calls_are_a_fixed_few_ops_without_host_syncs(name, gradients):
    _check(name, gradients)


@pytest.mark.parametrize("name", PENDING)
@pytest.mark.xfail(strict=True, reason="issue 48: the fitted quantizers still loop (histogram rounds, "
                   "Lloyd steps) and read bucket bounds back to the host")
def test_fitted_quantizers_within_the_budget(name, gradients):
    _check(name, gradients)


def test_the_counter_sees_ops_and_host_syncs():
    """The counter itself: an op per aten call, a sync where a value is read back (which would make a
    budget test blind if it counted nothing)."""
    x = torch.randn(100)
    with count_ops() as c:
        y = x * 2
        float(y.sum())
    assert c.ops == 3 and c.syncs == 1
