"""gvq/predict/project_names.py and the projection's reading of names: the report's name of a calibrated
default (``qsgd bits=4``) is found as the calibration's (``qsgd``), and a calibration without fp16 says that
the gain over overlapped fp16 is left empty."""
from __future__ import annotations

from types import SimpleNamespace

from gvq.predict.project import _as_calibrated
from gvq.predict.project_names import calibrated_name

HAVE = ("fp16", "qsgd", "qsgd bits=2")


def test_a_setting_that_restates_its_options_defaults_is_found_under_the_calibrated_name():
    assert calibrated_name("qsgd bits=4", HAVE) == "qsgd"          # the sweep wrote QSGD's default out
    assert calibrated_name("qsgd bits=2", HAVE) == "qsgd bits=2"
    assert calibrated_name("qsgd bits=3", HAVE) == "qsgd bits=3"   # not priced: the caller says so
    assert calibrated_name("nosuch k=1", HAVE) == "nosuch k=1"
    # the calibration's own settings are the defaults its bare names mean
    assert calibrated_name("powersgd rank=6", ("powersgd",), ["powersgd:aggregator.rank=6"]) == "powersgd"
    assert calibrated_name("powersgd rank=6", ("powersgd",), ["powersgd:aggregator.rank=2"]) == "powersgd rank=6"


def test_the_projection_renames_the_reports_names_and_says_a_missing_fp16(capsys):
    m = SimpleNamespace(aggregators=["qsgd", "qsgd bits=2"], cal={"settings": []})
    iters, spread, optional = _as_calibrated("cnn", m, {"qsgd bits=4": 150.0, "qsgd bits=2": 60.0},
                                             {"qsgd bits=4": 10.0}, frozenset({"qsgd bits=4"}))
    assert iters == {"qsgd": 150.0, "qsgd bits=2": 60.0} and spread == {"qsgd": 10.0}
    assert optional == frozenset({"qsgd"})
    out = capsys.readouterr().out
    assert "cnn: 'qsgd bits=4' is the calibrated 'qsgd'" in out
    assert "cnn: fp16 not calibrated: no gain over overlapped fp16 (margin left empty)" in out
