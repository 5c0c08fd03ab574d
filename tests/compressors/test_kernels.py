"""The one kernel pattern (gvq/compressors/_kernels.py): every codec's path is chosen by ``_kernels.choose_path``
from its ``kernels`` knob, once per device; ``kernels=torch`` is the torch reference on the host as well
(no numba kernel runs); ``GVQ_FUSED`` is read in that one function only."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from gvq.aggregators.error_feedback import ErrorFeedback
from gvq.compressors import _fused, _kernels
from gvq.compressors.fp16 import FP16
from gvq.compressors.linear import Linear
from gvq.compressors.powersgd import PowerSGD
from gvq.compressors.qsgd import QSGD
from gvq.compressors.terngrad import TernGrad

ROOT = Path(__file__).resolve().parents[2]
CODECS = {"qsgd": QSGD, "terngrad": TernGrad, "linear": Linear, "fp16": FP16}


@pytest.mark.parametrize("name", list(CODECS))
@pytest.mark.parametrize("knob,want", [("auto", "host"), ("torch", "torch")])
def test_every_codec_asks_choose_path_once_per_device(name, knob, want, monkeypatch):
    asked = []
    real = _kernels.choose_path
    monkeypatch.setattr(_kernels, "choose_path", lambda *a, **k: asked.append(a) or real(*a, **k))
    comp, x = CODECS[name](kernels=knob), torch.randn(5000)
    for _ in range(2):
        comp.decompress(comp.compress(x, slice(0, 5000)), slice(0, 5000))
    assert asked == [(knob, torch.device("cpu"))]
    assert comp.path(torch.device("cpu")) == (TORCH_ONLY.get(name, want))


TORCH_ONLY = {"fp16": "torch"}      # no host kernels: the host runs its torch reference


def test_low_rank_paths_and_the_error_memory_go_through_choose_path(monkeypatch):
    asked = []
    monkeypatch.setattr(_kernels, "choose_path", lambda *a, **k: asked.append(k) or "torch")
    lr = PowerSGD([(8, 4)], 2, 1.0, True, kernels="auto")
    assert lr.path(torch.device("cpu")) == "torch" and lr.path(torch.device("cpu")) == "torch"
    ErrorFeedback(10, torch.float32, "cpu", kernels="auto")
    assert asked == [{"host": False}, {"host": False}]


def test_kernels_torch_runs_no_numba_kernel_on_the_host(monkeypatch):
    """The fused kernels are the host path's only: with ``kernels=torch`` none is called."""
    for fn in ("pack_words", "lcg_step", "scale_dither_floor", "encode_linear", "encode_orq"):
        monkeypatch.setattr(_fused, fn, lambda *a, **k: pytest.fail("a numba kernel ran"))
    x = torch.randn(9000)
    for comp in (QSGD(kernels="torch"), TernGrad(kernels="torch"), Linear(kernels="torch"),
                 QSGD(bits=5, kernels="torch")):
        comp.decompress(comp.compress(x, slice(0, 9000)), slice(0, 9000))


def test_auto_on_the_host_runs_the_numba_kernels(monkeypatch):
    ran = []
    real = _fused.scale_dither_floor
    monkeypatch.setattr(_fused, "scale_dither_floor", lambda *a: ran.append(1) or real(*a))
    QSGD(kernels="auto").compress(torch.randn(9000), slice(0, 9000))
    assert ran


def test_the_alias_gvq_fused_is_read_in_choose_path_only(monkeypatch):
    monkeypatch.setenv("GVQ_FUSED", "0")
    assert _kernels.choose_path("auto", torch.device("cpu")) == "torch"
    monkeypatch.delenv("GVQ_FUSED")
    assert _kernels.choose_path("auto", torch.device("cpu")) == "host"
    assert _kernels.choose_path("torch", torch.device("cpu")) == "torch"
    assert _kernels.choose_path("auto", torch.device("meta")) == "torch"
    readers = [p.relative_to(ROOT).as_posix() for p in (ROOT / "gvq").rglob("*.py")
               if re.search(r"environ\.get\(\"(GVQ_FUSED|TRITON_INTERPRET)\"", p.read_text())]
    assert readers == ["gvq/compressors/_kernels.py"]


def test_no_codec_branches_on_a_triton_flag_or_its_own_env():
    """The old ways are gone: no ``self.triton`` flags, no ``use_triton`` / ``fused.enabled`` probes."""
    old = re.compile(r"\b(self|work|lr)\.triton\b|_triton\b = |use_triton|fused\.enabled|_triton\.check_kernels")
    for p in (ROOT / "gvq").rglob("*.py"):
        assert p.name == "_kernels.py" or not old.search(p.read_text()), p     # there: Op's own field
