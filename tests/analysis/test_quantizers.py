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
