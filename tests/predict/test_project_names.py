"""gvq/predict/project_names.py and the projection's reading of names: a report's or a frontier's name is the
calibration's where it names the same setting (``qsgd bits=4``, QSGD's default written out, is ``qsgd``),
never where a value differs (``powersgd``, rank 2, is not a calibrated ``powersgd rank=6``: refused in one
line naming both); a calibration without fp16 says that the gain over overlapped fp16 is left empty."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gvq.predict import __main__ as cli
from gvq.predict.project import _as_calibrated
from gvq.predict.project_names import calibrated_name, uncalibrated
from gvq.predict.structure import AGGREGATORS, entries


def test_a_name_is_found_under_the_calibrated_one_only_where_every_value_agrees():
    assert calibrated_name("qsgd bits=4") == "qsgd"                # the sweep wrote QSGD's default out
    assert calibrated_name("qsgd bits=2") == "qsgd bits=2"
    assert calibrated_name("powersgd rank=2") == "powersgd"        # PowerSGD's own default rank
    assert calibrated_name("powersgd rank=6") == "powersgd rank=6"
    assert calibrated_name("nosuch k=1") == "nosuch k=1"           # not an option: as given (not calibrated)
    # a method's setting as a frontier names it is no aggregator's: as given (a frontier's: left out), not a crash
    method = "topk_chunk diloco every=1 outer_lr=1 outer_momentum=0"
    assert calibrated_name(method) == method
    assert uncalibrated("powersgd", ["rar", "powersgd rank=6"]) == \
        "powersgd: not calibrated (the calibration priced powersgd rank=6)"
    assert uncalibrated("nosuch", ["rar"]) == "nosuch: not calibrated (have rar)"


def test_the_projection_renames_the_reports_names_and_says_a_missing_fp16(capsys):
    m = SimpleNamespace(aggregators=["qsgd", "qsgd bits=2"], cal={"settings": []})
    iters, spread, optional = _as_calibrated("cnn", m, {"qsgd bits=4": 150.0, "qsgd bits=2": 60.0},
                                             {"qsgd bits=4": 10.0}, frozenset({"qsgd bits=4"}))
    assert iters == {"qsgd": 150.0, "qsgd bits=2": 60.0} and spread == {"qsgd": 10.0}
    assert optional == frozenset({"qsgd"})
    out = capsys.readouterr().out
    assert "cnn: 'qsgd bits=4' is the calibrated 'qsgd'" in out
    assert "cnn: fp16 not calibrated: no gain over overlapped fp16 (margin left empty)" in out


def test_iterations_for_a_setting_the_calibration_did_not_price_are_refused_naming_both(monkeypatch, tmp_path, capsys):
    """A calibration of the default settings (conf/grid/calibration.yaml: PowerSGD at rank 6) named as
    ``calibrate`` names them; ``iterations_to_target=[powersgd=250]`` (a rank-2 run's) is one line naming
    the rank-6 setting it priced, never priced at rank 6's seconds (it was: calibrate named it ``powersgd``)."""
    have = list(entries(AGGREGATORS))
    assert "powersgd rank=6" in have and "powersgd" not in have
    model = SimpleNamespace(m=SimpleNamespace(aggregators=have, cal={"model": "cnn", "settings": []}))
    monkeypatch.setattr("gvq.predict.overlap.Overlap.load", lambda folder, pricing=None: model)
    with pytest.raises(SystemExit) as e:
        cli.main(["project", "overlap=true", "models=[cnn]", "--calibration", str(tmp_path), "--out", str(tmp_path),
                  "iterations_to_target=[rar=100,powersgd=250]"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        "iterations_to_target powersgd: not calibrated (the calibration priced powersgd rank=6); calibrate "
        "powersgd or give iterations for powersgd rank=6")
