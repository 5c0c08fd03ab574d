"""CompressedAggregator and its error-feedback form, through top-k (conf/aggregator/topk.yaml): the
all-gather's mean is the mean of every rank's decoded payload, with and without error feedback; the bytes
each rank sends and receives are logged as the wire arithmetic says (all-gather: (N - 1) payloads each way;
the rings of rar and qsgd: their segments); ratio 1 trains as rar; the CLI trains and refuses with it."""
from __future__ import annotations

import pytest
import torch

from gvq.aggregators.base import RunContext
from gvq.compressors.base import Compressor
from tests.helpers.dist import run_ranks

SHAPES = ((6, 2, 3, 3), (6,), (5, 6, 3, 3), (10, 7), (10,))
EF = "gvq.aggregators.error_feedback.ErrorFeedbackAggregator"
PLAIN = "gvq.aggregators.compressed.CompressedAggregator"


def _params(rank: int, it: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + it)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _topk_rank(rank, world, option, overrides, iters):
    """Per iteration: this rank's gradient, what it fed (g + e), its decoded payload, the mean, the bytes."""
    from gvq.hooks.config import build_aggregator
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    agg = build_aggregator(option, **overrides)
    agg.setup(params, RunContext(rank, world))
    out = []
    try:
        for it in range(iters):
            grads = _params(rank, it)
            for p, g in zip(params, grads):
                p.grad.copy_(g)
            flat = torch.cat([g.reshape(-1) for g in grads])
            fed = flat + agg.feedback.memory if hasattr(agg, "feedback") else flat.clone()
            codec = Compressor() if option == "rar" else agg.codec_for(agg.everything)   # rar: plain float32
            whole = slice(0, flat.numel())
            mine = codec.decompress(codec.compress(fed, whole), whole)
            stats = agg.aggregate(it)
            rings = agg.rings(agg.everything, world)
            out.append({"mine": mine, "mean": torch.cat([p.grad.reshape(-1) for p in params]),
                        "sent": stats["bytes_sent"], "received": stats["bytes_received"],
                        "density": stats.get("ring_density"),
                        "segs": [(s.start, s.stop) if isinstance(s, slice) else (s[0].start, s[-1].stop)
                                 for s in rings[0].segs],
                        "nbytes": [codec.payload_nbytes(s) if isinstance(s, slice) else
                                                          sum(codec.payload_nbytes(q) for q in s)
                                                          for s in rings[0].segs]})
    finally:
        agg.close()
    return out


def _every_case(rank, world):
    return {"ef": _topk_rank(rank, world, "topk", {}, 3),
            "plain": _topk_rank(rank, world, "topk", {"_target_": PLAIN}, 2),
            "packed_bucket": _topk_rank(rank, world, "topk", {"compressor.indices": "packed",
                                                              "compressor.scope": "bucket",
                                                              "compressor.bucket": 50}, 2),
            "sparse_ring": _topk_rank(rank, world, "topk", {"topology": "sparse_ring"}, 3),
            "rar": _topk_rank(rank, world, "rar", {}, 1),
            "qsgd": _topk_rank(rank, world, "qsgd", {"compressor.bucket": 64}, 1)}


@pytest.fixture(scope="module", params=[2, 3, 4])
def ranks(request, tmp_path_factory):
    world = request.param
    return world, run_ranks(_every_case, world, tmp_path_factory.mktemp(f"topk{world}"))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["ef", "plain", "packed_bucket", "sparse_ring"])
def test_the_allgather_mean_is_the_mean_of_every_ranks_decoded_payload(ranks, case):
    world, out = ranks
    for it in range(len(out[0][case])):
        want = sum(out[r][case][it]["mine"] for r in range(world)) / world
        for r in range(world):
            assert torch.allclose(out[r][case][it]["mean"], want, rtol=1e-6, atol=1e-7)
        assert torch.equal(out[0][case][it]["mean"], out[world - 1][case][it]["mean"])   # the same bits


@pytest.mark.slow
@pytest.mark.parametrize("case", ["ef", "plain", "packed_bucket"])
def test_an_allgather_sends_and_receives_n_minus_1_payloads(ranks, case):
    world, out = ranks
    for r in range(world):
        for row in out[r][case]:
            payload = row["nbytes"][0]
            assert payload > 0
            assert row["sent"] == row["received"] == (world - 1) * payload


@pytest.mark.slow
@pytest.mark.parametrize("case", ["rar", "qsgd"])
def test_a_ring_logs_the_segments_it_sends_and_receives(ranks, case):
    """2(N - 1) steps: in step i of the reduce-scatter rank r sends segment r - i and receives r - i - 1; in
    the all-gather it sends r + 1 - i and receives r - i (mod N)."""
    world, out = ranks
    for r in range(world):
        row = out[r][case][0]
        size = row["nbytes"]
        sent = sum(size[(r - i) % world] + size[(r + 1 - i) % world] for i in range(world - 1))
        received = sum(size[(r - i - 1) % world] + size[(r - i) % world] for i in range(world - 1))
        assert (row["sent"], row["received"]) == (sent, received)
        assert abs(row["sent"] - row["received"]) <= 2 * (max(size) - min(size))


def _sparse_ring_bytes(world: int, r: int, segs: list, supports: list[torch.Tensor]) -> tuple[int, int, float]:
    """(bytes rank r sends, receives; the densest chunk it sends) on the sparse ring, from every rank's
    support: in reduce-scatter step i it sends segment r - i holding ranks r - i .. r's entries, in the
    all-gather segment r + 1 - i holding all; 4 header bytes a chunk, then 8 a pair or, from density 1/2
    on (dense for the rest of the ring), 4 a value."""
    def chunk(s, ranks):
        seg = slice(*segs[s])
        length = seg.stop - seg.start
        pairs = int(torch.stack([supports[k % world][seg] for k in ranks]).any(0).sum())
        dense = any(2 * int(torch.stack([supports[j % world][seg] for j in ranks[:h]]).any(0).sum()) >= length
                    for h in range(1, len(ranks) + 1))
        return 4 + (4 * length if dense else 8 * pairs), 1.0 if dense else pairs / length

    def sent_by(q):
        out = [chunk((q - i) % world, list(range(q - i, q + 1))) for i in range(world - 1)]
        return out + [chunk((q + 1 - i) % world, list(range(world))) for i in range(world - 1)]
    mine, left = sent_by(r), sent_by((r - 1) % world)
    return sum(b for b, _ in mine), sum(b for b, _ in left), max(d for _, d in mine)


@pytest.mark.slow
def test_the_sparse_ring_logs_its_chunks_bytes_and_densest_chunk(ranks):
    world, out = ranks
    for it in range(len(out[0]["sparse_ring"])):
        supports = [out[r]["sparse_ring"][it]["mine"] != 0 for r in range(world)]
        for r in range(world):
            row = out[r]["sparse_ring"][it]
            sent, received, densest = _sparse_ring_bytes(world, r, row["segs"], supports)
            assert (row["sent"], row["received"]) == (sent, received)
            assert row["density"] == pytest.approx(densest)


def test_the_sparse_ring_is_refused_for_a_codec_without_entries():
    from gvq.hooks.config import build_aggregator
    with pytest.raises(ValueError, match="topology=sparse_ring: compressor 'qsgd' is not sparse"):
        build_aggregator("qsgd", topology="sparse_ring")


def test_without_error_feedback_the_option_keeps_no_memory_and_sends_the_raw_gradient():
    from gvq.hooks.config import build_aggregator
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    agg = build_aggregator("topk", _target_=PLAIN)
    agg.setup(params, RunContext(0, 1))
    try:
        assert not hasattr(agg, "feedback") and agg.name == "topk" and agg.topology == "allgather"
        grads = _params(0, 0)
        for p, g in zip(params, grads):
            p.grad.copy_(g)
        flat = torch.cat([g.reshape(-1) for g in grads])
        agg.aggregate(0)
        codec = agg.codec_for(agg.everything)
        whole = slice(0, flat.numel())
        assert torch.equal(torch.cat([p.grad.reshape(-1) for p in params]),
                           codec.decompress(codec.compress(flat, whole), whole))
    finally:
        agg.close()


def test_the_compression_error_is_measured_unless_the_context_turns_it_off():
    """``RunContext(compression_error=False)`` (``gvq.bench aggregate``: aggregation alone): the column NaN and
    one whole-vector compress fewer (the measurement's round trip), the ring's own calls untouched."""
    import math

    from gvq.hooks.config import build_aggregator
    got = {}
    for measured in (True, False):
        params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
        agg = build_aggregator("qsgd")
        agg.setup(params, RunContext(0, 1, compression_error=measured))
        calls, codec = [], agg.codec_for(agg.everything)
        compress = codec.compress
        codec.compress = lambda x, seg, compress=compress, calls=calls: calls.append(seg) or compress(x, seg)
        try:
            for p, g in zip(params, _params(0, 0)):
                p.grad.copy_(g)
            stats = agg.aggregate(0)
            assert math.isnan(stats["compression_error"]) != measured
            got[measured] = len(calls)
            assert all(torch.isfinite(p.grad).all() for p in params)
        finally:
            agg.close()
    assert got[True] == got[False] + 1 and got[False] >= 1


def test_error_feedback_knobs_are_refused_without_error_feedback():
    from gvq.hooks.config import build_aggregator
    from gvq.schema.errors import ConfigError
    for key, value in (("ef_decay", 0.9), ("ef_units", "step")):
        with pytest.raises((ValueError, ConfigError), match=f"aggregator.{key}"):
            build_aggregator("qsgd", **{key: value})


def _train_all(rank, world, cfgs, root):
    from gvq.run.train import train
    out = {}
    for name, cfg in cfgs.items():
        train(cfg, rank, world, f"{root}/{name}", {"run_dir": f"{root}/{name}"})
    return out


@pytest.mark.slow
def test_ratio_1_trains_as_uncompressed(compose_cfg, tmp_path):
    """k = n: every value sent exactly, nothing held back, so topk (with and without error feedback, by
    allgather and by the sparse ring) follows rar's run up to the order the mean is summed in."""
    import pandas as pd
    from omegaconf import OmegaConf
    from gvq.run.launch import preflight
    runs = {"rar": ["aggregator=rar"], "topk": ["aggregator=topk", "aggregator.compressor.ratio=1.0"],
            "topk_plain": ["aggregator=topk", "aggregator.compressor.ratio=1.0", f"aggregator._target_={PLAIN}"],
            "topk_sparse_ring": ["aggregator=topk", "aggregator.compressor.ratio=1.0",
                                 "aggregator.topology=sparse_ring"]}
    cfgs = {}
    for name, overrides in runs.items():
        cfg = compose_cfg(*overrides, "iterations=6", "eval_every=6", "logger=csv", "logger.progress=false",
                          "batch_size=16", "world_size=2")
        preflight(cfg)
        cfgs[name] = OmegaConf.to_container(cfg, resolve=True)
        (tmp_path / name).mkdir()
    run_ranks(_train_all, 2, tmp_path, cfgs, str(tmp_path), timeout=240)
    rows = {name: pd.read_csv(tmp_path / name / "metrics.csv") for name in runs}
    for name in ("topk", "topk_plain", "topk_sparse_ring"):
        assert list(rows[name].train_loss) == pytest.approx(list(rows["rar"].train_loss), rel=1e-4, abs=1e-5)
        assert rows[name].test_acc.dropna().iloc[-1] == pytest.approx(rows["rar"].test_acc.dropna().iloc[-1],
                                                                      abs=0.01)
    payload = 8 * sum(p.numel() for p in _model_params(cfgs["rar"]))        # k = n: n values + n indices
    assert (rows["topk"].bytes_sent == payload).all() and (rows["topk"].bytes_received == payload).all()
    assert (rows["rar"].bytes_sent == rows["rar"].bytes_received).all()
    # the sparse ring: every chunk dense from the start (density 1), a 4-byte header before each of its 2 chunks
    assert (rows["topk_sparse_ring"].bytes_sent == payload // 2 + 8).all()
    assert (rows["topk_sparse_ring"].ring_density == 1.0).all()


def _model_params(cfg: dict):
    from hydra.utils import instantiate
    from gvq.workloads.build import of_data
    work = of_data(instantiate(cfg["dataset"]))
    return [p for p in instantiate(cfg["model"], num_classes=work.num_classes, in_channels=work.in_channels)
            .parameters() if p.requires_grad]


@pytest.mark.slow
def test_the_cli_trains_the_default_cnn_with_topk_at_one_percent(tmp_path):
    import pandas as pd
    from tests.helpers.cli import cli_in_process
    r = cli_in_process("aggregator=topk", "aggregator.compressor.ratio=0.01", "iterations=4", "eval_every=4",
                       "logger=csv", "logger.progress=false", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(tmp_path / "metrics.csv")
    assert list(df.iteration) == [0, 1, 2, 3] and df.train_loss.notna().all()
    assert (df.bytes_sent > 0).all() and (df.bytes_sent == df.bytes_received).all()
    assert (df.phase == "topk+ef").all()


def test_an_out_of_range_ratio_is_refused_in_one_line_naming_the_key(tmp_path):
    from tests.helpers.cli import cli_in_process
    r = cli_in_process("aggregator=topk", "aggregator.compressor.ratio=1.5", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "ratio=1.5" in r.stderr, r.stderr
