"""method=streaming_diloco (gvq/methods/streaming_diloco.py) on 2 gloo ranks: with one fragment, no delay and
no mixing it is DiLoCo; with P fragments each syncs every H steps at its offset, sending its own block's
bytes; a delayed fragment lands τ steps after it was taken, mixed by α; a resume mid-period with a fragment
in flight is bitwise; world_size 1 runs; a misspelt or out-of-range knob is refused."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from hydra.errors import ConfigCompositionException

from gvq.aggregators.base import RunContext
from gvq.aggregators.rar import RingAllReduce
from gvq.methods.streaming_diloco import StreamingDiLoCo
from gvq.run.validate import ConfigError, validate
from gvq.schema.errors import describe
from tests.helpers.dist import run_ranks
from tests.helpers.launch import launch_job
from tests.methods.test_diloco import SMALL, _params, _runs, full_and_resumed

# -- through the training loop ---------------------------------------------------------------------------


def test_one_fragment_without_delay_or_mixing_equals_diloco(compose_cfg, tmp_path):
    """P = 1, τ = 0, α = 0, H = 3 with the outer Nesterov step: DiLoCo's run on the same batches (parameters
    within 1e-6 after 8 steps, losses within 1e-5 relative, the same sync rows and bytes).  4-bit QSGD on Δ
    (the paper's) trains too, sending fewer bytes than rar at the same syncs."""
    run = ["iterations=8", "eval_every=4", "checkpoint.every=7", "method.every=3"]
    one = ["method=streaming_diloco", "method.fragments=1", "method.delay=0", "method.alpha=0"]
    df = _runs(compose_cfg, tmp_path, {"diloco": [*run, "method=diloco"], "streaming": [*run, *one],
                                       "qsgd4": [*run, *one, "aggregator=qsgd", "aggregator.compressor.bits=4"]})
    for a, b in zip(_params(tmp_path / "diloco"), _params(tmp_path / "streaming")):
        assert torch.allclose(a, b, rtol=0, atol=1e-6), float((a - b).abs().max())
    a, b, q = df["diloco"], df["streaming"], df["qsgd4"]
    for col in ("train_loss", "test_loss"):
        x, y = a[col].dropna(), b[col].dropna()
        assert len(x) == len(y) and ((x - y).abs() <= 1e-5 * x.abs()).all(), col
    assert list(a.synced) == list(b.synced) == [int(it in (2, 5)) for it in range(8)]
    assert list(a.bytes_sent) == list(b.bytes_sent)
    assert list(q.synced) == list(b.synced) and q.train_loss.notna().all()
    assert (q.bytes_sent[q.synced == 1] < b.bytes_sent[b.synced == 1]).all()


def test_resume_mid_period_with_a_fragment_in_flight_equals_the_uninterrupted_run_bitwise(tmp_path):
    """H = 4, P = 2, τ = 1 (fragment 0 sent after iterations 1, 5, 9 and landing one step later, fragment 1
    after 3, 7, 11), SGD with momentum inside: checkpointed after iteration 5, with fragment 0's averaged Δ in
    flight, the resumed run writes the uninterrupted run's rows bitwise (times aside).  Losing the fragment
    in flight, a fragment's outer momentum or the global copy changes every loss after iteration 6."""
    run = ["method=streaming_diloco", "method.every=4", "method.fragments=2", "method.delay=1",
           "method.alpha=0.5", "iterations=12", "eval_every=4", *SMALL]
    a, b = full_and_resumed(tmp_path, run, 6)
    assert list(b.iteration) == list(range(12)) and list(b.synced) == [it % 2 for it in range(12)]
    pd.testing.assert_frame_equal(a, b)


def _steps(df: pd.DataFrame) -> pd.Series:
    """Each row's iteration time on the run's clock."""
    return df.wall_s.diff().fillna(df.wall_s[0])


def test_virtual_time_overlaps_a_fragments_sync_with_the_tau_steps_after_it(compose_cfg, tmp_path):
    """net.clock=virtual, H = 6, P = 3 (a fragment sent after iterations 1, 3, ..., 11), 13 steps so each
    lands inside the run (τ ≤ 1).  On a 250 kbit/s link a fragment's averaging (comm_s: ~45-70 ms) outlasts a
    step's compute (a few ms, several times that on a host busy with other work): τ = 0 waits for all of it
    (exposed_s ~ its bytes' wire time, on the send's row: the ring's CPU is the rank's one core's either way);
    τ = 1 hides the step between and exposes less, on the landing's row.  At 50 Mbit/s with τ = 2 the two steps' compute
    exceeds the averaging: nothing is exposed (within 0.1 ms).  Every row's time holds its compute and its
    aggregate_s, aggregate_s holds exposed_s, and the run's total is the sum of its rows' times (the
    final evaluation aside)."""
    base = ["method=streaming_diloco", "method.every=6", "method.fragments=3", "iterations=13", "eval_every=13",
            "net=mbit50", "net.latency_s=0", "net.clock=virtual"]
    slow_bps = 2.5e5                   # slower => the averaging outlasts a busy host's step by more
    slow = [*base, f"net.bandwidth_bps={slow_bps:g}"]
    df = _runs(compose_cfg, tmp_path, {"t0": [*slow, "method.delay=0"], "t1": [*slow, "method.delay=1"],
                                       "hide": [*base, "method.delay=2"]})
    t0, t1, hide = df["t0"], df["t1"], df["hide"]
    sent = t0.synced == 1
    assert list(sent) == [it % 2 == 1 and it < 13 for it in range(13)] and list(t1.synced) == list(sent)
    link = t0.bytes_sent[sent] * 8 / slow_bps
    assert (t0.comm_s[sent] >= 0.95 * link).all() and (t0.exposed_s[sent] >= 0.9 * link).all(), (t0.exposed_s, link)
    assert (t0.exposed_s[sent] <= t0.comm_s[sent] + 1e-6).all()
    lands = t1.iteration.isin(t1.iteration[sent] + 1)
    assert (t1.aggregate_s[sent] < 0.5 * link).all(), t1.aggregate_s    # a send costs its CPU, never the link
    assert (t1.exposed_s[~lands] == 0).all() and (t1.exposed_s[lands] > 0).all()
    assert (t1.exposed_s[lands].to_numpy() < t1.comm_s[sent].to_numpy() - 0.5 * t1.compute_s[lands].to_numpy()).all()
    assert t1.exposed_s.sum() < t0.exposed_s.sum() - 0.5 * t1.compute_s[lands].sum()
    between = hide.compute_s.rolling(2).sum().shift(-2)          # the compute of the 2 steps after each send
    lands = sent & between.notna()                               # (the last one lands after the run's end)
    assert (hide.comm_s[lands] < between[lands]).all(), (hide.comm_s[lands], between[lands])
    assert hide.exposed_s.max() <= 1e-4 and (hide.comm_s[sent] > 0).all()
    for name, d in df.items():
        step = _steps(d)
        total = json.loads((tmp_path / name / "summary.json").read_text())["wall_s"]
        assert step.sum() == pytest.approx(d.wall_s.iloc[-1], abs=1e-5), name
        assert 0 <= total - step.sum() <= 0.1 * total, (name, total, step.sum())
        # compute_s and aggregate_s are each the slowest rank's (maybe two ranks): each within the row
        assert (step >= d.compute_s - 1e-5).all() and (step >= d.aggregate_s - 1e-5).all(), name
        assert (d.aggregate_s >= d.exposed_s - 1e-6).all(), name


def test_world_size_1_runs(tmp_path):
    """The one-worker control: the average is the rank's own, every fragment still steps its outer copy."""
    code, summary = launch_job(tmp_path / "run", *SMALL, "world_size=1", "method=streaming_diloco",
                               "method.every=4", "method.fragments=2", "iterations=9", "eval_every=9")
    assert code == 0 and summary["status"] == "completed" and summary["replicas_identical"], summary
    assert summary["config"]["method"]["_target_"].endswith("StreamingDiLoCo")


# -- the method on a small model, probed between steps --------------------------------------------------

def _model() -> torch.nn.Module:
    torch.manual_seed(0)                       # the same start on every rank
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 6), torch.nn.Tanh(),
                               torch.nn.Linear(6, 3))


def _same_on_every_rank(t: torch.Tensor) -> bool:
    from gvq.run.guards import broadcast_
    ref = t.clone()
    broadcast_(ref, 0)
    same = torch.tensor([int(torch.equal(t, ref))])
    torch.distributed.all_reduce(same, op=torch.distributed.ReduceOp.MIN)
    return bool(same.item())


def _probe(rank, world, steps, every, fragments, delay, alpha):
    """Per iteration: bytes sent; per fragment, whether the ranks agree on its local values, whether its
    global copy moved, and whether the local values are α·before + (1 − α)·global after the step."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    agg = RingAllReduce(topology="ring")
    agg.setup(list(model.parameters()), RunContext(rank, world))
    method = StreamingDiLoCo(every=every, fragments=fragments, delay=delay, alpha=alpha)
    method.setup(list(model.parameters()), agg)
    rows = []
    for it in range(steps):
        g = torch.Generator().manual_seed(100 * rank + it)      # each rank its own data
        opt.zero_grad()
        x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        method.before_step(it)
        opt.step()
        before = [method.flat_local(f).clone() for f in range(fragments)]
        globals_before = [gl.detach().clone() for gl in method.globals_]
        stats = method.after_step(it)
        frags = []
        for f in range(fragments):
            local, gl = method.flat_local(f), method.globals_[f].detach()
            mixed = torch.allclose(local, alpha * before[f] + (1 - alpha) * gl, rtol=0, atol=1e-6)
            frags.append((_same_on_every_rank(local), not torch.equal(gl, globals_before[f]), mixed))
        rows.append((stats.get("bytes_sent", 0), stats.get("synced", 0), frags))
    agg.close()
    return {"rows": rows, "bounds": method.bounds, "numel": [method.flat_local(f).numel() for f in range(fragments)]}


def test_each_fragment_syncs_every_h_steps_at_its_offset_sending_its_own_bytes(tmp_path):
    """H = 6, P = 3 over 13 steps, τ = 0: the parameters (35, 7, 42, 6, 18, 3 values) cut into blocks of
    35, 49 and 27 values; fragment f syncs when (it + 1 − 2(f + 1)) % 6 == 0 (after iterations 1 and 7, 3 and
    9, 5 and 11), sending a 2-rank ring of its values (4 bytes each, each rank sending half twice) and nothing
    else; right after it the ranks agree on that fragment's values and its global copy moved, at no other step."""
    out = run_ranks(_probe, 2, tmp_path, 13, 6, 3, 0, 0.0)[0]
    assert out["bounds"] == [0, 1, 3, 6] and out["numel"] == [35, 49, 27]
    sent = {1: 0, 7: 0, 3: 1, 9: 1, 5: 2, 11: 2}
    for it, (nbytes, synced, frags) in enumerate(out["rows"]):
        f = sent.get(it)
        assert synced == int(f is not None), it
        assert nbytes == (0 if f is None else 4 * out["numel"][f]), (it, nbytes)
        assert [same for same, _, _ in frags] == [g == f for g in range(3)], it
        assert [moved for _, moved, _ in frags] == [g == f for g in range(3)], it


@pytest.mark.parametrize("alpha", [0.0, 0.25])
def test_a_delayed_fragment_lands_tau_steps_after_it_was_sent_mixed_by_alpha(tmp_path, alpha):
    """H = 6, P = 2, τ = 2: fragment 0 is sent after iteration 2 (bytes, synced) but its global copy moves and
    its local values become α·local + (1 − α)·global only after iteration 4; with α = 0 the ranks then agree
    on it, with α = 0.25 they still differ (each keeps a quarter of its own steps).  Fragment 1: sent at 5, lands at 7;
    fragment 0 again at 8."""
    out = run_ranks(_probe, 2, tmp_path, 9, 6, 2, 2, alpha)[0]
    rows = out["rows"]
    assert [synced for _, synced, _ in rows] == [int(it in (2, 5, 8)) for it in range(9)]
    lands = {4: 0, 7: 1}
    for it, (_, _, frags) in enumerate(rows):
        assert [moved for _, moved, _ in frags] == [lands.get(it) == g for g in range(2)], it
        assert [same for same, _, _ in frags] == [alpha == 0 and lands.get(it) == g for g in range(2)], it
        for g in range(2):
            if lands.get(it) == g:
                assert frags[g][2], (it, g)        # the merge rule, against the values before it


# -- the schema ------------------------------------------------------------------------------------------

def test_a_misspelt_key_is_refused_naming_the_right_one(compose_cfg):
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg("method=streaming_diloco", "method.fragmnts=2")
    assert describe(e.value).startswith("method.fragmnts: unknown key; did you mean method.fragments?")


@pytest.mark.parametrize("override,line", [
    ("method.fragments=0", "method.fragments=0: must be an integer in [1, method.every=30]"),
    ("method.delay=30", "method.delay=30: must be an integer in [0, method.every=30)"),
    ("method.alpha=1", "method.alpha=1.0: must be in [0, 1)"),
])
def test_an_out_of_range_knob_is_refused_in_one_line(compose_cfg, override, line):
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg("method=streaming_diloco", override))
    assert str(e.value).startswith(line)


def test_gradiveq_is_refused_for_more_than_one_fragment_and_taken_for_one(compose_cfg):
    """GradiVeQ refits its bases from whole-model samples: a fragment's sync leaves the other layers
    unsampled (a 3-fragment run went non-finite at iteration 4).  The launcher's preflight asks this."""
    from gvq.hooks.builder import aggregator_from
    gradiveq = aggregator_from(compose_cfg("aggregator=gradiveq").aggregator)
    with pytest.raises(ValueError) as e:
        StreamingDiLoCo(every=30, fragments=3).check(gradiveq)
    assert "aggregator=gradiveq fits its state from whole-model vectors" in str(e.value)
    StreamingDiLoCo(every=30, fragments=1).check(gradiveq)
    StreamingDiLoCo(every=30, fragments=3).check(aggregator_from(compose_cfg("aggregator=qsgd").aggregator))


def test_a_fragment_in_flight_at_a_checkpoint_keeps_what_is_left_of_its_averaging():
    """Virtual clock: a checkpoint stores an averaging in flight as the seconds left of it (a resumed process
    has a new clock) and the resumed method ends it that long after its own now; the wall clock has
    nothing left (it blocked at the send)."""
    from gvq.comm import clock
    try:
        for mode, left in (("virtual", 0.25), ("wall", None)):
            lane = clock.configure(mode)
            methods = []
            for _ in range(2):
                m = StreamingDiLoCo(every=4, fragments=2, delay=1)
                m.setup(list(_model().parameters()), RingAllReduce(topology="ring"))
                methods.append(m)
            done = None if left is None else lane.now() + left
            methods[0].pending = [(5, 0, torch.ones(3), done)]
            state = methods[0].state_dict()
            (saved,) = state["pending"]
            assert saved["left_s"] is None if left is None else saved["left_s"] == pytest.approx(left, abs=0.05)
            methods[1].load_state_dict(state)
            (due, f, delta, end), now = methods[1].pending[0], lane.now()
            assert (due, f, delta.tolist()) == (5, 0, [1.0] * 3)
            assert end is None if left is None else 0 < end - now <= left
    finally:
        clock.configure()


def _skip_a_landing(rank, world):
    model = _model()
    agg = RingAllReduce(topology="ring")
    agg.setup(list(model.parameters()), RunContext(rank, world))
    method = StreamingDiLoCo(every=4, fragments=2, delay=1)
    method.setup(list(model.parameters()), agg)
    in_flight = []
    for it in range(4):
        if it != 2:                           # the step skipped (nan_policy=skip): no after_step
            method.after_step(it)
        in_flight.append([(due, f) for due, f, _, _ in method.pending])
    agg.close()
    return in_flight


def test_a_fragment_due_at_a_skipped_step_lands_at_the_next(tmp_path):
    """H = 4, P = 2, τ = 1: fragment 0 is sent after iteration 1, due after 2; iteration 2 is skipped (its
    after_step never runs), so it lands after 3, when fragment 1 is sent (due after 4): nothing is left
    in flight for ever."""
    (rows,) = run_ranks(_skip_a_landing, 1, tmp_path)
    assert rows == [[], [(2, 0)], [(2, 0)], [(4, 1)]]
