"""The loop's guards (gvq/run/guards.py): the non-finite check's cost and exactness; raw communication
errors reported as a lost peer.  End-to-end NaN / overflow policies: tests/run/test_train.py."""
from __future__ import annotations

import pytest


def test_nonfinite_check_is_one_reduction_and_still_exact(monkeypatch):
    """The per-iteration non-finite check (gvq.run.guards.nonfinite) is a sum, not an elementwise
    isfinite scan (~40x the cost on a ResNet gradient), yet names NaN / +-Inf and ignores finite
    values whose sum overflows."""
    import torch

    from gvq.aggregators.base import Aggregator, RunContext
    from gvq.aggregators.rar import RingAllReduce
    from gvq.run import guards

    class _NoDist(RingAllReduce):
        def setup(self, params, ctx):          # the bucket only: no P2P, no process group
            self.params, self.ctx = list(params), ctx
            self.bucket = self._grad_bucket()

    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    agg = _NoDist(topology="ring")
    agg.setup(list(net.parameters()), RunContext(0, 1))
    ddp_like = Aggregator()                    # the contract's default: no flat buffer (torch DDP)

    calls = []
    real = torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: calls.append(t.numel()) or real(t))
    assert guards.nonfinite(net, agg) is None and guards.nonfinite(net, ddp_like) is None
    assert calls == []                         # finite gradient: no elementwise scan at all
    monkeypatch.setattr(torch, "isfinite", real)

    for bad in (float("nan"), float("inf"), -float("inf")):
        net[1].weight.grad[0, 1] = bad
        assert guards.nonfinite(net, agg) == "1.weight"
        assert guards.nonfinite(net, ddp_like) == "1.weight"
        net[1].weight.grad[0, 1] = 1.0
    net[0].bias.grad[0], net[1].bias.grad[0] = float("inf"), -float("inf")   # sum is NaN
    assert guards.nonfinite(net, agg) == "0.bias"
    net[0].bias.grad[0] = net[1].bias.grad[0] = 3e38                         # sum overflows, all finite
    assert guards.nonfinite(net, agg) is None and guards.nonfinite(net, ddp_like) is None


def test_a_raw_gloo_error_becomes_one_line_about_a_lost_peer():
    from gvq.comm.p2p import PeerLostError
    from gvq.run.guards import peer_lost
    raw = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:4242: "
                       "Connection reset by peer\nException raised from ...")
    got = peer_lost(raw, 2, 15)
    assert isinstance(got, PeerLostError) and str(got).startswith("rank 2: a collective got no answer within 15s")
    assert "\n" not in str(got) and "Connection reset by peer" in str(got)
    for other in (ValueError("timed out"), RuntimeError("shape mismatch"), KeyboardInterrupt()):
        assert peer_lost(other, 0, 15) is other                  # not a communication failure: unchanged
    lost = PeerLostError(1, "lost rank 0")
    assert peer_lost(lost, 1, 15) is lost


def test_an_aggregate_that_overflowed_is_skipped_or_named():
    """The backstop after aggregation (a compressor without a declared wire limit): same decision on
    every rank without a collective, since every rank holds the same aggregate."""
    import torch

    from gvq.aggregators.base import Aggregator
    from gvq.run.guards import aggregated_overflow
    net = torch.nn.Linear(3, 2)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    no_bucket = Aggregator()                   # no flat buffer: the per-parameter scan
    assert aggregated_overflow(net, no_bucket, 5, "error") is False
    net.bias.grad[1] = float("inf")
    assert aggregated_overflow(net, no_bucket, 5, "skip") is True
    with pytest.raises(FloatingPointError, match="aggregated gradient non-finite at iteration 5 \\(bias\\)"):
        aggregated_overflow(net, no_bucket, 5, "error")


def _watch(losses, num_classes=10):
    from gvq.run import guards
    ema, since, learned = float("nan"), None, False
    for it, loss in enumerate(losses):
        ema, since, learned = guards.track_chance(ema, since, learned, loss, it, num_classes)
    return ema, since


def test_a_loss_back_at_chance_to_the_end_is_a_collapse():
    import math

    from gvq.run import guards
    lnc = math.log(10)
    learned_then_lost = [2.4] * 5 + [0.5] * 100 + [lnc] * 100
    ema, since = _watch(learned_then_lost)
    assert 105 < since < 140                               # the smoothed loss reaches the band after the drop
    reason = guards.collapse_reason(ema, since, 205, 0.1, 10)
    assert reason and "\n" not in reason and f"since iteration {since}" in reason and "chance 0.100" in reason
    assert guards.collapse_reason(ema, since, 205, 0.6, 10) is None          # test accuracy says it learned
    ema, since = _watch([2.4] * 5 + [0.5] * 100 + [lnc] * 30 + [0.4] * 70)   # a stretch at chance, then back
    assert since is None and guards.collapse_reason(ema, since, 205, 0.1, 10) is None
    ema, since = _watch([2.4] * 5 + [0.5] * 190 + [lnc] * 10)                # too short a tail to call it
    assert guards.collapse_reason(ema, since, 205, 0.1, 10) is None
    ema, since = _watch([lnc, float("nan"), lnc] * 30)           # never left chance: the budget, not a collapse
    assert since is None and guards.collapse_reason(ema, since, 90, 0.1, 10) is None
    ema, since = _watch([2.4] * 5 + [0.5] * 50 + [lnc, float("nan")] * 100)   # NaN (a skipped step) is no reading
    assert since is not None and guards.collapse_reason(ema, since, 255, 0.1, 10)
    ema, since = _watch([4.0] * 50, num_classes=100)                       # ln 100 = 4.6: below the band
    assert since is None


def test_a_run_that_never_left_chance_is_named_once_long_enough():
    import math

    from gvq.run import guards
    lnc = math.log(10)
    reason = guards.never_learned_reason(False, lnc, 1200, 0.100, 10)
    assert reason and "\n" not in reason and "never left chance in 1200 iterations" in reason
    assert "final test accuracy 0.100, chance 0.100" in reason
    assert guards.never_learned_reason(True, lnc, 1200, 0.1, 10) is None         # it learned, then lost it
    assert guards.never_learned_reason(False, lnc, 1200, 0.35, 10) is None       # the test set says it learned
    assert guards.never_learned_reason(False, lnc, guards.NEVER_MIN - 1, 0.1, 10) is None   # too short to say
