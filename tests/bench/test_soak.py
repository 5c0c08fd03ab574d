"""gvq/bench/soak.py end to end on a tiny run: random SIGKILLs of ranks under restarts=K, then rows and
non-time metrics equal to an uninterrupted run's, and the iterations each kill cost."""
from __future__ import annotations

import pytest

from gvq.bench import soak


@pytest.mark.slow
def test_the_soak_kills_ranks_and_loses_nothing():
    # a slow emulated link paces every iteration (a floor no machine beats: the link sleeps to its rate), so
    # the run cannot finish inside the soak's polling and jitter on a fast machine, leaving nothing to kill
    out = soak.main(["--kills", "2", "--every", "3", "--iterations", "30", "--seed", "1",
                     "--set", "model.width=8", "net=mbit50", "net.bandwidth_bps=2e6"])
    assert out["status"] == "completed" and out["rows_and_metrics_equal"]
    assert out["kills"] >= 1 and out["restarts"] == out["kills"]
    assert all(lost >= 0 for lost in out["iterations_lost"])
