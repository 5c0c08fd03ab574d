"""DDP's buckets and the backward profile of the overlap model (gvq/predict/buckets.py)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gvq.models import resnet20
from gvq.predict import buckets as B


def _torch_buckets(tensors, order, limits):
    """torch's own assignment as DDP's bucket rebuild calls it: tensors in the order their gradients
    came, labelled by their positions."""
    got, _ = dist._compute_bucket_assignment_by_size([tensors[i] for i in order], limits,
                                                     [False] * len(order), order)
    return [list(b) for b in got]


@pytest.mark.parametrize("cap_mb", [None, 0.25, 0.01])
def test_buckets_match_torchs_assignment_on_a_resnet(cap_mb):
    params = list(resnet20(num_classes=100).parameters())
    order = list(reversed(range(len(params))))          # gradients come last layer first
    nbytes = [p.numel() * p.element_size() for p in params]
    limits = B.bucket_limits(cap_mb)
    mine = B.assign_buckets(nbytes, order, limits)
    assert mine == _torch_buckets(params, order, limits)
    assert sorted(i for b in mine for i in b) == list(range(len(params)))


def test_default_buckets_open_with_ddps_small_first_bucket():
    assert B.bucket_limits(None) == [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 1024 * 1024]
    assert B.bucket_limits(0.5) == [512 * 1024]               # a set size: no small first bucket
    assert B.assign_buckets([4, 4, 4, 4, 4], [4, 3, 2, 1, 0], [4, 8]) == [[4], [3, 2], [1, 0]]


def test_a_scripted_order_is_followed_as_torch_follows_it():
    sizes = [400, 400, 400, 100, 1000, 4000, 4, 4]
    tensors = [torch.empty(k) for k in sizes]
    order = [7, 6, 4, 5, 3, 2, 0, 1]
    for limits in ([2000], [1000, 5000], [1600]):
        assert B.assign_buckets([4 * k for k in sizes], order, limits) == _torch_buckets(tensors, order, limits)


def test_backward_profile_orders_gradients_last_layer_first():
    prof = B.backward_profile("cnn", 8, 10, reps=2)
    n = len(prof["nbytes"])
    assert sorted(prof["order"]) == list(range(n))
    assert prof["order"][0] > prof["order"][-1]             # the classifier's gradient before the first conv's
    assert all(0.0 <= r <= 1.0 for r in prof["ready"])
    assert prof["ready"][prof["order"][-1]] >= prof["ready"][prof["order"][0]]
    assert all(len(prof[k]) == 2 for k in ("forward", "backward", "step"))


def test_bucket_shares_add_up_to_the_whole_gradient():
    from gvq.predict.structure import build_on_one_rank
    for name in ("rar", "fp16", "powersgd"):
        agg, numel = build_on_one_rank(name, "cnn", 10)
        nbytes = [p.numel() * 4 for p in agg.params]
        layout = B.assign_buckets(nbytes, list(reversed(range(len(nbytes)))), [2048])
        shares = B.bucket_shares(name, agg, layout, numel)
        assert len(shares) == len(layout) > 1
        assert sum(s["values"] for s in shares) == pytest.approx(1.0)
        for k in range(len(shares[0]["bytes"])):                # every ring's payload, bucket by bucket
            assert sum(s["bytes"][k] for s in shares) == pytest.approx(1.0, rel=0.02)
