"""``python -m gvq.predict table`` and ``project`` (gvq/predict/table.py): the model's figures from a stored
calibration, as the flags' version printed and wrote them before issue 62 typed its keys."""
from __future__ import annotations

from tests.helpers.records import RECORDS

from gvq.predict.__main__ import main


def test_the_table_from_a_stored_calibration_is_what_the_flags_version_printed(capsys):
    """tests/records/predict/cnn holds a calibration of the small CNN (rar, qsgd); predict_table.md what
    ``python -m gvq.predict --calibration DIR --world-size 2 4 --bandwidth 5e7 1e9 --compute-scale 1 0.16667``
    printed from it at 1615f19^.  The table is arithmetic on the stored files, so every figure is held."""
    main(["table", "--calibration", str(RECORDS / "predict" / "cnn"), "world_size=[2,4]", "bandwidth=[5e7,1e9]",
          "compute_scale=[1,0.16667]"])
    assert capsys.readouterr().out == (RECORDS / "predict_table.md").read_text()


def test_keys_and_the_calibration_flag_may_come_in_any_order(capsys):
    main(["world_size=[2]", "--calibration", str(RECORDS / "predict" / "cnn"), "bandwidth=[1e9]", "aggregators=[qsgd]"])
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.startswith("|   2 |")]
    assert len(rows) == 1 and "| qsgd " in rows[0] and "1e+09" in rows[0]


def test_the_projection_from_a_stored_calibration_is_what_the_flags_version_wrote(tmp_path):
    """``predict project`` on the same stored calibration writes the CSVs that ``python -m gvq.predict project
    --models cnn --calibration DIR --max-world-size 8`` wrote at 1615f19^ (tests/records/predict_*.csv)."""
    import pandas as pd

    main(["project", "models=[cnn]", "--calibration", str(RECORDS / "predict"), "max_world_size=8",
          "--out", str(tmp_path)])
    for name in ("projection", "crossovers"):
        got, want = pd.read_csv(tmp_path / f"{name}.csv"), pd.read_csv(RECORDS / f"predict_{name}.csv")
        pd.testing.assert_frame_equal(got, want, rtol=1e-9, check_dtype=False, obj=name)
