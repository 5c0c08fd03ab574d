from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def calibrated(tmp_path_factory):
    """A real calibration of the small CNN (every default aggregator; ~30 s on 2 cores)."""
    from gvq.predict.calibrate import calibrate
    out = tmp_path_factory.mktemp("predict") / "cnn"
    calibrate("cnn", 32, 10, out)
    return out
