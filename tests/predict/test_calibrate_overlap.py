"""DDP's buckets and the backward profile of the overlap model (gvq/predict/calibrate_overlap.py)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gvq.models import resnet20
from gvq.predict import calibrate_overlap as B


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


def test_bucket_entries_hold_each_buckets_own_rings_adding_up_to_the_whole():
    from gvq.predict.structure import build_on_one_rank, rounds
    for name in ("rar", "fp16", "powersgd"):
        agg, numel = build_on_one_rank(name, "cnn", 10)
        nbytes = [p.numel() * 4 for p in agg.params]
        layout = B.assign_buckets(nbytes, list(reversed(range(len(nbytes)))), [2048])
        entries = B.bucket_entries(name, agg, layout, numel, ns=[2, 5])
        assert len(entries) == len(layout) > 1
        assert sum(e["values"] for e in entries) == pytest.approx(1.0)
        assert all(e["codec_factor"] == 1.0 and set(e["rounds"]) == {"2", "5"} for e in entries)
        for n in (2, 5):
            for e in entries:                                   # a bucket's rings average its own values
                for rnd in e["rounds"][str(n)]:
                    assert len(rnd["vals"]) == n and "codec" not in rnd
                    if name != "powersgd":                      # PowerSGD's rings carry P and Q, not values
                        assert sum(map(sum, rnd["vals"])) == round(e["values"] * numel)
            whole = [sum(map(sum, r["bytes"])) for r in rounds(name, agg, n)]
            for k, w in enumerate(whole):                       # every ring's payload, bucket by bucket
                sent = sum(sum(map(sum, e["rounds"][str(n)][k]["bytes"])) for e in entries)
                assert sent == pytest.approx(w, rel=0.02)


def test_a_gradiveq_bucket_is_cut_into_its_own_pieces_and_its_codec_timed():
    """A small GradiVeQ bucket has fewer pieces than the whole gradient's ring scaled down would give
    it (what the model replayed before), and its codec's own cost is measured against the curves."""
    from gvq.predict.calibrate import codec_costs
    from gvq.predict.structure import build_on_one_rank, rounds
    agg, numel = build_on_one_rank("gradiveq_bf16", "cnn", 10)
    nbytes = [p.numel() * 4 for p in agg.params]
    layout = B.assign_buckets(nbytes, list(reversed(range(len(nbytes)))), [1024])
    curves = codec_costs("gradiveq_bf16", agg, numel, reps=1)
    entries = B.bucket_entries("gradiveq_bf16", agg, layout, numel, curves, ns=[2])
    whole = rounds("gradiveq_bf16", agg, 2)[0]
    pieces = [sum(len(s) for s in e["rounds"]["2"][0]["vals"]) for e in entries]
    assert min(pieces) < sum(len(s) for s in whole["vals"])
    factors = [e["codec_factor"] for e in entries]               # measured ratios (this CNN's calls are
    assert all(0 < f < float("inf") for f in factors)            # too small for their size to tell)
    assert any(f != 1.0 for f in factors)


def test_a_language_models_backward_profile_and_compute_are_timed_on_token_windows():
    """gpt_tiny calibrates as the CNN does: its step on windows of its context's tokens (the cost model's
    projection of the transformer reads these), every parameter's gradient placed in backward, the tied
    embedding once."""
    from gvq.predict.calibrate import compute
    prof = B.backward_profile("gpt_tiny", 2, 256, reps=1)
    assert sum(prof["nbytes"]) == 4 * 834_304 and sorted(prof["order"]) == list(range(len(prof["nbytes"])))
    assert all(0.0 <= r <= 1.0 for r in prof["ready"]) and prof["backward"][0] > 0
    samples = compute("gpt_tiny", 2, 256, reps=2)
    assert len(samples) == 2 and 0 < samples[0] <= samples[1]
