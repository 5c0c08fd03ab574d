"""gvq.analysis.peers and .peer_measures: GradiVeQ vs PowerSGD at equal bytes on recorded gradients
(python -m gvq.analysis peers)."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from gvq.analysis import peer_measures as PM
from gvq.analysis import peers as P
from gvq.analysis.__main__ import main as analyze_main
from gvq.compressors.gradiveq.codec import GradiVeQ
from tests.helpers.grads import HELD_OUT_SHAPES, held_out_grads
from tests.helpers.records import assert_csv_matches_record

# two conv layers, their biases, a small FC (PowerSGD compresses it, GradiVeQ sends it raw)
SHAPES = [torch.Size(s) for s in [(16, 8, 3, 3), (16,), (32, 16, 3, 3), (32,), (10, 16), (10,)]]
NUMEL = sum(math.prod(s) for s in SHAPES)
# tiny matrices: one intra-op thread avoids spin-waiting on a shared 2-core machine (5x CPU)
pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def _stationary(T: int, seed: int = 0, k: int = 12) -> list[torch.Tensor]:
    """Gradients = fixed mean + a k-dim random walk of directions + small noise: PCA-friendly, stable."""
    g = torch.Generator().manual_seed(seed)
    mean = 0.3 * torch.randn(NUMEL, generator=g)
    basis = torch.randn(k, NUMEL, generator=g)
    return [mean + torch.randn(k, generator=g) @ basis + 0.05 * torch.randn(NUMEL, generator=g)
            for _ in range(T)]


def _rows(df, prefix):
    return df[df["method"].str.startswith(prefix)]


# -- the split -------------------------------------------------------------------------------------------
def test_schedule_fit_and_eval_disjoint_and_ordered():
    cycles = P.schedule(400, warmup=50, L_t=50, L_c=80)
    assert [(f.start, f.stop, e.start, e.stop) for f, e in cycles] == \
        [(50, 100, 100, 180), (180, 230, 230, 310), (310, 360, 360, 400)]
    fit = {t for f, _ in cycles for t in f}
    ev = {t for _, e in cycles for t in e}
    assert not fit & ev and min(fit) == 50 and max(ev) == 399
    for f, e in cycles:                     # every evaluation gradient comes after its fitting window
        assert e.start == f.stop and len(f) == 50
    # a cycle needs at least one evaluation gradient; too few gradients is an error
    assert len(P.schedule(101, 50, 50, 80)) == 1 and len(P.schedule(100, 0, 50, 80)) == 1
    with pytest.raises(ValueError):
        P.schedule(100, 50, 50, 80)


def test_gradiveq_is_scored_on_the_following_gradients_only():
    """Fitting-window gradients live in subspace A, all others in B (orthogonal): fitted on A, GradiVeQ
    is near-exact in-sample but must lose ~everything on the evaluation gradients."""
    warmup, L_t, L_c = 5, 20, 10
    grads = held_out_grads(warmup, L_t, L_c)
    df = P.peers_table(grads, HELD_OUT_SHAPES, ranks=(1,), Ks=("auto",), pools=(True,), warmup=warmup, L_t=L_t,
                       L_c=L_c, log=lambda *_: None)
    gvq = _rows(df, "GradiVeQ").iloc[0]
    assert gvq["n_eval"] == L_c
    assert gvq["err_fit_window_mean"] < 1e-3
    assert gvq["err_mean"] > 0.9


# -- bytes -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("knob", PM.KNOBS)
def test_predicted_bytes_equal_the_fit(knob):
    grads = _stationary(40)
    for K, pool in (("auto", False), ("x1", True)):
        probe = GradiVeQ(K=K, pool=pool, world_size=1).bind(SHAPES)
        S = torch.stack([PM.layout_flat(probe, x, SHAPES) for x in grads])
        spec, raw = PM.spectra(probe, S), PM.raw_count(probe)
        assert raw == 160 + 16 + 32 + 10
        for target in (1800, 2600, 4000):
            v = PM.match_knob(spec, raw, knob, target)
            kw = {"lam": v} if knob == "lambda" else {"target_ratio": v}
            comp = PM.fit_gradiveq(SHAPES, S, K, pool, knob, v)
            predicted = PM.predicted_bytes(spec, raw, PM.predicted_ds(spec, **kw))
            assert comp.payload_nbytes(slice(0, NUMEL)) == predicted


def test_powersgd_bytes_are_the_aggregators():
    # r=2: conv 16x72 -> P 32 + Q 144; conv 32x144 -> 64 + 288; fc 10x16 -> 20 + 32; biases raw 58
    assert PM.powersgd_bytes(SHAPES, 2) == 4 * (32 + 144 + 64 + 288 + 20 + 32 + 58)


def test_gradiveq_bytes_match_powersgd_within_tolerance():
    # GradiVeQ reaches [raw + 1 per slice, raw + d_max per slice]: raw = 218 values, 6 slices, d <= 29
    # (L_t = 30) or 87 pooled; PowerSGD sends 348 values at r=1 (both reachable), 638 at r=2 (pool only)
    grads = _stationary(70)
    df = P.peers_table(grads, SHAPES, ranks=(1, 2), Ks=("auto",), knobs=PM.KNOBS, pools=(False, True),
                       warmup=5, L_t=30, L_c=35, log=lambda *_: None)
    for r, must in ((1, 4), (2, 2)):
        target = PM.powersgd_bytes(SHAPES, r)
        assert (df[(df["r"] == r) & df["method"].str.startswith("PowerSGD")]["bytes"] == target).all()
        rows = _rows(df[df["r"] == r], "GradiVeQ")
        assert len(rows) == 4
        rows = rows if must == 4 else rows[rows["method"].str.contains("pool")]
        assert len(rows) == must
        for _, row in rows.iterrows():
            assert row["matched"], row.to_dict()
            assert abs(row["bytes"] / target - 1) <= 0.03
            assert abs(row["vs_powersgd_%"]) <= 3.0
    unpooled = _rows(df[df["r"] == 2], "GradiVeQ K=auto lambda").iloc[0]
    assert not unpooled["matched"] and unpooled["vs_powersgd_%"] < -3      # capped by d <= L_t - 1


def test_unreachable_bytes_are_flagged():
    # PowerSGD rank 1 sends less than GradiVeQ's raw FC alone: GradiVeQ cannot go that low
    shapes = [SHAPES[0], torch.Size((200, 64))]
    g = torch.Generator().manual_seed(4)
    grads = [torch.randn(sum(math.prod(s) for s in shapes), generator=g) for _ in range(30)]
    df = P.peers_table(grads, shapes, ranks=(1,), Ks=("auto",), pools=(False,), warmup=0, L_t=20, L_c=10,
                       log=lambda *_: None)
    row = _rows(df, "GradiVeQ").iloc[0]
    assert not row["matched"] and row["vs_powersgd_%"] > 3


# -- errors -------------------------------------------------------------------------------------------------
def test_errors_finite_and_in_range():
    grads = _stationary(60, seed=3)
    df = P.peers_table(grads, SHAPES, ranks=(2,), Ks=("auto",), pools=(True,), warmup=5, L_t=25, L_c=30,
                       log=lambda *_: None)
    assert set(df["method"]) >= {"PowerSGD", "PowerSGD+EF", "PowerSGD+EF (t vs g)", "QSGD 4-bit max",
                                 "GradiVeQ K=auto pool lambda"}
    for col in ("err_mean", "err_median", "err_max", "err_conv_mean", "err_fit_window_mean"):
        assert df[col].map(math.isfinite).all() and (df[col] >= 0).all(), col
    # projections (PowerSGD onto P^, with or without the residual) can only lose energy
    proj = df[df["method"].isin(["PowerSGD", "PowerSGD+EF"])]
    assert (proj["err_max"] <= 1 + 1e-6).all()
    # on stationary PCA-friendly gradients GradiVeQ and max-norm QSGD lose well under the signal
    assert (_rows(df, "GradiVeQ")["err_mean"] < 0.5).all()
    assert (df[df["method"] == "QSGD 4-bit max"]["err_mean"] < 0.5).all()


def test_powersgd_exact_on_low_rank_and_ef_residual():
    g = torch.Generator().manual_seed(2)
    shapes = [torch.Size((12, 20)), torch.Size((12,))]
    M = torch.randn(12, 1, generator=g) @ torch.randn(1, 20, generator=g)       # rank 1
    grads = [torch.cat([M.reshape(-1) * (1 + 0.1 * t), torch.randn(12, generator=g)]) for t in range(4)]
    res = PM.powersgd_run(grads, shapes, rank=1, start=0, ef=False)
    assert all(res[t][0] < 1e-10 for t in range(4))
    # with EF on a full-rank matrix: error of A(M) vs M (<= 1), and the t-vs-g variant is reported too
    grads = [torch.randn(12 * 20 + 12, generator=g) for _ in range(6)]
    res = PM.powersgd_run(grads, shapes, rank=1, start=0, ef=True)
    assert all(0 < res[t][0] <= 1 for t in range(6)) and all(math.isfinite(res[t][2]) for t in range(6))


# -- the command ----------------------------------------------------------------------------------------------
def test_cli_writes_csv(tmp_path, capsys):
    out = tmp_path / "peers"
    rc = analyze_main(["peers", "iterations=40", "warmup=5", "L_t=15", "L_c=10", "rank=[2]", "K=[auto]",
                       "pool=[off]", "--out", str(out)])
    assert rc == 0
    df = pd.read_csv(out / "peers.csv")
    assert_csv_matches_record(df, "analysis_peers")        # what the flags' version wrote (issue 62)
    assert set(df["method"]) == {"QSGD 4-bit max", "QSGD 4-bit l2", "PowerSGD", "PowerSGD+EF",
                                 "PowerSGD+EF (t vs g)", "GradiVeQ K=auto lambda"}
    gvq = df[df["method"] == "GradiVeQ K=auto lambda"].iloc[0]
    assert bool(gvq["matched"]) and gvq["n_eval"] == 10
    assert df["err_mean"].map(math.isfinite).all()
    printed = capsys.readouterr().out
    assert "| r " in printed and "GradiVeQ K=auto lambda" in printed and "peers.csv" in printed


def test_cli_usage_lists_peers(capsys):
    assert analyze_main([]) == 2
    assert "peers" in capsys.readouterr().err
