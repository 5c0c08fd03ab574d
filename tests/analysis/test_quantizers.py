"""The ORQ paper's quantization-error claims (gvq/analysis/quantizers.py) on synthetic gradients."""
from __future__ import annotations

from gvq.bench.quantizers import laplace_vector
from tests.helpers.grads import gaussian


def test_error_table_claims_and_plot_on_synthetic_gradients(tmp_path):
    from gvq.analysis.quantizers import check_claims, plot_errors, quantizer_error_table
    grads = [laplace_vector(8192, seed=s) for s in range(2)] + [gaussian(8192, 3)]
    df = quantizer_error_table(grads)
    assert {"QSGD-3", "Linear-5", "ORQ-9", "TernGrad", "SignSGD", "BinGrad-pb", "BinGrad-b"} <= set(df.method)
    assert df.loc[df.method == "TernGrad", "levels"].item() == 3
    assert ((df.error > 0) & (df.error < 100)).all()
    claims = check_claims(df)
    fitted = df[df.error_sorted.notna()].method.tolist()         # ORQ-s, Linear-s, BinGrad-b/pb
    assert len(fitted) == 8 and len(claims) == 7 + 8 and all(isinstance(h, bool) for _, h, _ in claims)
    held = {c: h for c, h, _ in claims}
    assert held["ORQ-5 error < QSGD-5 error"] and held["BinGrad-b error < BinGrad-pb error"]
    assert all(held[f"{m} sort-free fit within 1% of sorted"] for m in fitted)
    off = df.assign(error=df.error.where(df.method != "ORQ-9", df.error * 1.02))
    assert not {c: h for c, h, _ in check_claims(off)}["ORQ-9 sort-free fit within 1% of sorted"]
    flipped = df.assign(error=df.error.where(df.method != "ORQ-5", 1e9))
    assert not {c: h for c, h, _ in check_claims(flipped)}["ORQ-5 error < QSGD-5 error"]
    plot_errors(df, tmp_path / "errors.png")
    assert (tmp_path / "errors.png").stat().st_size > 1000


def test_the_command_on_recorded_gradients_writes_the_flags_versions_table(tmp_path):
    """``quantizers`` end to end (a short digits run's gradients, then the table and the plot): the columns,
    quantizers, levels and byte ratios the flags' version wrote (tests/records/analysis_quantizers.json,
    issue 62), and an error per quantizer."""
    import pandas as pd

    from gvq.analysis.__main__ import main
    from tests.helpers.records import assert_csv_matches_record
    assert main(["quantizers", "--out", str(tmp_path), "iterations=10", "every=5"]) == 0
    df = pd.read_csv(tmp_path / "quantizer_errors.csv")
    assert_csv_matches_record(df, "analysis_quantizers")
    assert (df.error > 0).all() and (tmp_path / "quantizer_errors.png").stat().st_size > 1000
