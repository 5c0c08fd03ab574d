"""Top-k (gvq/compressors/topk.py): exactly the k largest |v| per scope, copied bit for bit, ties to the
lower index, and a payload of the declared size in either index format."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from gvq.compressors.topk import TopK

BLOCKS = (54, 6, 270, 5, 1, 300)           # a conv weight, a bias, ... : unequal scopes (the sorted path)
N = sum(BLOCKS)


def _scopes(codec: TopK, n: int) -> list[tuple[int, int]]:
    """Each scope's (start, stop), as the knobs define them (not as the codec plans them)."""
    if codec.scope == "global":
        return [(0, n)]
    if codec.scope == "bucket":
        return [(a, min(a + codec.bucket, n)) for a in range(0, n, codec.bucket)]
    ends = [0]
    for b in BLOCKS:
        ends.append(ends[-1] + b)
    return list(zip(ends, ends[1:]))


def _reference(x: torch.Tensor, lo: int, hi: int, k: int) -> set[int]:
    """The k largest |v| of x[lo:hi], lower index first among equal |v|: a plain sort of (-|v|, index)."""
    order = sorted(range(lo, hi), key=lambda i: (-abs(float(x[i])), i))
    return set(order[:k])


CODECS = [dict(scope="tensor"), dict(scope="bucket", bucket=64), dict(scope="bucket", bucket=100),
          dict(scope="global")]


@pytest.mark.parametrize("indices", ["int32", "packed"])
@pytest.mark.parametrize("knobs", CODECS, ids=lambda k: "-".join(str(v) for v in k.values()))
@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.5, 1.0])
def test_topk_keeps_exactly_the_k_largest_per_scope_and_copies_them_bit_exactly(knobs, ratio, indices):
    g = torch.Generator().manual_seed(3)
    # rounded to a few levels, so that many values tie in |v| (and in sign-flipped pairs)
    x = (torch.randn(N, generator=g) * 4).round() / 4
    x[100:140] = 0.0
    codec = TopK(ratio=ratio, indices=indices, **knobs).grouped([(b,) for b in BLOCKS])
    seg = slice(0, N)
    payload = codec.compress(x, seg)
    assert payload.dtype == torch.uint8 and payload.numel() == codec.payload_spec(seg)[1]
    y = codec.decompress(payload, seg)
    kept = set(torch.nonzero(y).flatten().tolist())
    want = set()
    for lo, hi in _scopes(codec, N):
        want |= _reference(x, lo, hi, max(1, math.floor(ratio * (hi - lo))))
    got = set(codec.unpack(payload, seg)[0].tolist())
    assert got == want                                     # the set: exact, ties to the lower index
    assert kept <= got                                     # a kept zero decodes as zero
    assert torch.equal(y[list(got)].view(torch.int32), x[list(got)].view(torch.int32))    # bit-exact
    off = torch.ones(N, dtype=torch.bool)
    off[list(got)] = False
    assert bool((y[off] == 0).all())


def test_ties_go_to_the_lower_index_where_torch_topk_alone_may_not():
    x = torch.tensor([1.0, 3.0, 3.0, 3.0, 0.5, -3.0])
    for scope in ("global", "tensor"):
        codec = TopK(ratio=0.34, scope=scope).grouped([(b,) for b in (6,)])       # k = 2 of 6
        pos, _ = codec.unpack(codec.compress(x, slice(0, 6)), slice(0, 6))
        assert sorted(pos.tolist()) == [1, 2]
    codec = TopK(ratio=0.5, scope="tensor").grouped([(b,) for b in (2, 4)])       # sorted path: k = 1, then 2
    pos, _ = codec.unpack(codec.compress(x, slice(0, 6)), slice(0, 6))
    assert sorted(pos.tolist()) == [1, 2, 3]


def test_a_segment_of_the_vector_takes_its_share_of_the_parameters_scopes():
    """A ring segment cuts parameters: each piece inside it is a scope of its own."""
    codec = TopK(ratio=0.1, scope="tensor").grouped([(b,) for b in BLOCKS])
    seg = slice(50, 400)                     # 4 values of the first block, all of 6 and 270, 70 of 300
    plan = codec.plan(seg)
    assert plan.starts == [0, 4, 10, 280, 285, 286][:len(plan.starts)] and plan.n == 350
    assert plan.ks == [1, 1, 27, 1, 1, 6]
    x = torch.randn(N)
    y = codec.decompress(codec.compress(x[seg], seg), seg)
    assert int((y != 0).sum()) == sum(plan.ks)


def test_float16_values_round_as_float16():
    x = torch.randn(N) * 1e-2
    seg = slice(0, N)
    full, half = (TopK(ratio=0.2, values=v).grouped([(b,) for b in BLOCKS]) for v in ("float32", "float16"))
    a, b = full.decompress(full.compress(x, seg), seg), half.decompress(half.compress(x, seg), seg)
    assert torch.equal(b, a.to(torch.float16).to(torch.float32))
    assert torch.equal(a != 0, b != 0)
    k = full.plan(seg).k
    assert full.payload_spec(seg)[1] - half.payload_spec(seg)[1] == 2 * k


@pytest.mark.parametrize("knobs", CODECS, ids=lambda k: "-".join(str(v) for v in k.values()))
def test_packed_indices_decode_equal_to_int32_ones_and_save_the_expected_bytes(knobs):
    x = torch.randn(N)
    seg = slice(0, N)
    wide, packed = (TopK(ratio=0.1, indices=i, **knobs).grouped([(b,) for b in BLOCKS]) for i in ("int32", "packed"))
    pw, pp = wide.compress(x, seg), packed.compress(x, seg)
    assert torch.equal(wide.unpack(pw, seg)[0], packed.unpack(pp, seg)[0])
    assert torch.equal(wide.decompress(pw, seg), packed.decompress(pp, seg))
    plan = packed.plan(seg)
    longest = max(b - a for a, b in _scopes(packed, N))
    bits = max(1, math.ceil(math.log2(longest)))
    assert plan.bits == bits
    # ceil(log2 L) bits an index, back to back: 4k bytes of int32 become ceil(k * bits / 8)
    assert pw.numel() - pp.numel() == 4 * plan.k - math.ceil(plan.k * bits / 8)


def test_bytes_are_k_values_plus_k_indices():
    codec = TopK(ratio=0.01, scope="global")
    seg = slice(0, 100_000)
    assert codec.payload_spec(seg) == (torch.uint8, 8 * 1000)     # 8k: GRACE's logged volume
    assert codec.ratio(100_000) == pytest.approx(4 * 100_000 / 8000)


def test_an_empty_segment_has_an_empty_payload():
    codec = TopK(ratio=0.5).grouped([(b,) for b in (4,)])
    seg = slice(4, 4)
    assert codec.payload_spec(seg) == (torch.uint8, 0)
    assert codec.decompress(codec.compress(torch.zeros(0), seg), seg).numel() == 0


@pytest.mark.parametrize("knob,value,match", [
    ("ratio", 0.0, "ratio=0.0"), ("ratio", 1.5, "ratio=1.5"), ("ratio", True, "ratio=True"),
    ("scope", "layer", "scope='layer'"), ("values", "bf16", "values='bf16'"), ("indices", "int8", "indices"),
    ("bucket", 0, "bucket=0"),
])
def test_a_bad_knob_is_refused_in_one_line_naming_it(knob, value, match):
    with pytest.raises(ValueError, match=match) as e:
        TopK(**{knob: value})
    assert "\n" not in str(e.value)


def _sorted_selection(codec: TopK, x: torch.Tensor, seg: slice) -> torch.Tensor:
    """The selection as the sorted path made it before the row-batches (one stable sort of (scope, -|v|) keys,
    the first k of each scope): the reference every scope's path must equal, position for position."""
    plan = codec.plan(seg)
    lengths = [b - a for a, b in zip(plan.starts, plan.starts[1:] + [plan.n])]
    scope_of = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    bits = x.reshape(-1).to(torch.float32).abs().view(torch.int32).to(torch.int64)
    order = torch.sort((scope_of << 31) + (1 << 31) - 1 - bits, stable=True).indices
    return order[torch.cat([torch.arange(k) + a for a, k in zip(plan.starts, plan.ks)])]


def _layout(g: torch.Generator, distinct: int) -> list[int]:
    """Parameter sizes: a few lengths repeated (a model's layers) among odd ones, ``distinct`` lengths at most."""
    pool = [1, 2, 3, 7, 16, 64, 100, 300, 1000, 4096] + [int(v) for v in torch.randint(5, 900, (40,), generator=g)]
    pool = pool[:distinct]
    return [pool[int(i)] for i in torch.randint(len(pool), (60,), generator=g)]


SELECTIONS = [dict(scope="tensor"), dict(scope="global"), dict(scope="bucket", bucket=1024),
              dict(scope="bucket", bucket=1000)]        # 1000: blocks cannot tile its rows


@pytest.mark.parametrize("distinct", [3, 10, 50])        # 50: more lengths than batches, rounded to powers of 2
@pytest.mark.parametrize("seed", range(3))
def test_the_row_batches_select_what_one_stable_sort_selects_in_its_order(seed, distinct):
    g = torch.Generator().manual_seed(seed)
    blocks = _layout(g, distinct)
    n = sum(blocks)
    x = torch.randint(-3, 4, (n,), generator=g).float() / 4          # 7 levels: ties everywhere, many zeros
    x[torch.randint(n, (3,), generator=g)] = float("nan")               # NaN ranks above every number
    for ratio, knobs in itertools.product((0.002, 0.01, 0.3, 1.0), SELECTIONS):
        codec = TopK(ratio=ratio, **knobs).grouped([(b,) for b in blocks])
        for seg in (slice(0, n), slice(n // 3, n - 5)):               # a ring segment cuts two tensors
            got = codec.select(x[seg], seg)
            assert torch.equal(got, _sorted_selection(codec, x[seg], seg)), (ratio, knobs, seg)
    assert len(TopK(ratio=0.01).grouped([(b,) for b in blocks]).plan(slice(0, n)).batches) <= 24
