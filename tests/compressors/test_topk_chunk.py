"""SparseLoCo's chunked top-k (gvq/compressors/topk_chunk.py): top-k's per-bucket selection, 12-bit offsets
that round-trip, 2-bit values on the documented levels clipped at +-6 sigma, and the payload's byte count.
Then ``aggregator=topk_chunk`` (error feedback with decay 0.95, all-gathered): the mean is the mean of every
rank's decoded payload, the bytes logged are (N - 1) payloads each way, the memory follows
e' = (g + 0.95 e) - C(g + 0.95 e), and the option trains DiLoCo's LM and the CNN per step."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from gvq.aggregators.base import RunContext
from gvq.compressors import _packing
from gvq.compressors.topk import TopK
from gvq.compressors.topk_chunk import ChunkTopK
from tests.helpers.dist import run_ranks


def _reference(x: torch.Tensor, lo: int, hi: int, k: int) -> set[int]:
    order = sorted(range(lo, hi), key=lambda i: (-abs(float(x[i])), i))
    return set(order[:k])


@pytest.mark.parametrize("n,chunk,k", [(3 * 256 + 100, 256, 4), (4096 * 2 + 7, 4096, 64), (50, 64, 8)])
def test_the_kept_set_of_each_chunk_is_top_ks_of_its_bucket(n, chunk, k):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g)
    x[5:9] = 0.5                                                     # ties: the lower index wins
    seg = slice(0, n)
    codec = ChunkTopK(k=k, chunk=chunk)
    topk = TopK(ratio=k / chunk, scope="bucket", bucket=chunk, indices="packed")
    assert codec.plan(seg).ks == topk.plan(seg).ks
    kept = codec.select(x, seg)
    assert torch.equal(kept, topk.select(x, seg))
    y = codec.decompress(codec.compress(x, seg), seg)
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        want = _reference(x, lo, hi, max(1, k * (hi - lo) // chunk))
        assert set(torch.nonzero(y[lo:hi]).view(-1).add(lo).tolist()) == want, lo    # decoded levels are never 0


def test_12_bit_offsets_round_trip_and_lie_after_the_value_codes():
    codec = ChunkTopK()
    n = 3 * 4096
    x = torch.randn(n, generator=torch.Generator().manual_seed(1))
    x[4095] = x[2 * 4096] = 100.0                                    # offsets 4095 and 0 are kept
    seg = slice(0, n)
    payload = codec.compress(x, seg)
    plan = codec.plan(seg)
    assert plan.bits == 12 and plan.k == 3 * 64
    offsets = _packing.unpack_bits(payload[3 * 4 + 3 * 16:], 12, plan.k)
    local = codec.select(x, seg) % 4096
    assert torch.equal(offsets, local) and 4095 in offsets.tolist() and 0 in offsets.tolist()
    pos, _ = codec.unpack(payload, seg)
    assert torch.equal(pos, codec.select(x, seg))


def test_2_bit_values_decode_to_the_documented_levels_and_clip_at_6_sigma():
    """sigma = RMS of a chunk's kept values; levels +-1.5 sigma, +-4.5 sigma; beyond +-6 sigma clipped (a kept
    value can pass 6 sigma only where k > 36: |v| <= sqrt(k) sigma)."""
    chunk, k = 128, 64
    x = torch.zeros(2 * chunk)
    x[:chunk] = torch.randn(chunk, generator=torch.Generator().manual_seed(3)) * 3
    x[chunk: chunk + k] = 1.0
    x[chunk] = 400.0                                                 # one outlier beyond 6 sigma
    seg = slice(0, 2 * chunk)
    codec = ChunkTopK(k=k, chunk=chunk)
    y = codec.decompress(codec.compress(x, seg), seg)
    for lo in (0, chunk):
        kept = sorted(_reference(x, lo, lo + chunk, k))
        v = x[kept]
        sigma = float(v.pow(2).mean().sqrt())
        want = [(-4.5 if t < -3 else -1.5 if t < 0 else 1.5 if t < 3 else 4.5) * sigma for t in (v / sigma).tolist()]
        assert y[kept].tolist() == pytest.approx(want, rel=1e-6)
        assert {round(float(t) / sigma, 4) for t in y[kept]} <= {-4.5, -1.5, 1.5, 4.5}
    sigma2 = float(x[chunk: chunk + k].pow(2).mean().sqrt())
    assert 400.0 > 6 * sigma2 and float(y[chunk]) == pytest.approx(4.5 * sigma2, rel=1e-6)   # clipped


def test_an_all_zero_chunk_decodes_to_zeros():
    codec = ChunkTopK(k=4, chunk=32)
    x = torch.zeros(64)
    x[40] = 3.0
    seg = slice(0, 64)
    y = codec.decompress(codec.compress(x, seg), seg)
    assert torch.isfinite(y).all() and y[:32].abs().sum() == 0 and float(y[40]) == pytest.approx(1.5 * 1.5, rel=1e-6)


@pytest.mark.parametrize("k,bits,chunk", [(64, 2, 4096), (5, 2, 256), (7, 3, 100)])
def test_bytes_per_chunk_are_the_codes_the_offsets_and_one_sigma(k, bits, chunk):
    codec = ChunkTopK(k=k, chunk=chunk, bits=bits)
    ib = math.ceil(math.log2(chunk))
    one = slice(0, chunk)
    assert codec.payload_nbytes(one) == math.ceil(k * ib / 8) + math.ceil(k * bits / 8) + 4
    assert codec.compress(torch.randn(chunk), one).numel() == codec.payload_nbytes(one)
    m = 5 * chunk + chunk // 2                                       # the last chunk keeps its share
    seg = slice(0, m)
    kk = 5 * k + max(1, k * (chunk // 2) // chunk)
    assert codec.payload_nbytes(seg) == math.ceil(kk * ib / 8) + math.ceil(kk * bits / 8) + 4 * 6
    if k * bits % 8 == 0 and k * ib % 8 == 0:                        # whole bytes: exactly chunks x one chunk's
        assert codec.payload_nbytes(slice(0, 5 * chunk)) == 5 * codec.payload_nbytes(one)
    assert ChunkTopK().payload_nbytes(slice(0, 4096)) == 116


@pytest.mark.parametrize("knob,value,match", [("k", 0, "k=0"), ("k", 5000, "k=5000"), ("chunk", 1, "chunk=1"),
                                              ("bits", 0, "bits=0"), ("clip", 0.0, "clip=0.0")])
def test_a_bad_knob_is_refused_in_one_line_naming_it(knob, value, match):
    with pytest.raises(ValueError, match=match):
        ChunkTopK(**{knob: value})


# -- the option: error feedback, the all-gather, the launcher --------------------------------------------
SHAPES = ((6, 2, 3, 3), (6,), (5, 6, 3, 3), (10, 7), (10,))        # 464 values: 3 chunks of 128 and one of 80
KNOBS = {"compressor.k": 6, "compressor.chunk": 128}


def _grads(rank: int, it: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + it)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _rank(rank, world, iters=3):
    """Per iteration: this rank's decoded payload of g + 0.95 e, the mean, the bytes logged and the payload's."""
    from gvq.hooks.config import build_aggregator
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    agg = build_aggregator("topk_chunk", **KNOBS)
    agg.setup(params, RunContext(rank, world))
    out = []
    try:
        for it in range(iters):
            grads = _grads(rank, it)
            for p, g in zip(params, grads):
                p.grad.copy_(g)
            fed = torch.cat([g.reshape(-1) for g in grads]) + 0.95 * agg.feedback.memory
            codec = agg.codec_for(agg.everything)
            whole = slice(0, fed.numel())
            stats = agg.aggregate(it)
            out.append({"mine": codec.decompress(codec.compress(fed, whole), whole),
                        "mean": torch.cat([p.grad.reshape(-1) for p in params]),
                        "sent": stats["bytes_sent"], "received": stats["bytes_received"],
                        "payload": codec.payload_nbytes(whole)})
    finally:
        agg.close()
    return out


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request, tmp_path_factory):
    world = request.param
    return world, run_ranks(_rank, world, tmp_path_factory.mktemp(f"chunk{world}"))


@pytest.mark.slow
def test_the_allgather_mean_is_the_mean_of_every_ranks_decoded_payload(ranks):
    world, out = ranks
    for it in range(len(out[0])):
        want = sum(out[r][it]["mine"] for r in range(world)) / world
        for r in range(world):
            assert torch.allclose(out[r][it]["mean"], want, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_the_logged_bytes_are_the_wire_arithmetic(ranks):
    """One payload: 3 whole chunks and one of 80 values (k = 6 * 80 // 128 = 3): 21 kept values, 2-bit codes,
    7-bit offsets, one float32 sigma a chunk; a rank sends it to and receives one from each of N - 1 others."""
    world, out = ranks
    kept = 3 * 6 + 3
    payload = math.ceil(kept * 2 / 8) + math.ceil(kept * 7 / 8) + 4 * 4
    for r in range(world):
        for row in out[r]:
            assert row["payload"] == payload
            assert row["sent"] == row["received"] == (world - 1) * payload


def test_the_memory_decays_by_0_95_and_keeps_what_was_not_sent_by_hand():
    """The option's default beta: p = g + 0.95 e, t = C(p), e' = p - t, and the mean is t (one rank)."""
    from gvq.hooks.config import build_aggregator
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    agg = build_aggregator("topk_chunk", **KNOBS)
    agg.setup(params, RunContext(0, 1))
    try:
        assert agg.feedback.decay == 0.95
        codec = agg.codec_for(agg.everything)
        e = torch.zeros(sum(math.prod(s) for s in SHAPES))
        whole = slice(0, e.numel())
        for it in range(5):
            grads = _grads(0, it)
            for p, g in zip(params, grads):
                p.grad.copy_(g)
            agg.aggregate(it)
            p_ = torch.cat([g.reshape(-1) for g in grads]) + 0.95 * e
            t = codec.decompress(codec.compress(p_, whole), whole)
            assert torch.allclose(agg.transmitted, t, rtol=1e-6, atol=1e-6)
            assert torch.allclose(torch.cat([p.grad.reshape(-1) for p in params]), t, rtol=1e-6, atol=1e-6)
            e = p_ - t
            assert torch.allclose(agg.feedback.memory, e, rtol=1e-5, atol=1e-5)
        assert e.abs().max() > 0.1                                   # something was held back
    finally:
        agg.close()


@pytest.mark.slow
def test_the_option_trains_diloco_on_the_lm_and_logs_its_payload(tmp_path):
    from tests.helpers.launch import launch_job
    code, summary = launch_job(tmp_path, "experiment=lm_compare", "method=diloco", "aggregator=topk_chunk",
                               "method.every=2", "world_size=2", "iterations=4", "eval_every=4", "batch_size=4",
                               "logger.progress=false", "dataset.n_test=8")
    assert code == 0, summary
    assert math.isfinite(summary["final_test_loss"])
    df = pd.read_csv(tmp_path / "metrics.csv")
    synced = df[df.bytes_sent > 0]
    assert len(synced) == 2 and (synced.bytes_sent == synced.bytes_received).all()


@pytest.mark.slow
def test_the_option_trains_the_cnn_per_step(tmp_path):
    from tests.helpers.launch import launch_job
    code, summary = launch_job(tmp_path, "aggregator=topk_chunk", "logger=csv", "logger.progress=false",
                               "iterations=4", "eval_every=4", "world_size=2", "batch_size=16")
    assert code == 0, summary
    df = pd.read_csv(tmp_path / "metrics.csv")
    assert math.isfinite(summary["final_test_loss"]) and (df.bytes_sent > 0).all()
