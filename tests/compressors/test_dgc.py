"""DGC's sparsifier (gvq/compressors/dgc.py): the count sent within [ceil(0.8 k), k] on Gaussian, Laplace and
t(3) vectors, the largest |v| among them copied bit for bit, 1-D tensors whole, the warm-up's ratios by
iteration and a payload of the declared size (top-k's layout, then the dense float32)."""
from __future__ import annotations

import math

import pytest
import torch

from gvq.compressors.dgc import DGC
from gvq.compressors.topk import TopK

N = 100_000
DISTS = {"gaussian": lambda g: torch.randn(N, generator=g),
         "laplace": lambda g: torch.empty(N).exponential_(generator=g) * (torch.rand(N, generator=g) - 0.5).sign(),
         "t3": lambda g: torch.randn(N, generator=g) / (torch.randn(3, N, generator=g).pow(2).mean(0)).sqrt()}


def _kept(codec: DGC, x: torch.Tensor) -> torch.Tensor:
    whole = slice(0, x.numel())
    return codec.decompress(codec.compress(x, whole), whole)


@pytest.mark.parametrize("ratio", [0.01, 0.001])
@pytest.mark.parametrize("dist", DISTS)
def test_the_count_sent_is_within_0_8k_and_k_and_is_the_largest_values_copied_exactly(dist, ratio):
    codec = DGC(ratio)
    k = max(1, math.floor(ratio * N))
    for it in range(4):                         # each iteration samples at another offset
        codec.begin_vector(0, it, 0)
        x = DISTS[dist](torch.Generator().manual_seed(10 * it + len(dist)))
        out = _kept(codec, x)
        sent = out != 0
        assert math.ceil(0.8 * k) <= int(sent.sum()) <= k
        assert torch.equal(out[sent], x[sent])                                  # copied bit for bit
        assert x[sent].abs().min() >= x[~sent].abs().max()                      # the largest of them


def test_the_sample_holds_at_least_2_over_r_values_and_a_small_scope_meets_the_bounds():
    """synxlin's sample size, max(ceil(sample n), ceil(2 / r)): never GRACE's single sampled maximum."""
    codec = DGC(0.01)
    x = torch.randn(3000, generator=torch.Generator().manual_seed(1))
    assert int(codec._const(slice(0, 3000), x.device)["valid"].sum()) == 200          # 30 by the fraction alone
    assert 24 <= int((_kept(codec, x) != 0).sum()) <= 30


def test_per_tensor_scopes_and_one_dimensional_tensors_sent_whole():
    shapes = [(20, 50), (20,), (300, 10), (7,)]
    n = sum(math.prod(s) for s in shapes)
    codec = DGC(0.01).grouped(shapes)
    x = torch.randn(n, generator=torch.Generator().manual_seed(2))
    whole = slice(0, n)
    payload = codec.compress(x, whole)
    assert payload.dtype == torch.uint8 and payload.numel() == codec.payload_nbytes(whole) == 8 * (10 + 30) + 4 * 27
    out = codec.decompress(payload, whole)
    dense = codec.dense_mask(whole, "cpu")
    assert torch.equal(dense.nonzero().flatten(), torch.cat([torch.arange(1000, 1020), torch.arange(4020, 4027)]))
    assert torch.equal(out[dense], x[dense])
    for lo, hi, k in ((0, 1000, 10), (1020, 4020, 30)):
        assert 0.8 * k <= int((out[lo:hi] != 0).sum()) <= k


def test_the_sparse_part_is_top_ks_payload():
    """The same bytes top-k would send for the candidates: one payload format for both sparsifiers."""
    codec = DGC(0.05)
    x = torch.randn(4000, generator=torch.Generator().manual_seed(3))
    whole = slice(0, 4000)
    topk = TopK(0.05).grouped([(1, 4000)])
    assert torch.equal(codec.compress(x, whole), topk.compress(codec.candidates(x, whole), whole))


def test_at_ratio_one_every_value_goes_through_the_sparse_path():
    codec = DGC(1.0).grouped([(50, 40)])
    x = torch.randn(2000, generator=torch.Generator().manual_seed(4))
    x[:5] = 0.0
    assert torch.equal(_kept(codec, x), x)


def test_the_warm_up_raises_the_sparsity_exponentially_by_iteration():
    codec = DGC(0.001, warmup_iters=10, warmup_stages=4)
    c = 0.001 ** (1 / 5)
    expected = [c, c ** 2, c ** 3, c ** 4]              # 25.1%, 6.3%, 1.58%, 0.398%: synxlin's README list
    for it in range(60):
        want = expected[it // 10] if it < 40 else 0.001
        assert codec.ratio_at(it) == pytest.approx(want, rel=1e-12)
    assert [round(codec.ratio_at(i), 3) for i in (0, 10, 20, 30, 40)] == [0.251, 0.063, 0.016, 0.004, 0.001]
    assert DGC(0.001).ratio_at(0) == 0.001                                # warmup_iters=0: r at once
    # the payload follows: its size is a function of the iteration said by begin_vector, on every view
    view = codec.grouped([(1000, 100)])
    for it, k in ((0, math.floor(c * 100_000)), (25, math.floor(c ** 3 * 100_000)), (45, 100)):
        codec.begin_vector(0, it, 0)
        assert view.payload_nbytes(slice(0, 100_000)) == 8 * k


@pytest.mark.parametrize("knobs,match", [(dict(ratio=0), "ratio"), (dict(sample=0), "sample"),
                                         (dict(warmup_iters=-1), "warmup_iters"),
                                         (dict(warmup_stages=0), "warmup_stages")])
def test_bad_knobs_are_refused_in_one_line(knobs, match):
    with pytest.raises(ValueError, match=match):
        DGC(**knobs)


def test_a_nan_in_the_input_is_caught_at_the_check_not_left_unsent_in_v():
    """A NaN fails DGC's threshold test, so it is never selected: without the health watch it would stay in
    v, unsent, and the run's NaN guard on the averaged gradient would never see it."""
    codec = DGC(ratio=0.1).grouped([(40, 5)])
    x = torch.randn(200, generator=torch.Generator().manual_seed(0))
    codec.compress(x, slice(0, 200))
    codec.check_health()                                 # finite: nothing raised
    x[7] = float("nan")
    codec.compress(x, slice(0, 200))
    with pytest.raises(ValueError, match="dgc: input gradient has NaN or Inf"):
        codec.check_health()
    codec.check_health()                                 # read once: the next check starts again
