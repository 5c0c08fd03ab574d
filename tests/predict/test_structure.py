"""Ring structure (gvq/predict/structure.py): what the real segment functions send, per aggregator."""
from __future__ import annotations

import json


def test_structure_matches_each_aggregators_ring(calibrated):
    s = json.loads((calibrated / "structure.json").read_text())
    numel = s["numel"]
    for n in ("2", "6", "16"):
        rar, = s["aggregators"]["rar"][n]
        assert rar["kind"] == "plain" and sum(map(sum, rar["vals"])) == numel
        assert sum(map(sum, rar["bytes"])) == 4 * numel
        fp16, = s["aggregators"]["fp16"][n]
        assert fp16["kind"] == "reencode" and sum(map(sum, fp16["bytes"])) == 2 * numel
        q, = s["aggregators"]["qsgd"][n]
        assert q["kind"] == "reencode" and sum(map(sum, q["bytes"])) < numel      # 4 bits + norms
        g, = s["aggregators"]["gradiveq_bf16"][n]
        assert g["kind"] == "additive" and len(g["vals"]) == int(n)
        assert sum(map(sum, g["vals"])) == numel and sum(map(sum, g["bytes"])) < 4 * numel
        assert max(len(seg) for seg in g["vals"]) <= 4                              # aggregator.pieces
        p, q2 = s["aggregators"]["powersgd"][n]
        assert (p["key"], q2["key"]) == ("powersgd-P", "powersgd-Q")
