"""The practitioner's baseline in the GPU regime (gvq/predict/nccl.py): DDP on NCCL, priced at the link's
ring bound off the host cores, its fp16 casts at the GPU's measured cost; the default of ``project
--overlap`` there, the CPU regime priced as before, and every table saying which baseline priced it."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from gvq.predict import __main__ as cli
from gvq.predict import nccl, project
from gvq.predict.overlap import Overlap, Phases


def test_the_ring_bound_on_a_hand_computed_case():
    # 1 MB over 4 ranks at 1 Gbit/s: 2 x 3/4 x 8e6 bit / 1e9 = 12 ms; 2 x 3 steps x 10 us
    assert nccl.ring_seconds(1e6, 4, 1e9, 1e-5) == pytest.approx(0.012 + 6e-5)
    assert nccl.ring_seconds(1e6, 1, 1e9, 1e-5) == 0.0


def _two_buckets():
    """A gradient of 1e6 values in DDP's two buckets: a quarter ready half-way through backward, the rest at
    its end; forward 10 ms, backward 20 ms, step 5 ms."""
    ov = {"buckets": {"fp16": {"default": [{"values": 0.25, "params": [0]}, {"values": 0.75, "params": [1]}]}},
          "profile": {"ready": [0.5, 1.0]}}
    return SimpleNamespace(m=SimpleNamespace(struct={"numel": 1_000_000}), ov=ov,
                           phases=lambda n, c: Phases(0.010, 0.020, 0.005))


def test_an_nccl_iteration_on_a_hand_computed_case():
    codec = nccl.GpuCodec((1e-4, 1e-9), (5e-5, 1e-9), "scripted")
    base = nccl.Nccl(codec)
    # fp16: bucket 0 = 5e5 bytes: 2 x 3/4 x 8 x 5e5 / 1e9 = 6 ms + casts 0.15 + 0.5 ms, handed at 20 ms -> 26.65;
    # bucket 1 = 1.5e6 bytes: 18 ms + 0.15 + 1.5 ms, handed at 30 ms (the lane is free) -> 49.65; + step 5 ms
    it = base.iteration(_two_buckets(), "fp16", 4, 1e9, 1 / 6)
    assert it["iter_s"] == pytest.approx(0.05465)
    assert it["aggregate_s"] == pytest.approx(0.01965) and it["compute_s"] == pytest.approx(0.030)
    # ddp's allreduce hook: fp32, no casts; bucket 0 = 1e6 bytes: 12 ms from 20 ms -> 32; bucket 1 = 3e6 bytes
    # waits for the lane: 36 ms from 32 -> 68; + step
    assert base.iteration(_two_buckets(), "ddp", 4, 1e9, 1 / 6)["iter_s"] == pytest.approx(0.073)
    assert base.applies(1 / 6) and not base.applies(1.0)


def test_the_default_casts_are_the_h200s_measured_fp16():
    codec = nccl.load_codec()
    assert codec.source.endswith("h200-2026-11-27/fp16.json")
    # compress 0.0408 ms + decompress 0.0218 ms on 470,004 values, the floor 0.0007 ms each in proportion
    assert codec.seconds(470004) == pytest.approx((0.040821 + 0.021819) / 1e3, rel=1e-3)
    assert nccl.load_codec(nccl.GPU_CODECS / "nowhere") is None


class _Scripted:
    """An overlap model of fixed seconds, and a baseline that prices fp16 and ddp at 0.5 s below x1."""
    m = SimpleNamespace(aggregators=["rar", "fp16", "qsgd"], cal={"model": "scripted"})

    def post_iteration(self, name, n, bps, compute_scale=1.0):
        return {"iter_s": {"rar": 2.0, "fp16": 1.5, "qsgd": 0.9}[name]}

    def iteration(self, name, n, bps, compute_scale=1.0, shared=True):
        return {"iter_s": {"rar": 1.6, "fp16": 1.0, "qsgd": 0.8}[name]}


class _Baseline:
    name = "nccl"

    def applies(self, c):
        return c < 1.0

    def iteration(self, ov, name, n, bps, c):
        return {"iter_s": {"fp16": 0.5, "ddp": 0.7}[name]}


def test_the_baseline_prices_overlapped_fp16_and_ddp_in_the_gpu_regime_only():
    df = project.overlap_grid(_Scripted(), [8], links=[1e9], scales=[1.0, 1 / 6], baseline=_Baseline())
    cpu, gpu = df[df["compute_scale"] == 1.0], df[df["compute_scale"] < 1.0]
    assert set(cpu["baseline"]) == {"gvq_ring"} and set(gpu["baseline"]) == {"nccl"}
    assert "ddp" not in set(cpu["aggregator"]) and len(gpu) == len(cpu) + 1
    over = gpu.set_index(["aggregator", "mode"])["iter_s"]
    assert over[("fp16", "overlap")] == 0.5 and over[("ddp", "overlap")] == 0.7 and over[("qsgd", "overlap")] == 0.8
    old = project.overlap_grid(_Scripted(), [8], links=[1e9], scales=[1.0, 1 / 6])
    pd.testing.assert_frame_equal(cpu.reset_index(drop=True), old[old["compute_scale"] == 1.0].reset_index(drop=True))
    win = project.overlap_winners(df, {"rar": 100, "fp16": 100, "qsgd": 200}, {"rar": 30}).set_index("compute_scale")
    assert win.loc[1.0, "margin"] == pytest.approx(1.0 / 0.8) and win.loc[1 / 6, "winner"] == "fp16 overlap"
    assert win.loc[1 / 6, "tta_tied"] == "ddp overlap"      # RAR's 100 - 30 iterations x 0.7 s reach fp16's 50 s


def test_the_gpu_regime_is_priced_by_nccl_by_default_and_the_cpu_regime_as_before(calibrated_settings, tmp_path,
                                                                                  capsys):
    """On a real calibration: the CPU regime's every row is the overlap model's own (the pricing before the
    baseline), the GPU regime's overlapped fp16 is DDP on NCCL with the H200's casts, and the table, the
    CSV and the heatmaps say so."""
    ov = Overlap.load(calibrated_settings)
    base = nccl.Nccl(nccl.load_codec())
    df = project.overlap_grid(ov, [8], links=[5e7, 1e10], scales=[1.0, 1 / 6], baseline=base)
    for _, r in df[df["compute_scale"] == 1.0].iterrows():
        before = (ov.post_iteration(r["aggregator"], 8, r["link_bps"], compute_scale=1.0) if r["mode"] == "post"
                  else ov.iteration(r["aggregator"], 8, r["link_bps"], compute_scale=1.0))
        assert r["iter_s"] == pytest.approx(before["iter_s"], rel=1e-9)
    gpu = df[(df["compute_scale"] < 1.0) & (df["mode"] == "overlap")].set_index(["aggregator", "link_bps"])
    for b in (5e7, 1e10):
        assert gpu.loc[("fp16", b), "iter_s"] == pytest.approx(base.iteration(ov, "fp16", 8, b, 1 / 6)["iter_s"])
        assert gpu.loc[("fp16", b), "iter_s"] < ov.iteration("fp16", 8, b, compute_scale=1 / 6)["iter_s"]
        own = ov.iteration("qsgd", 8, b, compute_scale=1 / 6)["iter_s"]
        assert gpu.loc[("qsgd", b), "iter_s"] == pytest.approx(own)
    base_args = ["project", "overlap=true", "models=[cnn]", "--calibration", str(calibrated_settings.parent),
                 "max_world_size=8", "--out", str(tmp_path)]
    full = cli.main(base_args)
    assert set(full[full["compute_scale"] < 1]["baseline"]) == {"nccl"}
    assert set(full[full["compute_scale"] == 1]["baseline"]) == {"gvq_ring"}
    assert "# baseline in the GPU regime: nccl, DDP on NCCL" in capsys.readouterr().out
    assert set(pd.read_csv(tmp_path / "projection_overlap.csv")["baseline"]) == {"nccl", "gvq_ring"}
    old = cli.main([*base_args, "baseline=gvq_ring"])
    assert set(old["baseline"]) == {"gvq_ring"} and "# baseline: gvq_ring" in capsys.readouterr().out
