"""Issue 48's op budget: every codec call a fixed few whole-tensor ops with no host sync, counted on CPU
tensors with the fused host kernels off (the path CUDA runs), on ResNet-20's and ResNet-110's gradients:
the count must not grow with depth (more layers, more buckets) and must stay within the budget.  The
fitted quantizers' torch path stays over it; on CUDA they take fused Triton kernels, held here to issue
61's budget in launches instead."""
from __future__ import annotations

import os

import pytest
import torch

from gvq.bench.codecs import GRADIVEQ, fitted_gradiveq, powersgd_state
from gvq.bench.common import make_aggregator, model_shapes
from gvq.bench.opcount import BUDGET, count_call, count_ops
from gvq.bench.quantizers import laplace_vector
from gvq.compressors._kernels import count_launches

WITHIN = ["fp16", "qsgd", "terngrad", "terngrad_unclipped", "signsgd", *GRADIVEQ]
#: over the op budget on their torch path (issue 48: the fits are chains of dependent rounds, ORQ's
#: halvings, Lloyd's, each tens of small ops); within issue 61's on their Triton path, in launches
FITTED = ["orq", "linear", "bingrad_b", "bingrad_pb"]
#: what the torch path of a fitted quantizer may not do even so: read a value back to the host inside a call
NO_SYNCS = FITTED
#: the other codecs with a Triton path held to issue 61's launch budget (gvq/compressors/_triton_grace.py)
GRACE_KERNELS = ["topk", "natural"]
LAUNCH_BUDGET = {"compress": 3, "decompress": 2}     # issue 61: kernel launches a call on the Triton path


@pytest.fixture(autouse=True)
def torch_path(monkeypatch):
    monkeypatch.setenv("GVQ_FUSED", "0")


@pytest.fixture(scope="module")
def shapes():
    return {model: model_shapes(model, 100) for model in ("resnet20", "resnet110")}


def _powersgd_counts(shapes) -> dict:
    """Both passes of PowerSGD (P: M Q, decoded by QR; Q: M^T P^, decoded into P^ Q^T), whole gradient
    and a middle segment of whole blocks."""
    state = powersgd_state(shapes, torch.device("cpu"))[0]
    n = state.numel
    x = laplace_vector(n)
    cuts = state.cuts()
    out = {}
    for label, seg in (("whole", slice(0, n)), ("segment", slice(cuts[len(cuts) // 3], cuts[2 * len(cuts) // 3]))):
        state.begin()
        xs = x[seg]
        for stage in (state.p_stage, state.q_stage):
            payload = stage.compress(xs, seg)
            out[f"{stage.name} compress {label}"] = count_call(lambda: stage.compress(xs, seg))
            out[f"{stage.name} decompress {label}"] = count_call(lambda: stage.decompress(payload, seg))
    return out


def _counts(name: str, shapes) -> dict:
    """Ops of one compress and one decompress of the whole gradient, and of a ring's middle segment (a
    segment that cuts groups and layers where the codec allows)."""
    if name in GRADIVEQ:
        comp = fitted_gradiveq(name, shapes, torch.device("cpu"), L=12, timed=False)[0]
    else:
        comp = make_aggregator(name, []).compressor
    n = sum(int(torch.Size(s).numel()) for s in shapes)
    x = laplace_vector(n)
    cuts = comp.cuts(n)
    out = {}
    for label, seg in (("whole", slice(0, n)), ("segment", slice(cuts[len(cuts) // 3], cuts[2 * len(cuts) // 3]))):
        xs = x[seg]
        payload = comp.compress(xs, seg)
        out[f"compress {label}"] = count_call(lambda: comp.compress(xs, seg))
        out[f"decompress {label}"] = count_call(lambda: comp.decompress(payload, seg))
    return out


def _all_counts(name, shapes) -> dict:
    return _powersgd_counts(shapes) if name == "powersgd" else _counts(name, shapes)


def _check(name, shapes):
    small, deep = (_all_counts(name, shapes[m]) for m in ("resnet20", "resnet110"))
    budget = BUDGET[name.split("_")[0] if name.startswith("gradiveq") else name]
    for part in small:                  # a segment's count depends on which shapes it holds, not on depth
        if "whole" in part:
            assert deep[part].ops == small[part].ops, f"{name} {part}: ops grow with depth"
        assert deep[part].ops <= budget and deep[part].syncs == 0, f"{name} {part} (deep): {dict(deep[part].by_name)}"
        assert small[part].syncs == 0, f"{name} {part}: host syncs {dict(small[part].by_name)}"
        assert small[part].ops <= budget, f"{name} {part}: {small[part].ops} ops: {dict(small[part].by_name)}"


@pytest.mark.parametrize("name", WITHIN)
def test_codec_calls_are_a_fixed_few_ops_without_host_syncs(name, shapes):
    _check(name, shapes)


def _launches(name: str, shapes) -> dict:
    """Triton launches of one compress and one decompress, whole gradient and a ring's middle segment,
    counted without running the kernels (the interpreter would take minutes over a whole model)."""
    comp = make_aggregator(name, []).compressor
    comp.kernels = "triton"             # before its first call, which chooses the path for good
    n = sum(int(torch.Size(s).numel()) for s in shapes)
    x = laplace_vector(n).to("cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda")
    cuts = comp.cuts(n)
    out = {}
    for label, seg in (("whole", slice(0, n)), ("segment", slice(cuts[len(cuts) // 3], cuts[2 * len(cuts) // 3]))):
        with count_launches(run=False) as c:
            payload = comp.compress(x[seg], seg)
        with count_launches(run=False) as d:
            comp.decompress(payload, seg)
        out[f"compress {label}"], out[f"decompress {label}"] = c, d
    return out


@pytest.mark.parametrize("name", FITTED + GRACE_KERNELS)
def test_fitted_quantizers_within_the_launch_budget_on_the_triton_path(name, shapes):
    """At most 3 launches a compress and 2 a decompress, the same at both depths (a program per bucket,
    not a launch per bucket or per layer)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("neither Triton's interpreter (TRITON_INTERPRET=1) nor a CUDA device")
    small, deep = (_launches(name, shapes[m]) for m in ("resnet20", "resnet110"))
    for part, tally in deep.items():
        assert tally.launches == small[part].launches, f"{name} {part}: launches grow with depth"
        assert 1 <= tally.launches <= LAUNCH_BUDGET[part.split()[0]], f"{name} {part}: {tally.by_name}"


#: the low-rank codecs on their Triton path, by kernel a call: GEMMs stay torch's, the chains between them fused
LOW_RANK_LAUNCHES = {"gradiveq": {"compress": {"lay_out": 1}, "decompress": {"lay_out": 1}},
                     "powersgd-P": {"compress": {}, "decompress": {"unpack_p": 1, "shift_gram": 1}},
                     "powersgd-Q": {"compress": {}, "decompress": {"shift_gram": 1, "keep_q": 1}}}


def _low_rank_launches(name: str, shapes) -> dict:
    """Triton launches by kernel of a GradiVeQ setting's calls, or of both PowerSGD passes, on a whole
    gradient and a ring's middle segment, counted without running the kernels."""
    device = torch.device("cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda")
    if name == "powersgd":
        comp = powersgd_state(shapes, device)[0]
        stages, n = (comp.p_stage, comp.q_stage), comp.numel
        comp.begin()
    else:
        comp = fitted_gradiveq(name, shapes, device, L=12, timed=False)[0]
        stages, n = (comp,), comp.layout.numel
    comp.kernels = "triton"             # before its first call, which chooses the path for good
    x, cuts = laplace_vector(n).to(device), stages[0].cuts(n)
    out = {}
    for label, seg in (("whole", slice(0, n)), ("segment", slice(cuts[len(cuts) // 3], cuts[2 * len(cuts) // 3]))):
        for stage in stages:
            with count_launches(run=False) as c:
                payload = stage.compress(x[seg], seg)
            with count_launches(run=False) as d:
                stage.decompress(payload, seg)
            out[(stage.name, label)] = {"compress": c.by_name, "decompress": d.by_name}
    return out


@pytest.mark.parametrize("name", ["gradiveq", "gradiveq_bf16", "powersgd"])
def test_low_rank_codecs_launch_a_fixed_few_on_the_triton_path(name, shapes):
    """GradiVeQ one launch a call each way, PowerSGD none to compress and two to decompress a pass, at
    both depths, whole or a segment (a program per block of values, not a launch per layer)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("neither Triton's interpreter (TRITON_INTERPRET=1) nor a CUDA device")
    for model in ("resnet20", "resnet110"):
        for (stage, label), got in _low_rank_launches(name, shapes[model]).items():
            assert got == LOW_RANK_LAUNCHES[stage], f"{name} {stage} {label} ({model}): {got}"


def test_powersgd_passes_are_a_fixed_few_ops_without_host_syncs(shapes):
    """One gather, one GEMM (and QR) per shape class, one put-back: ResNets have seven classes at any depth."""
    _check("powersgd", shapes)


@pytest.mark.parametrize("name", NO_SYNCS)
def test_codecs_over_the_budget_still_never_read_back_to_the_host(name, shapes):
    """The fitted quantizers' torch path is over the op budget but none waits for the device inside a call (BinGrad-b's
    Lloyd rounds are composed on the device, not tested for convergence on the host)."""
    for part, tally in _all_counts(name, shapes["resnet20"]).items():
        assert tally.syncs == 0, f"{name} {part}: {dict(tally.by_name)}"


def test_the_counter_sees_ops_and_host_syncs():
    """The counter itself: an op per aten call, a sync where a value is read back (which would make a
    budget test blind if it counted nothing)."""
    x = torch.randn(100)
    with count_ops() as c:
        y = x * 2
        float(y.sum())
    assert c.ops == 3 and c.syncs == 1
