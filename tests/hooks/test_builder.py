"""gvq/hooks/builder.py: every run's aggregator built from its node, and the one decision where it
averages (after backward, or inside it through DDP + the gvq hook)."""
from __future__ import annotations

import pytest

from gvq.aggregators.compressed import CompressedAggregator
from gvq.aggregators.ddp import DDPAggregator
from gvq.aggregators.powersgd import PowerSGDAggregator
from gvq.aggregators.rar import RingAllReduce
from gvq.hooks import Overlapped
from gvq.hooks.builder import aggregator_from
from gvq.hooks.config import build_aggregator
from gvq.schema.options import DDPSchema, knobs


def test_overlap_refuses_an_aggregator_outside_gvqs_ring():
    with pytest.raises(ValueError, match="overlap"):
        Overlapped(DDPAggregator(**knobs(DDPSchema)))
    with pytest.raises(ValueError, match="aggregator.overlap=true: DDPAggregator .*torch DDP overlaps by itself"):
        aggregator_from({"_target_": "gvq.aggregators.ddp.DDPAggregator", **knobs(DDPSchema), "overlap": True})


def test_the_run_decides_the_wrapping_and_no_ring_aggregator_sees_its_keys(compose_cfg):
    """aggregator_from: the aggregator itself after backward, or Overlapped (DDP's bucket size its own);
    torch DDP's options keep bucket_cap_mb; a hook's build is never wrapped."""
    post = aggregator_from(compose_cfg("aggregator=qsgd", "aggregator.bucket_cap_mb=0.5").aggregator)
    assert isinstance(post, CompressedAggregator) and not post.inside_backward
    assert not hasattr(post, "overlap") and not hasattr(post, "bucket_cap_mb")
    node = compose_cfg("aggregator=powersgd", "aggregator.overlap=true", "aggregator.bucket_cap_mb=0.5").aggregator
    over = aggregator_from(node)
    assert isinstance(over, Overlapped) and over.inside_backward and over.bucket_cap_mb == 0.5
    assert isinstance(over.inner, PowerSGDAggregator) and not hasattr(over.inner, "overlap")
    ddp = aggregator_from(compose_cfg("aggregator=ddp", "aggregator.bucket_cap_mb=0.5").aggregator)
    assert isinstance(ddp, DDPAggregator) and ddp.bucket_cap_mb == 0.5
    hooked = build_aggregator("rar", overlap=True, bucket_cap_mb=0.5)       # its caller's DDP wraps it
    assert type(hooked) is RingAllReduce
