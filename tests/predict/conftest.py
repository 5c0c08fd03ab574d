from __future__ import annotations

import pytest

from tests.helpers.shared import once_per_run


def pytest_collection_modifyitems(items):
    """A real calibration times messages between spawned loopback ranks: its tests are slow (make
    test-fast skips them; the cost curves and the schedule keep unit tests of their own)."""
    for item in items:
        if any(f.startswith("calibrated") for f in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
            # the first test to ask builds the calibration inside its own timeout: minutes on a quiet
            # 2-core VM (7.7 at most), more than the suite's 10 beside other work
            item.add_marker(pytest.mark.timeout(CALIBRATION_TIMEOUT_S))


#: the timeout of a test that reads a calibration fixture (pyproject.toml's 600 s for the others)
CALIBRATION_TIMEOUT_S = 2400


@pytest.fixture(scope="session")
def calibrated(tmp_path_factory):
    """A real calibration of the small CNN (every default aggregator), made once per test run: not
    package-scoped (make test's xdist workers take test files from every package in turn, and a package
    fixture is torn down whenever a worker leaves the package), and shared by the workers (``once_per_run``).
    Tests read it and never write into it."""
    from gvq.predict.calibrate import calibrate
    return once_per_run(tmp_path_factory, "predict", lambda root: calibrate("cnn", 32, 10, root / "cnn")) / "cnn"


#: the names the default calibration (``calibrated``) prices two of its settings under: conf/grid/calibration.yaml's
#: ``set`` is part of them
POWERSGD, GRADIVEQ = "powersgd rank=6", "gradiveq_bf16 pool=true target_ratio=8"

#: a family at two settings beside the overlapped baseline: what a projection over settings prices
SETTING_ENTRIES = ("fp16", "qsgd", "qsgd:compressor.bits=2")
SETTING_SHAPE = (3, 10, 10)              # three channels: a first layer, so a gradient, unlike the default's


@pytest.fixture(scope="session")
def calibrated_settings(tmp_path_factory):
    """A real calibration of the small CNN over :data:`SETTING_ENTRIES` on :data:`SETTING_SHAPE` inputs
    (not the CNN's default 1 x 8 x 8), with its overlap profile."""
    from gvq.predict.calibrate import calibrate
    from gvq.predict.calibrate_overlap import calibrate_overlap

    def build(root):
        calibrate("cnn", 32, 10, root / "cnn", aggregators=SETTING_ENTRIES, shape=SETTING_SHAPE)
        calibrate_overlap(root / "cnn", [], reps=3)
    return once_per_run(tmp_path_factory, "predict_settings", build) / "cnn"


@pytest.fixture(scope="session")
def records_with_qgz():
    """The recorded CNN calibration (tests/records/predict/cnn) with ``qgz`` beside its aggregators: its rounds
    stored from the real aggregator on the CNN's gradient (nothing timed), its codec priced by the recorded
    ``qsgd``'s curves (the same quantizer)."""
    import copy
    from pathlib import Path

    from gvq.predict import cost_model as M
    from gvq.predict.structure import build_on_one_rank, rounds, stored, structure_ns
    m = M.Calibrated.load(Path("tests/records/predict/cnn"))
    cal, struct = copy.deepcopy(m.cal), copy.deepcopy(m.struct)
    agg, numel = build_on_one_rank("qgz", cal["model"], cal["num_classes"], cal["settings"])
    assert numel == struct["numel"]
    struct["aggregators"]["qgz"] = {str(n): stored(rounds("qgz", agg, n)) for n in structure_ns()}
    struct["passes"]["qgz"] = agg.extra_passes()
    agg.close()
    cal["entries"]["qgz"], cal["measure"]["qgz"] = "qgz", cal["measure"]["qsgd"]
    cal["codecs"]["qgz"] = cal["codecs"]["qsgd"]
    return M.Calibrated(cal, struct)
