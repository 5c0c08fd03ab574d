"""Ring structure (gvq/predict/structure.py): what the real segment functions send, per aggregator."""
from __future__ import annotations

import json

import pytest
import torch

from tests.predict.conftest import GRADIVEQ, POWERSGD


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
        g, = s["aggregators"][GRADIVEQ][n]
        assert g["kind"] == "additive" and len(g["vals"]) == int(n)
        assert sum(map(sum, g["vals"])) == numel and sum(map(sum, g["bytes"])) < 4 * numel
        assert max(len(seg) for seg in g["vals"]) <= 4                              # aggregator.pieces
        p, q2 = s["aggregators"][POWERSGD][n]
        assert (p["key"], q2["key"]) == (f"{POWERSGD}-P", f"{POWERSGD}-Q")


def test_a_buckets_rings_are_the_aggregators_per_bucket_rings():
    from gvq.predict.structure import bucket_rounds, build_on_one_rank, rounds
    for name, kinds in (("gradiveq_bf16", ["additive"]), ("powersgd", ["additive", "additive"]),
                        ("qsgd", ["reencode"])):
        agg, numel = build_on_one_rank(name, "cnn", 10)
        last = len(agg.params) - 1
        halves = [list(range(last, last // 2, -1)), list(range(last // 2, -1, -1))]   # as DDP: last layer first
        parts = [bucket_rounds(name, agg, b, 3) for b in halves]
        assert [[r["kind"] for r in p] for p in parts] == [kinds, kinds]
        assert all(len(r["vals"]) == 3 for p in parts for r in p)
        values = [sum(map(sum, p[0]["vals"])) for p in parts]
        assert sum(values) == numel or name == "powersgd"                       # P / Q: factors, not values
        whole = [sum(map(sum, r["bytes"])) for r in rounds(name, agg, 3)]
        for k, w in enumerate(whole):
            assert sum(sum(map(sum, p[k]["bytes"])) for p in parts) == pytest.approx(w, rel=0.02)


def test_an_aggregator_that_declares_no_rings_is_refused_in_one_line_never_priced_as_plain():
    """The rings the cost model prices are the ones the aggregator declares (Aggregator.rings): one that
    averages by its own means and declares none is refused, naming it, before anything is priced."""
    from gvq.aggregators.base import RunContext
    from gvq.aggregators.flat import FlatAggregator
    from gvq.predict.structure import rounds

    class OwnWay(FlatAggregator):
        name = "own_way"

        def average(self, bucket):
            bucket.flat.zero_()

    agg = OwnWay()
    agg.bind([torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(2))], RunContext(0, 1))
    with pytest.raises(ValueError) as e:
        rounds("own_way", agg, 4)
    assert str(e.value) == ("gvq.predict: aggregator 'own_way' (OwnWay) declares no rings (Aggregator.rings): "
                            "the cost model cannot price it")
    agg.close()


def test_qgz_is_stored_as_its_all_to_alls_not_as_a_ring():
    """qgZ's all-to-alls are priced (gvq/predict/qgz.py), no longer refused: stored as its own kind, with its
    wires and its codec's units (tests/predict/test_qgz.py has the layouts and their bytes)."""
    from gvq.aggregators.base import RunContext
    from gvq.hooks.config import build_aggregator
    from gvq.predict.structure import rounds
    agg = build_aggregator("qgz", intra="fp16")
    agg.bind([torch.nn.Parameter(torch.zeros(3, 2))], RunContext(0, 1))
    (rnd,) = rounds("qgz", agg, 4)
    assert (rnd["kind"], rnd["intra"], rnd["gather"], rnd["key"]) == ("qgz", "fp16", "compressed", "qgz")
    assert sorted(v for (v,) in rnd["vals"]) == [0, 0, 0, 6] and rnd["units"][0][:2] == [1, 6]   # one unit
    agg.close()


def test_the_priced_rings_are_the_ones_average_runs():
    """rar's and qsgd's declared rings at N: the segments the ring runs (plain equal, codec cuts)."""
    from gvq.aggregators.base import RunContext, equal_segments
    from gvq.hooks.config import build_aggregator
    from gvq.predict.structure import bucket_rounds
    params = [torch.nn.Parameter(torch.zeros(5000)), torch.nn.Parameter(torch.zeros(300))]
    for name in ("rar", "qsgd", "powersgd"):
        agg = build_aggregator(name)
        agg.bind(params, RunContext(0, 1))
        agg.start_iteration(100)                  # powersgd: past start_iter, compressing
        (first, *rest) = bucket_rounds(name, agg, [1, 0], 3)
        assert first["segs"] == [[s] if isinstance(s, slice) else s for s in agg.rings((0, 1), 3)[0].segs]
        if name == "rar":
            assert first["kind"] == "plain" and first["segs"] == [[s] for s in equal_segments(5300, 3)]
        if name == "powersgd":
            assert [first["key"], rest[0]["key"]] == ["powersgd-P", "powersgd-Q"]
        agg.close()


def test_stored_rings_are_checked_against_the_declared_ones(calibrated, tmp_path, capsys):
    """``python -m gvq.predict rings``: a fresh calibration's rings are the declared ones; one altered
    by hand (as a code change would make it stale) is named, and the command exits 1."""
    import json
    import shutil

    from gvq.predict import __main__ as cli
    from gvq.predict.structure import stale_rings
    total, stale = stale_rings(calibrated)
    assert total >= 5 * 4 and stale == []
    assert cli.main(["rings", "--calibration", str(calibrated)]) == total
    copy = tmp_path / "cal"
    shutil.copytree(calibrated, copy)
    s = json.loads((copy / "structure.json").read_text())
    s["aggregators"]["qsgd"]["4"][0]["bytes"][0][0] += 1
    (copy / "structure.json").write_text(json.dumps(s))
    assert stale_rings(copy)[1] == ["qsgd at N=4"]
    with pytest.raises(SystemExit) as e:
        cli.main(["rings", "--calibration", str(copy)])
    assert e.value.code == 1 and "differs: qsgd at N=4" in capsys.readouterr().out


def test_topk_is_priced_as_an_allgather_of_its_own_per_tensor_payload():
    """The cost model's bytes for top-k are its codec's payload for the model's layout (k per parameter,
    8 bytes each), one whole-vector round; the allgather forwards it N - 1 times, so what a rank sends and
    receives grows as N - 1 (gvq/predict/table.py's traffic, gvq/predict/schedule.py's gather_ring)."""
    import math
    from types import SimpleNamespace
    from gvq.predict.structure import build_on_one_rank, rounds
    from gvq.predict.table import traffic
    agg, numel = build_on_one_rank("topk", "cnn", 10)
    try:
        want = 8 * sum(max(1, math.floor(0.01 * p.numel())) for p in agg.params)
        by_n = {}
        for n in (2, 3, 4, 8):
            rnd, = rounds("topk", agg, n)
            assert rnd["kind"] == "allgather" and rnd["vals"] == [[numel]] and rnd["bytes"] == [[want]]
            by_n[str(n)] = [rnd]
        m = SimpleNamespace(struct={"aggregators": {"topk": by_n}})
        assert [traffic(m, "topk", n)[0] for n in (2, 3, 4, 8)] == [(n - 1) * want for n in (2, 3, 4, 8)]
    finally:
        agg.close()
