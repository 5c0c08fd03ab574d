from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items):
    """A real calibration times messages between spawned loopback ranks: its tests are slow (make
    test-fast skips them; the cost curves and the schedule keep unit tests of their own)."""
    for item in items:
        if "calibrated" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="package")
def calibrated(tmp_path_factory):
    """A real calibration of the small CNN (every default aggregator)."""
    from gvq.predict.calibrate import calibrate
    out = tmp_path_factory.mktemp("predict") / "cnn"
    calibrate("cnn", 32, 10, out)
    return out
