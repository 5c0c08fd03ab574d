"""The overlap model (gvq/predict/overlap.py): its lane arithmetic on scripted costs (no timing), and
one real calibration priced end to end."""
from __future__ import annotations

import pytest

from gvq.predict.overlap import BucketCost, Phases, replay_lanes

PH = Phases(forward=1.0, backward=4.0, step=0.5)       # backward runs from 1 to 5


def test_a_bucket_ready_before_the_lane_frees_waits_for_it():
    # bucket 0 ready at 1 + 4 x 0.25 = 2, averaged until 5; bucket 1 ready at 3 waits until 5
    out = replay_lanes(PH, [0.25, 0.5], [BucketCost(3.0, 0.0), BucketCost(1.0, 0.0)], shared=False)
    assert out["comm_s"] == pytest.approx(6.0 - 2.0)
    assert out["exposed_s"] == pytest.approx(6.0 - 3.0)            # its ring ends at 5 + 1
    assert out["aggregate_s"] == pytest.approx(6.0 - 5.0)
    assert out["iter_s"] == pytest.approx(6.0 + 0.5)


def test_a_bucket_ready_after_the_lane_frees_starts_at_its_ready_time():
    # bucket 0: 2 -> 2.5; bucket 1 ready at 4 (the lane idle since 2.5) -> 4.5; backward ends at 5
    out = replay_lanes(PH, [0.25, 0.75], [BucketCost(0.5, 0.0), BucketCost(0.5, 0.0)], shared=False)
    assert out["exposed_s"] == pytest.approx(0.5)
    assert out["aggregate_s"] == 0.0
    assert out["iter_s"] == pytest.approx(5.0 + 0.5)


def test_the_last_bucket_is_exposed_by_its_own_averaging_when_the_lane_is_free():
    out = replay_lanes(PH, [0.5, 1.0], [BucketCost(0.5, 0.0), BucketCost(2.0, 0.0, lane=0.25)], shared=False)
    assert out["exposed_s"] == pytest.approx(2.25)               # ready at 5, lane free since 3.5
    assert out["aggregate_s"] == pytest.approx(2.25)
    assert out["iter_s"] == pytest.approx(5.0 + 2.25 + 0.5)


def test_a_shared_core_delays_compute_by_the_ring_work_and_own_does_not():
    buckets = [BucketCost(1.0, 0.5), BucketCost(1.0, 0.5)]
    own = replay_lanes(PH, [0.25, 0.5], buckets, shared=False)
    shared = replay_lanes(PH, [0.25, 0.5], buckets, shared=True)
    assert own["compute_s"] == pytest.approx(5.0)
    assert shared["compute_s"] == pytest.approx(5.0 + 2 * 0.5)     # every bucket's work, owed by backward
    # bucket 0 starts at 2, before backward reaches 3: bucket 1 is handed over at 3.5, not 3
    assert shared["comm_s"] == pytest.approx((3.5 + 1.0) - 2.0)
    assert own["comm_s"] == pytest.approx((3.0 + 1.0) - 2.0)
    assert shared["iter_s"] == pytest.approx(6.0 + 0.5)


def test_work_not_yet_begun_delays_no_earlier_bucket():
    # bucket 1 starts only when the lane frees at 6: bucket 0's work delays bucket 1's hand-over, its
    # own does not (it begins after backward produced everything)
    out = replay_lanes(PH, [0.25, 0.5], [BucketCost(4.0, 1.0), BucketCost(1.0, 1.0)], shared=True)
    assert out["comm_s"] == pytest.approx((2.0 + 4.0 + 1.0) - 2.0)
    assert out["compute_s"] == pytest.approx(5.0 + 2.0)
    assert out["exposed_s"] == pytest.approx(7.0 - 4.0)           # bucket 1 handed over at 3 + 1


def test_ready_shares_are_taken_in_bucket_order():
    # DDP hands bucket 1 over after bucket 0 even if its gradients came first
    out = replay_lanes(PH, [0.5, 0.25], [BucketCost(0.0, 0.0), BucketCost(0.0, 0.0)], shared=False)
    assert out["comm_s"] == pytest.approx(0.0)


def test_the_finite_check_precedes_the_wait_for_the_last_bucket():
    out = replay_lanes(PH, [1.0], [BucketCost(1.0, 0.0)], shared=False, finite=0.25)
    assert out["aggregate_s"] == pytest.approx(0.75)
    assert out["iter_s"] == pytest.approx(6.0 + 0.5)


def test_a_calibrated_overlap_model_prices_every_aggregator_and_the_hosts_messages(calibrated, tmp_path):
    """calibrate-overlap on a real calibration: every aggregator's buckets priced from their own rings,
    at N ranks sharing this host's cores (``host_ranks``) and at a rank a core; an N not calibrated
    for the host, and an overlap.json from before buckets kept their rings, refused in one line."""
    import json
    import shutil

    from gvq.predict.calibrate_overlap import calibrate_overlap
    from gvq.predict.cost_model import PredictError, op_cost
    from gvq.predict.overlap import Overlap
    own_copy = tmp_path / "cnn"                   # the calibration is shared by the run's tests: read only
    shutil.copytree(calibrated, own_copy)
    calibrate_overlap(own_copy, [0.01], reps=2, host_ranks=[3])
    ov = Overlap.load(own_copy)
    host, own = ov.msg(3, True), ov.msg(3, False)
    assert min(host) >= 0 and sum(host) > 0 and own == tuple(ov.m.cal["msg"])   # a fit may put all in one term
    for name in ov.m.aggregators:
        for cap in ("default", "0.01"):
            got = ov.iteration(name, 3, 1e9, cap=cap, host=True)
            assert 0 < got["iter_s"] < 10 and got["buckets"] == len(ov.ov["buckets"][name][cap])
        post = ov.post_iteration(name, 3, 1e9, host=True)
        assert post["iter_s"] > ov.phases(3, 1.0).total
    _, plain = ov.bucket_costs("qsgd", 3, 1e9, 0.0, 1.0)
    ov.m.struct["passes"]["qsgd"] = 2                  # declared passes outside the rings: each bucket's
    ov.m.cache.clear()
    for b, got, e in zip(plain, ov.bucket_costs("qsgd", 3, 1e9, 0.0, 1.0)[1], ov.ov["buckets"]["qsgd"]["default"]):
        add = 2 * float(op_cost(ov.m.cal["vector"]["add"], e["values"] * ov.m.struct["numel"], 1.0))
        assert got.ring == pytest.approx(b.ring + add) and got.work == pytest.approx(b.work + add)
    ov.ov["host_msg"]["3"] = [own[0] + 1e-3, own[1]]             # dearer messages: dearer rings
    for price in (ov.iteration, ov.post_iteration):
        assert price("rar", 3, 1e9, host=True)["iter_s"] > price("rar", 3, 1e9, host=False)["iter_s"]
    with pytest.raises(PredictError, match=r"no message cost of 5 ranks on this host: run .*host_ranks=\[5\]"):
        ov.iteration("rar", 5, 1e9, host=True)
    stale = json.loads((own_copy / "overlap.json").read_text())
    for caps in stale["buckets"].values():
        for bs in caps.values():
            for b in bs:
                del b["rounds"]
    for f in ("calibration.json", "structure.json"):
        shutil.copy(calibrated / f, tmp_path / f)
    (tmp_path / "overlap.json").write_text(json.dumps(stale))
    with pytest.raises(PredictError, match="written before buckets kept their own rings"):
        Overlap.load(tmp_path)
