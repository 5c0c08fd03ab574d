"""``python -m gvq.predict table`` and ``project`` (gvq/predict/table.py): the model's figures from a stored
calibration, as the flags' version printed and wrote them before issue 62 typed its keys."""
from __future__ import annotations

import pytest

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


def _traffic_of(option: str, ns, **overrides) -> dict[int, float]:
    """Bytes a rank sends per aggregation at each N, from the rings ``option`` declares (a small layout)."""
    import torch
    from gvq.aggregators.base import RunContext
    from gvq.hooks.config import build_aggregator
    from gvq.predict import cost_model as M
    from gvq.predict.structure import rounds, stored
    from gvq.predict.table import traffic
    agg = build_aggregator(option, **overrides)
    agg.setup([torch.nn.Parameter(torch.zeros(s)) for s in ((40, 30), (30,), (400,))], RunContext(0, 1))
    try:
        struct = {"aggregators": {"x": {str(n): stored(rounds("x", agg, n)) for n in ns}}}
        return {n: traffic(M.Calibrated({}, struct), "x", n)[0] for n in ns}
    finally:
        agg.close()


def test_an_allgathers_bytes_grow_as_n_minus_1_payloads():
    """Each rank sends, and receives, the N - 1 other payloads: 8k each for top-k (k = 1% of each tensor)."""
    got = _traffic_of("topk", (2, 4, 8, 64))
    payload = 8 * (12 + 1 + 4)
    assert got == {n: (n - 1) * payload for n in (2, 4, 8, 64)}


def test_the_sparse_ring_is_priced_at_disjoint_supports_each_chunk_dense_from_one_half():
    """A segment of L values with k of a rank's entries: its chunk holds h k pairs after h ranks (8 bytes a
    pair, 4 a value once 2 h k >= L) plus a 4-byte header; each goes N - 1 times in the reduce-scatter
    (h = 1 .. N - 1) and N - 1 times whole (h = N).  Past N = L / 2k every summed chunk is dense, so the
    bytes a rank sends approach the dense ring's 2(N - 1)/N x 4n."""
    import numpy as np
    from gvq.predict import schedule as S
    numel, k = 1200 + 30 + 400, 0.1 * 1630
    got = _traffic_of("topk", (2, 4, 64), topology="sparse_ring", **{"compressor.ratio": 0.1,
                                                                      "compressor.scope": "global"})
    for n, sent in got.items():
        L = np.diff(np.linspace(0, numel, n + 1).round())
        kept = np.full(n, np.floor(k)) * L / numel
        assert sent == pytest.approx(S.sparse_traffic(kept, L, n)[0], rel=1e-9)
    assert got[2] == pytest.approx((4 + 8 * 81.5 + 4 + 8 * 163) * 2 / 2, rel=0.01)
    dense = 2 * 63 / 64 * 4 * numel
    assert dense < got[64] < 1.1 * dense
