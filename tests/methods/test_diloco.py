"""method=diloco (gvq/methods/diloco.py) through the training loop on 2 gloo ranks: H = 1 with plain SGD and
an outer step of lr 1, momentum 0 equals every_step; replicas identical after every sync and apart between;
evaluation scores the synced (global) parameters whatever iteration it runs at; bytes, aggregation time and
virtual time only at syncs; world_size 1 runs every method; a resume mid-period is bitwise."""
from __future__ import annotations

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from gvq.aggregators.base import RunContext
from gvq.aggregators.rar import RingAllReduce
from gvq.methods.diloco import DiLoCo
from tests.helpers.dist import run_ranks
from tests.helpers.launch import launch_job

SMALL = ["logger=csv", "logger.progress=false", "model.width=4", "batch_size=16"]
TIMES = ["compute_s", "aggregate_s", "compress_s", "decompress_s", "wire_s", "stage_s", "wall_s", "real_wall_s",
         "tokens_per_second", "comm_s", "exposed_s"]


def full_and_resumed(tmp_path, run: list[str], checkpoint_every: int, times=TIMES):
    """``run`` uninterrupted with a checkpoint every ``checkpoint_every`` iterations, then resumed from it:
    both runs' metrics.csv less ``times`` (the columns a resume may not reproduce)."""
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    code, summary = launch_job(full, *run, f"checkpoint.every={checkpoint_every}")
    assert code == 0, summary
    code, summary = launch_job(resumed, *run, f"resume={full}")
    assert code == 0 and summary["replicas_identical"], summary
    return [pd.read_csv(r / "metrics.csv").drop(columns=times, errors="ignore") for r in (full, resumed)]


def _train_all(rank, world, cfgs, root):
    from gvq.run.train import train
    for name, cfg in cfgs.items():
        train(cfg, rank, world, f"{root}/{name}", {"run_dir": f"{root}/{name}"})


def _runs(compose_cfg, tmp_path, runs: dict) -> dict:
    """Each named run's metrics.csv, the runs trained one after another in one group of 2 ranks."""
    cfgs = {}
    for name, overrides in runs.items():
        cfgs[name] = OmegaConf.to_container(compose_cfg(*SMALL, *overrides), resolve=True)
        (tmp_path / name).mkdir()
    run_ranks(_train_all, 2, tmp_path, cfgs, str(tmp_path), timeout=240)
    return {name: pd.read_csv(tmp_path / name / "metrics.csv") for name in runs}


def _params(run) -> list[torch.Tensor]:
    from gvq.run import checkpoint
    return list(checkpoint.load(str(run), 0, 2)["model"].values())


def test_diloco_with_h_1_and_a_unit_outer_step_equals_every_step(compose_cfg, tmp_path):
    """Plain SGD (no momentum, no warm-up) inner; H = 1, outer lr 1, momentum 0: θ − lr·mean(g) as every_step,
    in float32 by another order of operations: the parameters after 7 steps within 1e-6, the losses within
    1e-5 relative.  A sign error in Δ, or a missed reset to the global copy, is far outside it."""
    sgd = ["optim.momentum=0", "optim.warmup_iters=0", "iterations=8", "eval_every=4", "checkpoint.every=7"]
    df = _runs(compose_cfg, tmp_path, {
        "every_step": sgd,
        "diloco": [*sgd, "method=diloco", "method.every=1", "method.outer_lr=1", "method.outer_momentum=0"]})
    for a, b in zip(_params(tmp_path / "every_step"), _params(tmp_path / "diloco")):
        assert torch.allclose(a, b, rtol=0, atol=1e-6), float((a - b).abs().max())
    for col in ("train_loss", "test_loss"):
        a, b = df["every_step"][col].dropna(), df["diloco"][col].dropna()
        assert len(a) == len(b) and ((a - b).abs() <= 1e-5 * a.abs()).all(), col
    assert (df["diloco"].synced == 1).all() and "synced" not in df["every_step"]


def test_syncs_bytes_and_evaluation_follow_the_schedule(compose_cfg, tmp_path):
    """H = 4 over 10 iterations (syncs after iterations 3 and 7; the run ends mid-period, and its end-of-run
    replica check still passes on the synced parameters).  bytes_sent, aggregate_s and wire_s are 0 on local
    steps, a ring's worth at syncs.  An evaluation at iteration 5 (mid-period) scores what one at 3 does:
    the global copy of the sync at 3, not this rank's drifted parameters; and the final one at 9, iteration 7's."""
    h4 = ["method=diloco", "method.every=4", "iterations=10"]
    df = _runs(compose_cfg, tmp_path, {"eval4": [*h4, "eval_every=4"], "eval6": [*h4, "eval_every=6"]})
    a, b = df["eval4"], df["eval6"]
    assert list(a.synced) == [int(it in (3, 7)) for it in range(10)]
    local, sync = a[a.synced == 0], a[a.synced == 1]
    assert (local[["bytes_sent", "aggregate_s", "wire_s"]] == 0).all().all() and set(local.phase) == {"local"}
    assert (sync.bytes_sent > 0).all() and (sync.aggregate_s > 0).all() and set(sync.phase) == {"rar"}
    assert a.test_loss.notna().tolist() == [it in (3, 7, 9) for it in range(10)]
    assert b.test_loss.notna().tolist() == [it in (5, 9) for it in range(10)]
    assert b.test_loss[5] == a.test_loss[3] and a.test_loss[9] == a.test_loss[7] == b.test_loss[9]
    assert a.train_loss.tolist() == b.train_loss.tolist()         # evaluating changed no training


def test_virtual_time_charges_a_ring_at_syncs_only(compose_cfg, tmp_path):
    """net.clock=virtual on a slow link (1 Mbit/s, no latency), H = 3 over 9 steps: a local step is a
    compute-only step (no bytes, no wire, aggregate_s 0, far below one sync's link time), and each third
    step adds its sync's modeled wire time: its bytes serialised on the rank's link (at N = 2 the ring's
    two halves go one after the other), plus the sync's own CPU (Δ, the ring, the outer step: a few ms).
    Nothing is special-cased: the clock charges what the ranks did (iteration 0 aside: its start-up)."""
    bps = 1e6
    df = _runs(compose_cfg, tmp_path, {"v": ["method=diloco", "method.every=3", "iterations=9", "eval_every=9",
                                             "net=mbit50", f"net.bandwidth_bps={bps}", "net.latency_s=0",
                                             "net.clock=virtual", "net.compute_scale=0.1667"]})["v"]
    step = df.wall_s.diff().fillna(df.wall_s[0])
    sync = df.synced == 1
    assert list(sync) == [it % 3 == 2 for it in range(9)]
    assert (df.loc[~sync, ["aggregate_s", "wire_s", "bytes_sent"]] == 0).all().all()
    link = df.bytes_sent[sync] * 8 / bps
    local = step[~sync & (df.iteration > 0)]
    added = step[sync] - local.median()
    assert (df.wire_s[sync] >= 0.95 * link).all() and (added >= 0.95 * link).all(), (added, link)
    assert (added <= link + 0.005).all(), (added, link)
    assert local.max() < 0.2 * link.min()


def _replicas_at_syncs(rank, world):
    from gvq.run.train import replicas_identical
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    agg = RingAllReduce(topology="ring")
    agg.setup(list(model.parameters()), RunContext(rank, world))
    method = DiLoCo(every=3)
    method.setup(list(model.parameters()), agg)
    out = []
    for it in range(7):
        g = torch.Generator().manual_seed(100 * rank + it)
        x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        method.before_step(it)
        opt.step()
        method.after_step(it)
        mine = [p.detach().clone() for p in model.parameters()]
        with method.synced_parameters(model):
            synced_same = replicas_identical(model)
        back = all(torch.equal(a, p) for a, p in zip(mine, model.parameters()))
        out.append((method.syncs(it), replicas_identical(model), synced_same, back))
    agg.close()
    return out


def test_replicas_are_identical_after_every_sync_and_the_synced_parameters_always(tmp_path):
    """AdamW inner, H = 3: after the syncs at 2 and 5 every rank holds bitwise the same parameters, between
    them they differ (each rank its own data); inside ``synced_parameters`` they agree at every iteration,
    and each rank's own parameters are back after it."""
    rows = run_ranks(_replicas_at_syncs, 2, tmp_path)[0]
    assert [s for s, _, _, _ in rows] == [False, False, True, False, False, True, False]
    assert [same for s, same, _, _ in rows] == [s for s, _, _, _ in rows]
    assert all(synced and back for _, _, synced, back in rows)


@pytest.mark.parametrize("method", ["every_step", "local_sgd", "diloco"])
def test_world_size_1_runs_every_method(tmp_path, method):
    """The one-worker control: every method trains on one rank (its average is the rank's own)."""
    code, summary = launch_job(tmp_path / "run", *SMALL, "world_size=1", f"method={method}", "method.every=3"
                               if method != "every_step" else "seed=0", "iterations=7", "eval_every=7")
    assert code == 0 and summary["status"] == "completed" and summary["replicas_identical"], summary
    assert summary["config"]["method"]["_target_"].endswith(
        {"every_step": "EveryStep", "local_sgd": "LocalSGD", "diloco": "DiLoCo"}[method])


def test_resume_mid_period_equals_the_uninterrupted_run_bitwise(tmp_path):
    """SGD with momentum inside, H = 4, outer Nesterov momentum: the run checkpointed after iteration 5 (two
    steps into a period), resumed there, writes the uninterrupted run's rows bitwise (times aside): the global
    copy, the outer momentum and the inner optimizer's state all came back (any one lost changes the sync at
    iteration 7 and every loss after)."""
    a, b = full_and_resumed(tmp_path, ["method=diloco", "method.every=4", "iterations=12", "eval_every=4", *SMALL], 6)
    assert list(b.iteration) == list(range(12)) and b.synced.sum() == 3
    pd.testing.assert_frame_equal(a, b)


RING_OPTIONS = ["fp16", "qsgd", "powersgd", "gradiveq", "signsgd"]


@pytest.mark.slow
def test_any_ring_aggregator_averages_the_pseudo_gradient(compose_cfg, tmp_path):
    """Δ through each family's ring (16-bit floats, 4-bit QSGD, PowerSGD's low rank, GradiVeQ's PCA, scaled
    signs), H = 3: the run completes with identical replicas on the synced parameters, sends bytes at syncs
    only, and each sync's bytes are its codec's, below rar's uncompressed ring (fp16 about half)."""
    short = ["method=diloco", "method.every=3", "iterations=9", "eval_every=9", "warmup=1", "L_t=2", "L_c=2"]
    df = _runs(compose_cfg, tmp_path, {name: [*short, f"aggregator={name}"] for name in ["rar", *RING_OPTIONS]})
    rar = df["rar"].bytes_sent.max()
    for name in RING_OPTIONS:
        d = df[name]
        assert (d.bytes_sent[d.synced == 0] == 0).all() and (d.bytes_sent[d.synced == 1] > 0).all(), name
        assert d.bytes_sent.max() <= rar and d.train_loss.notna().all(), name
    assert df["fp16"].bytes_sent.max() == pytest.approx(rar / 2, rel=0.05)


@pytest.mark.slow
def test_a_rank_killed_at_a_sync_restarts_from_mid_period_and_loses_nothing(tmp_path):
    """restarts=K with DiLoCo: rank 1 dies inside the sync of iteration 7 (H = 4); every rank restarts from
    the set written after iteration 5, mid-period, and the rows equal the uninterrupted run's (times aside)."""
    run = ["method=diloco", "method.every=4", "iterations=12", "eval_every=4", "checkpoint.every=6", *SMALL,
           "aggregator._target_=tests.helpers.faulty.FailAt", "+aggregator.how=exit", "+aggregator.once=true"]
    code, summary = launch_job(tmp_path / "full", *run, "+aggregator.at=999")
    assert code == 0, summary
    code, summary = launch_job(tmp_path / "killed", *run, "+aggregator.at=7", "restarts=1")
    assert code == 0 and summary["restarts"] == 1 and summary["resumed_from"] == [6], summary
    a, b = (pd.read_csv(tmp_path / r / "metrics.csv").drop(columns=TIMES, errors="ignore") for r in ("full", "killed"))
    pd.testing.assert_frame_equal(a, b)
