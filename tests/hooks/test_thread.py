"""gvq/hooks/thread.py in one process: buckets are handled in the order queued, a failure fails that
bucket and every queued and later one with a message naming the rank, close() joins the thread, and an
iteration's record adds times and weighs other columns by bucket size."""
from __future__ import annotations

import pickle
import threading

import pytest
import torch

from gvq.comm import clock
from gvq.comm.p2p import PeerLostError
from gvq.hooks.thread import BucketJob, CommThread, IterationRecord
from gvq.schema.columns import BY_NAME


def _job(index: int, n: int = 4, t_ready: float = 0.0) -> BucketJob:
    return BucketJob(torch.futures.Future(), torch.ones(n), [index], index, False, t_ready)


def test_buckets_are_handled_in_queue_order_and_close_joins():
    seen, gate = [], threading.Event()

    def reduce(job):
        gate.wait(5)                               # every bucket is queued before the first is handled
        seen.append(job.index)
        job.future.set_result(job.flat)

    t = CommThread(reduce, name="gvq-comm-test", label="rank 0: gvq hook", lanes=clock.Lanes())
    jobs = [_job(i) for i in range(5)]
    for j in jobs:
        t.submit(j)
    gate.set()
    assert all(torch.equal(j.future.wait(), torch.ones(4)) for j in jobs)
    t.close(5)
    assert seen == list(range(5)) and not t.thread.is_alive()


def test_a_failure_fails_this_queued_and_later_buckets_naming_the_rank():
    gate = threading.Event()

    def reduce(job):
        gate.wait(5)
        raise ValueError("codec broke")

    t = CommThread(reduce, name="gvq-comm-test", label="rank 3: gvq hook", lanes=clock.Lanes())
    first, queued = _job(0), _job(1)
    t.submit(first)
    t.submit(queued)
    gate.set()
    for j in (first, queued):
        with pytest.raises(RuntimeError, match="rank 3: gvq hook, bucket 0: ValueError: codec broke"):
            j.future.wait()
    later = _job(2)
    t.submit(later)
    with pytest.raises(RuntimeError, match="codec broke"):
        later.future.wait()
    t.close(5)
    assert not t.thread.is_alive()


def test_a_rank_error_reaches_backward_as_it_is():
    """A failure that names its rank already (a lost peer) is not wrapped a second time."""
    lost = PeerLostError(2, "lost rank 3")

    def reduce(job):
        raise lost

    t = CommThread(reduce, name="gvq-comm-test", label="rank 2: gvq hook", lanes=clock.Lanes())
    job = _job(0)
    t.submit(job)
    with pytest.raises(PeerLostError) as e:
        job.future.wait()
    assert (e.value.rank, str(e.value)) == (2, "rank 2: lost rank 3")
    assert pickle.loads(pickle.dumps(e.value)).rank == 2
    t.close(5)


def test_an_iteration_record_adds_amounts_by_their_declared_unit_and_weighs_other_columns():
    rec = IterationRecord(iteration=7)
    rec.add(1.0, 30, {"aggregate_s": 0.5, "compression_error": 0.1, "fit_s": 0.125, "phase": "compress"})
    rec.add(2.0, 10, {"aggregate_s": 0.25, "compression_error": 0.5, "fit_s": 0.25, "phase": "compress"})
    rec.t_done, rec.t_start_last = 2.5, 2.2
    out = rec.result()
    assert out["buckets"] == 2 and out["averaging_s"] == pytest.approx(0.75) and "aggregate_s" not in out
    assert out["fit_s"] == pytest.approx(0.375)            # seconds by the registry, whatever the name
    assert set(out) <= set(BY_NAME)                         # declared columns only
    assert out["compression_error"] == pytest.approx((30 * 0.1 + 10 * 0.5) / 40)
    assert out["comm_s"] == pytest.approx(1.5) and out["exposed_s"] == pytest.approx(0.5)
    assert out["last_bucket_s"] == pytest.approx(0.3)
    with pytest.raises(KeyError, match="not a declared column"):
        rec.add(3.0, 1, {"aggregate_s": 0.1, "made_up": 1.0})
