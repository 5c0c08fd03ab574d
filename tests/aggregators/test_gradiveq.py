"""GradiVeQ aggregator: schedule (warm-up / L_t / L_c), identical PCA state on every rank, Eq. 3-5
semantics inside the ring, the Eq. 7 monitor, config, checkpoint state, the CLI end to end, and the
Fig. 4 / Fig. 5 correlation analysis.  Real gloo ranks on synthetic gradients; tiny models."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from gvq.aggregators.base import RunContext
from gvq.aggregators.gradiveq import GradiVeQAggregator
from gvq.compressors.gradiveq.codec import GradiVeQ
from gvq.hooks.builder import aggregator_from
from gvq.schema.options import GradiVeQAggregatorSchema, knobs
from tests.helpers.launch import launch_job
from tests.helpers.dist import run_ranks
from tests.helpers.records import assert_csv_matches_record

ROOT = Path(__file__).resolve().parents[2]
# two conv layers (K auto = F*D*W: 12 and 18), their biases and a linear head (raw regions)
SHAPES = [(4, 2, 3, 3), (4,), (6, 4, 3, 3), (6,), (3, 24), (3,)]
NUMEL = sum(math.prod(s) for s in SHAPES)
RANK = 3          # dimension of the synthetic gradients' subspace


def _basis(seed: int) -> torch.Tensor:
    """(RANK, NUMEL) rows in model order; in the paper layout every slice of a conv layer is a scaled
    copy of the first (the spatial consistency GradiVeQ relies on), so one basis per layer fits all."""
    gen = torch.Generator().manual_seed(seed)
    comp = GradiVeQ().bind(SHAPES)
    B = torch.randn(RANK, NUMEL, generator=gen)
    for grp in comp.groups:
        v = torch.randn(RANK, 1, grp.K, generator=gen)
        scale = 1 + torch.rand(1, grp.n, 1, generator=gen)
        B[:, grp.start: grp.stop] = (v * scale).reshape(RANK, -1)
    out = []
    for row in B:
        parts = [torch.empty(s) for s in SHAPES]
        comp.unflatten(row, parts)
        out.append(torch.cat([p.reshape(-1) for p in parts]))
    return torch.stack(out)


def _grad(rank: int, it: int, drift_at: int | None = None) -> torch.Tensor:
    """Rank ``rank``'s flat gradient at ``it`` (model order): a shared offset plus a random point of a
    3-dim subspace; from ``drift_at`` on, full-rank noise of a new distribution."""
    g = torch.Generator().manual_seed(1000 * it + rank + 1)
    if drift_at is not None and it >= drift_at:
        return 3.0 * torch.randn(NUMEL, generator=g)
    return 0.5 * _basis(0)[0] + torch.randn(RANK, generator=g) @ _basis(1)


def _set_grads(params, flat: torch.Tensor) -> None:
    off = 0
    for p in params:
        p.grad.copy_(flat[off: off + p.numel()].view_as(p))
        off += p.numel()


def _make(world: int, rank: int = 0, **kw) -> tuple[GradiVeQAggregator, list]:
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    agg = GradiVeQAggregator(GradiVeQ(lam=kw.pop("lam", 0.01)), **knobs(GradiVeQAggregatorSchema, **kw))
    agg.setup(params, RunContext(rank, world, seed=0))
    return agg, params


def _drive(rank, world, iters, kw, drift_at=None):
    """Run the aggregator on synthetic gradients; record what the tests check."""
    agg, params = _make(world, rank, **kw)
    out = {"phase": [], "fit_s": [], "ratio": [], "err": [], "states": {}, "means": [], "ref_diff": []}
    for it in range(iters):
        _set_grads(params, _grad(rank, it, drift_at))
        st = agg.aggregate(it)
        for key, col in (("phase", "phase"), ("fit_s", "fit_s"), ("ratio", "compression_ratio"),
                         ("err", "compression_error")):
            out[key].append(st[col])
        out["means"].append(torch.cat([p.grad.reshape(-1) for p in params]).clone())
        if not math.isnan(st["fit_s"]):
            out["states"][it] = [t.clone() for t in agg.compressor.pca.tensors()]
        if st["phase"] == "compress":
            out["ref_diff"].append(_reference_diff(agg, params, world, it, drift_at))
    return out


def _reference_diff(agg, params, world, it, drift_at) -> float:
    """max |aggregated mean - (U U^T (sum - mu) + mu) / N| over the layout, the reference computed in
    this process by a one-rank compressor holding the same state, applied to the true sum."""
    ref = GradiVeQ(lam=0.01, world_size=1).bind(SHAPES)
    ref.load_pca(agg.compressor.pca)
    grads = [[t.clone() for t in _split(_grad(r, it, drift_at))] for r in range(world)]
    total = sum(ref.flatten(g) for g in grads)
    whole = slice(0, NUMEL)
    expect = ref.decompress(ref.compress(total, whole), whole) / world
    got = ref.flatten([p.grad for p in params])
    return float((got - expect).abs().max() / expect.abs().max())


def _split(flat: torch.Tensor) -> list[torch.Tensor]:
    return [t.view(s) for t, s in zip(flat.split([math.prod(s) for s in SHAPES]), SHAPES)]


@pytest.fixture(scope="module")
def schedule_run(tmp_path_factory):
    """3 ranks, warmup=2, L_t=3, L_c=4, 16 iterations, 4-bit QSGD sampling, monitor off."""
    kw = dict(warmup=2, L_t=3, L_c=4, sampling="qsgd")
    return run_ranks(_drive, 3, tmp_path_factory.mktemp("sched"), 16, kw)


@pytest.mark.slow
def test_phase_sequence_follows_warmup_Lt_Lc(schedule_run):
    want = ["warmup"] * 2 + (["sample"] * 3 + ["compress"] * 4) * 2
    for out in schedule_run:
        assert out["phase"] == want
        fits = [i for i, v in enumerate(out["fit_s"]) if not math.isnan(v)]
        assert fits == [4, 11]                           # the L_t-th sample of each phase
        assert all(r == 1.0 for r in out["ratio"][:2])
        assert all(7.0 < r < 8.1 for r, p in zip(out["ratio"], want) if p == "sample")   # 4-bit QSGD
        assert all(r > 1.0 for r, p in zip(out["ratio"], want) if p == "compress")
        errs = [e for e, p in zip(out["err"], want) if p == "compress"]
        assert len(errs) == 8 and all(0 <= e < math.inf for e in errs)


@pytest.mark.slow
def test_pca_state_and_every_aggregate_are_bitwise_identical_on_all_ranks(schedule_run):
    first = schedule_run[0]
    for out in schedule_run[1:]:
        assert out["states"].keys() == first["states"].keys() == {4, 11}
        for it in first["states"]:
            for a, b in zip(out["states"][it], first["states"][it]):
                assert torch.equal(a, b)
        for a, b in zip(out["means"], first["means"]):
            assert torch.equal(a, b)


@pytest.mark.slow
def test_compressed_aggregate_is_the_projection_of_the_true_sum(schedule_run):
    for out in schedule_run:
        assert len(out["ref_diff"]) == 8 and max(out["ref_diff"]) < 1e-5


@pytest.mark.slow
def test_monitor_stops_compression_on_drift_and_sampling_restarts(tmp_path):
    kw = dict(warmup=0, L_t=5, L_c=50, sampling="rar", monitor_threshold=0.5, lam=0.0)
    outs = run_ranks(_drive, 2, tmp_path, 15, kw, 8)
    for out in outs:
        ph = out["phase"]
        assert ph[:5] == ["sample"] * 5 and ph[5:9] == ["compress"] * 4
        assert all(e < 1e-3 for e in out["err"][5:8])
        assert out["err"][8] > 0.5                         # the drifted iteration's loss, read off its payloads
        assert ph[9:14] == ["sample"] * 5                  # its vote ended the phase from 9 on (L_c = 50)
        assert not math.isnan(out["fit_s"][13]) and not math.isnan(out["err"][14])   # refit, compressed
    for a, b in zip(outs[0]["states"][13], outs[1]["states"][13]):   # fitted locally: same state
        assert torch.equal(a, b)


def _fit_and_sync(rank, world):
    """fit_everywhere twice: on the same samples everywhere, then on samples that differ by rank."""
    from gvq.aggregators.gradiveq_relay import fit_everywhere
    from gvq.comm.p2p import P2P
    comp, p2p = GradiVeQ(lam=0.01, world_size=world).bind(SHAPES), P2P(rank, world)
    samples = torch.randn(5, NUMEL, generator=torch.Generator().manual_seed(0))
    out = {"same": fit_everywhere(comp, samples, p2p), "same_bytes": p2p.bytes_sent}
    own = GradiVeQ(lam=0.01, world_size=world).bind(SHAPES).fit(samples + rank).pca   # before the relay
    out.update(differ=fit_everywhere(comp, samples + rank, p2p), own=own.tensors(),
               own_digest=own.digest, digest=comp.pca.digest, state=comp.pca.tensors(),
               bytes=p2p.bytes_sent - out["same_bytes"])
    return out


@pytest.mark.slow
def test_a_digest_mismatch_relays_rank_0s_state_and_counts_its_bytes(tmp_path):
    outs = run_ranks(_fit_and_sync, 3, tmp_path)
    state_bytes = sum(t.numel() * t.element_size() for t in outs[0]["own"])
    assert len({o["own_digest"] for o in outs}) == 3           # each rank's own fit differs
    for rank, o in enumerate(outs):
        assert o["same"] is False and o["same_bytes"] == 0     # equal digests: nothing relayed
        assert o["differ"] is True and o["digest"] == outs[0]["own_digest"]
        assert all(torch.equal(a, b) for a, b in zip(o["state"], outs[0]["own"]))
        assert o["bytes"] == (state_bytes if rank < 2 else 0)  # 0 -> 1 -> 2: the last rank sends nothing


def test_state_dict_round_trip_resumes_bitwise():
    kw = dict(warmup=1, L_t=4, L_c=3, sampling="qsgd")
    a, pa = _make(1, **kw)
    for it in range(3):                                    # stop mid-sampling: samples are state
        _set_grads(pa, _grad(0, it))
        a.aggregate(it)
    sd = a.state_dict()
    b, pb = _make(1, **kw)
    b.load_state_dict(sd)
    for it in range(3, 12):
        for agg, params in ((a, pa), (b, pb)):
            _set_grads(params, _grad(0, it))
            agg.aggregate(it)
        assert a.phase == b.phase and a.count == b.count
        for p, q in zip(pa, pb):
            assert torch.equal(p.grad, q.grad)


def test_prepare_benchmark_pins_the_compressed_phase_with_d_near_L_t():
    agg, params = _make(1, L_t=5, L_c=2, monitor_threshold=0.1)
    agg.prepare_benchmark([torch.randn(s) for s in SHAPES])
    assert [st["d"] for st in agg.compressor.layer_stats()] == [4, 4]
    for it in range(4):
        _set_grads(params, _grad(0, it))
        assert agg.aggregate(it)["phase"] == "compress"


@pytest.mark.parametrize("kw, key", [
    (dict(L_t=1), "L_t"), (dict(L_c=0), "L_c"), (dict(warmup=-1), "warmup"),
    (dict(monitor_threshold=0), "aggregator.monitor_threshold"),
    (dict(qsgd_bits=1), "aggregator.qsgd_bits"),
    (dict(qsgd_bucket=-3), "aggregator.qsgd_bucket"),
    (dict(warmup_by="fp16"), "aggregator.warmup_by"),
    (dict(sampling="powersgd"), "aggregator.warmup_by='rar', aggregator.sampling='powersgd'"),
    (dict(samples_in_warmup="yes"), "aggregator.samples_in_warmup"),
    (dict(error_feedback=1), "aggregator.error_feedback"),
])
def test_bad_knobs_raise_one_line_errors_naming_the_key(kw, key):
    with pytest.raises(ValueError) as e:
        GradiVeQAggregator(GradiVeQ(), **knobs(GradiVeQAggregatorSchema, **kw))
    assert str(e.value).startswith(key) and "\n" not in str(e.value)


def test_compressor_must_be_gradiveq():
    with pytest.raises(ValueError, match="aggregator.compressor"):
        GradiVeQAggregator(object(), **knobs(GradiVeQAggregatorSchema))


def test_cli_style_composition_instantiates(compose_cfg):
    cfg = compose_cfg("aggregator=gradiveq", "lambda=0.05", "L_t=7", "aggregator.monitor_threshold=1.0")
    agg = aggregator_from(cfg.aggregator)
    assert isinstance(agg, GradiVeQAggregator) and agg.L_t == 7 and agg.monitor_threshold == 1.0
    assert agg.compressor.lam == 0.05 and math.isinf(agg.compressor.s) and agg.sampling == "qsgd"


@pytest.mark.parametrize("exp, world, warmup, L_t, L_c", [("paper_gradiveq", 6, 2500, 100, 400),
                                                         ("digits_gradiveq", 4, 50, 50, 80)])
def test_experiment_presets_set_the_schedule_and_sweep_three_aggregators(compose_cfg, exp, world, warmup,
                                                                         L_t, L_c):
    # needs conf/config.yaml to list `experiment` after `_self_`, and hydra.sweeper.params to accept keys
    cfg = compose_cfg(f"experiment={exp}", "aggregator=gradiveq", return_hydra_config=True)
    assert (cfg.world_size, cfg.warmup, cfg.L_t, cfg.L_c) == (world, warmup, L_t, L_c)
    assert cfg.hydra.sweeper.params.aggregator == "rar,qsgd,gradiveq"
    agg = aggregator_from(cfg.aggregator)
    assert (agg.warmup, agg.L_t, agg.L_c, agg.compressor.lam) == (warmup, L_t, L_c, 0.01)


def _train(run, *args) -> dict:
    # no lr warm-up: in 30 iterations its ramp keeps the loss flat, and GradiVeQ's monitor (which stops a
    # compressed phase whose loss rises) would then cut the phases this test counts short
    code, summary = launch_job(run, "logger=csv", "logger.progress=false", "aggregator=gradiveq", "model.width=4",
                               "iterations=30", "eval_every=15", "warmup=3", "L_t=5", "L_c=6", "world_size=2",
                               "optim.warmup_iters=0", *args)
    assert code == 0, summary
    return summary


def test_training_keeps_replicas_identical_and_resumes_bitwise(tmp_path):
    """A real run through the launcher (two spawned ranks): the schedule, the logs, and a resume."""
    run, resumed = tmp_path / "run", tmp_path / "resumed"
    summary = _train(run, "checkpoint.every=16")              # iteration 16: mid-sampling, 2 samples kept
    assert summary["replicas_identical"] is True and summary["status"] == "completed"
    df = pd.read_csv(run / "metrics.csv")
    assert list(df.phase[:14]) == ["warmup"] * 3 + ["sample"] * 5 + ["compress"] * 6
    assert df.fit_s.notna().sum() >= 2 and df.fit_s.dropna().gt(0).all()
    comp = df[df.phase == "compress"]
    assert comp.compression_error.notna().all()
    assert df[df.phase != "compress"].compression_error.isna().all()
    assert (comp.compression_ratio > 1).all() and (comp.bytes_sent < df.bytes_sent[0]).all()
    sample = df[df.phase == "sample"]            # every rank fits: a refresh sends no bases --
    assert sample.bytes_sent.nunique() == 1      # its iteration sends what every sampling iteration sends
    assert summary["aggregator"]["refreshes"] >= 2 and summary["aggregator"]["relays"] == 0
    layers = [json.loads(x) for x in (run / "gradiveq_layers.jsonl").read_text().splitlines()]
    assert {x["refresh"] for x in layers} >= {1, 2}
    assert all(x["K"] / x["d"] == pytest.approx(x["ratio"]) and 0 < x["energy"] <= 1 for x in layers)
    # resuming from the checkpoint (samples, schedule, PCA state, QSGD dither) gives the same metrics
    _train(resumed, f"resume={run}")
    times = ["compute_s", "aggregate_s", "compress_s", "decompress_s", "wire_s", "wall_s", "real_wall_s", "fit_s",
             "monitor_s"]
    pd.testing.assert_frame_equal(df.drop(columns=times),
                                  pd.read_csv(resumed / "metrics.csv").drop(columns=times))


def test_correlation_analysis_writes_fig4_and_fig5(tmp_path):
    from gvq.analysis.__main__ import main
    assert main(["correlation", "--out", str(tmp_path), "iterations=30"]) == 0
    info = json.loads((tmp_path / "fig4.json").read_text())
    assert 0.0 < info["variance_2pc"] <= 1.0 and info["iterations"] == 30
    df = pd.read_csv(tmp_path / "fig5_slice_loss.csv")
    assert_csv_matches_record(df, "analysis_correlation")  # what the flags' version wrote (issue 62)
    assert {"K", "multiple_of_FD", "d", "ratio", "loss", "local_min"} <= set(df.columns)
    assert df.K.is_monotonic_increasing and (df.loss >= 0).all() and (df.ratio >= 1).all()
    assert df.multiple_of_FD.any() and (~df.multiple_of_FD).any()
    for png in ("fig4_scatter.png", "fig5_slice_loss.png"):
        assert (tmp_path / png).stat().st_size > 1000


def test_ring_pieces_split_segments_on_group_boundaries_only():
    """pieces > 1 refines each payload-balanced segment without moving its ends, cutting only where a
    basis group starts or stops (a cut inside a group would stream its basis twice)."""
    from gvq.compressors.gradiveq.segments import payload_balanced_segments
    comp = GradiVeQ(K="x1").bind([(8, 4, 3, 3), (8,), (8, 8, 3, 3), (8, 8, 3, 3), (8,), (10, 72)])
    numel = comp.layout.numel
    gen = torch.Generator().manual_seed(0)
    comp.fit(torch.randn(12, numel, generator=gen))
    edges = {g.start for g in comp.groups} | {g.stop for g in comp.groups}
    for n in (1, 2, 3):
        plain = payload_balanced_segments(comp, numel, n)
        pieced = payload_balanced_segments(comp, numel, n, pieces=3)
        assert len(pieced) == n
        for seg, pieces in zip(plain, pieced):
            assert pieces[0].start == seg.start and pieces[-1].stop == seg.stop
            assert all(a.stop == b.start for a, b in zip(pieces[:-1], pieces[1:]))
            assert all(p.stop > p.start for p in pieces) or pieces == [seg]
            assert all(p.start in edges for p in pieces[1:])
        assert sum(len(p) for p in pieced) > n                 # something was actually cut


def test_pieces_knob_is_validated():
    with pytest.raises(ValueError, match=r"^aggregator\.pieces=0"):
        _make(1, pieces=0)


@pytest.mark.parametrize("warmup_by,in_warmup", [("rar", False), ("qsgd", False), ("rar", True), ("qsgd", True)])
def test_schedule_knobs_warmup_by_and_samples_in_warmup(warmup_by, in_warmup):
    """aggregator.warmup_by: the ring the warm-up's vectors take (rar: plain; qsgd: the sampling
    quantizer's re-encode ring); aggregator.samples_in_warmup: the first L_t samples are the warm-up's
    last L_t sums, so compression starts L_t iterations sooner.  The defaults keep the paper's schedule."""
    from gvq.hooks.config import build_aggregator
    agg = build_aggregator("gradiveq", warmup=4, L_t=2, L_c=3, warmup_by=warmup_by, samples_in_warmup=in_warmup,
                           **{"compressor.K": 8})
    params = [torch.nn.Parameter(torch.zeros(4, 2, 3, 3)), torch.nn.Parameter(torch.zeros(4))]
    agg.setup(params, RunContext(0, 1, seed=1))
    gen, seen, declared = torch.Generator().manual_seed(0), [], agg.rings

    def spy(params_, n):                      # the ring each iteration's vector took
        rings = declared(params_, n)
        seen.append(rings[0].kind)
        return rings
    agg.rings = spy
    phases = []
    for it in range(8):
        for p in params:
            p.grad.copy_(torch.randn(p.shape, generator=gen))
        phases.append(agg.aggregate(it)["phase"])
    agg.close()
    warm = "reencode" if warmup_by == "qsgd" else "plain"
    if in_warmup:        # iterations 0-1 warm-up, 2-3 samples as the warm-up sums them, then compressed
        assert phases[:5] == ["warmup"] * 2 + ["sample"] * 2 + ["compress"]
        assert seen[:4] == [warm] * 4 and seen[4] == "additive"
    else:                # iterations 0-3 warm-up, 4-5 samples (the paper's 4-bit QSGD ring), then compressed
        assert phases[:7] == ["warmup"] * 4 + ["sample"] * 2 + ["compress"]
        assert seen[:4] == [warm] * 4 and seen[4:6] == ["reencode"] * 2 and seen[6] == "additive"


def test_error_feedback_on_the_projections_residual_loses_nothing_over_a_run():
    """aggregator.error_feedback=true, one rank: every iteration's output plus the memory left at the end
    adds up to every gradient it was given (what a payload leaves out is sent later, never dropped), the
    memory holds exactly what the last compressed payload left out, and the default keeps none."""
    from gvq.hooks.config import build_aggregator
    shapes = [(6, 2, 3, 3), (6,), (5, 6, 3, 3)]
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    agg = build_aggregator("gradiveq", warmup=1, L_t=3, L_c=4, error_feedback=True, sampling="rar",
                           **{"compressor.K": "x1"})        # rar sampling: the only loss is the projection's
    agg.setup(params, RunContext(0, 1, seed=1))
    gen = torch.Generator().manual_seed(0)
    given, out = torch.zeros(sum(p.numel() for p in params)), torch.zeros(sum(p.numel() for p in params))
    phases = []
    for it in range(8):                           # warm-up 0, samples 1-3, compressed 4-7
        grads = [torch.randn(s, generator=gen) + 2.0 for s in shapes]
        for p, g in zip(params, grads):
            p.grad.copy_(g)
        phases.append(agg.aggregate(it)["phase"])
        given += agg.compressor.flatten(grads)
        out += agg.compressor.flatten([p.grad for p in params])
    assert phases == ["warmup"] + ["sample"] * 3 + ["compress"] * 4
    assert float(agg.feedback.memory.abs().max()) > 0                      # the last payload left something out
    torch.testing.assert_close(out + agg.feedback.memory, given, rtol=1e-4, atol=1e-4)
    assert list(agg.per_parameter()) == ["residual"] and "residual" in agg.state_dict()
    agg.close()
    plain = build_aggregator("gradiveq")
    assert plain.per_parameter() == {} and plain.feedback is None and plain.error_feedback is False
