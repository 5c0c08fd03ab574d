"""DGC's sparsifier (gvq/compressors/dgc.py): the count sent within [ceil(0.8 k), k] on Gaussian, Laplace and
t(3) vectors, the largest |v| among them copied bit for bit, 1-D tensors whole, the warm-up's ratios by
iteration and a payload of the declared size (top-k's layout, then the dense float32); and the one-search
threshold (``candidates``) against the loop it replaced (ten passes over the vector, gathers by advanced
indexing), kept here as the reference: the same candidates bit for bit, so the same payload (kept set, its
order, the bytes), on Gaussian, Laplace and t(3) vectors, with ties, zeros, inf and NaN, at several layouts,
segments, ratios and iterations."""
from __future__ import annotations

import math

import pytest
import torch

from gvq.compressors.dgc import DGC, LOW, SHRINK, TRIES
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


def test_without_a_layout_a_segment_past_the_start_is_one_whole_scope():
    """Its plan once placed the scope at 0, so a later segment's values were dropped (none sparse)."""
    codec = DGC(0.01)
    x = torch.randn(3000, generator=torch.Generator().manual_seed(5))
    seg = slice(1000, 3000)
    out = codec.decompress(codec.compress(x[seg], seg), seg)
    assert codec.payload_nbytes(seg) == 8 * 20 and 16 <= int((out != 0).sum()) <= 20
    assert x[seg][out != 0].abs().min() >= x[seg][out == 0].abs().max()


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


def _old_candidates(codec: DGC, xs: torch.Tensor, seg: slice) -> torch.Tensor:
    """The loop as it was (commit 69480dc): the sample from a padded copy, every try a pass over |v|."""
    tk = codec.plan(seg).topk.plan(slice(0, xs.numel()))
    lengths = [b - a for a, b in zip(tk.starts, tk.starts[1:] + [tk.n])]
    counts = [min(n, max(math.ceil(codec.sample * n), math.ceil(2 / codec.plan(seg).topk.r))) for n in lengths]
    pos = torch.full((len(lengths), max(counts, default=1)), tk.n, dtype=torch.long)
    for s, (start, n, c) in enumerate(zip(tk.starts, lengths, counts)):
        pos[s, :c] = start + torch.arange(c) * (n // c)
    ranks = torch.tensor([max(1, math.ceil(c * k / n)) - 1 for n, c, k in zip(lengths, counts, tk.ks)])
    stride = torch.tensor([n // c for n, c in zip(lengths, counts)])
    need = torch.tensor([math.ceil(LOW * k) for k in tk.ks])
    full = torch.tensor([k >= n for n, k in zip(lengths, tk.ks)])
    scope = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    a = xs.abs()
    padded = torch.cat([a, a.new_full((1,), -1.0)])
    offset = torch.remainder(codec._at[0] * 40503, stride)
    sample = padded[pos + offset[:, None] * (pos < tk.n).long()]
    top = torch.topk(sample, int(ranks.max()) + 1, dim=1).values
    thr = torch.where(full, 0.0, top.gather(1, ranks[:, None])[:, 0])[scope]
    level = torch.zeros_like(a, dtype=torch.long)
    for j in range(TRIES):
        level += a >= thr * SHRINK ** j
    hist = torch.zeros(len(lengths) * (TRIES + 1), dtype=torch.long)
    bins = scope * (TRIES + 1) + level
    hist.scatter_add_(0, bins, torch.ones_like(bins))
    count = hist.view(-1, TRIES + 1).flip(1).cumsum(1)[:, :TRIES]
    tries = (count < need[:, None]).sum(1).clamp(max=TRIES - 1)
    return torch.where(level >= (TRIES - tries)[scope], xs, 0.0)


def _old_compress(codec: DGC, x: torch.Tensor, seg: slice) -> torch.Tensor:
    plan = codec.plan(seg)
    xs = x[plan.sparse]
    sparse = plan.topk.compress(_old_candidates(codec, xs, seg), slice(0, xs.numel()))
    return torch.cat([sparse, x[plan.dense].view(torch.uint8)])


LAYOUTS = {"none": None, "one": [(60, 100)], "mixed": [(40, 50), (30,), (120, 25), (7,), (3, 3, 9), (10, 300)],
           "thin": [(2, 2), (5,), (8, 16), (1, 1)]}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dist", ["gaussian", "laplace", "t3"])
@pytest.mark.parametrize("ties", [False, True])
def test_the_one_search_sends_what_the_loop_sent(layout, dist, ties):
    shapes = LAYOUTS[layout]
    n = 6000 if shapes is None else sum(math.prod(s) for s in shapes)
    g = torch.Generator().manual_seed(len(dist) + 7 * len(layout) + ties)
    for ratio in (1.0, 0.05, 0.01, 0.001):
        codec = DGC(ratio) if shapes is None else DGC(ratio).grouped(shapes)
        for it, seg in enumerate((slice(0, n), slice(n // 3, n), slice(0, 2 * n // 3))):
            codec.begin_vector(0, 5 * it + 1, 0)
            x = DISTS[dist](g)[:n]
            if ties:        # a few magnitudes only: many |v| equal to each other and to a sampled threshold
                x = (x * 2).round() / 2
            x[3] = 0.0
            x = x[seg]
            whole = slice(seg.start, seg.stop)
            want = _old_compress(codec, x, whole)
            got = codec.compress(x, whole)
            assert got.numel() == want.numel() == codec.payload_nbytes(whole)
            assert torch.equal(got, want), (ratio, seg)


@pytest.mark.parametrize("ratio", [1.0, 0.01])
def test_inf_nan_and_a_vector_of_zeros_take_the_loops_candidates(ratio):
    """A NaN clears no threshold (nor does anything clear a NaN threshold); inf clears every finite one."""
    codec = DGC(ratio).grouped([(50, 40), (9,), (30, 30)])
    g = torch.Generator().manual_seed(11)
    for it, poison in enumerate((float("nan"), float("inf"), -float("inf"), 0.0)):
        codec.begin_vector(0, it, 0)
        x = torch.randn(2909, generator=g)
        x[torch.randint(0, 2909, (60,), generator=g)] = poison       # some land in the sample
        x[2009:2909] = 0.0 if poison == 0.0 else x[2009:2909]
        whole = slice(0, 2909)
        xs = x[codec.plan(whole).sparse]
        got, want = codec.candidates(xs, whole), _old_candidates(codec, xs, whole)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))              # bit for bit, NaN too
        assert torch.equal(codec.compress(x, whole), _old_compress(codec, x, whole))
