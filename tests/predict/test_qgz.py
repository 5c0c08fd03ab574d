"""qgZ priced (gvq/predict/qgz.py): the stored round laid out on M x R sends, per rank and link class, the bytes
the code itself logs (``P2P.bytes_sent``, ``bytes_inter``: gvq/comm/alltoall_quant.py run in-process on every
rank of 2 x 2, 2 x 4 and a flat 4, its messages handed to a transport that drops them); the cost model prices
``aggregator=qgz`` on nodes and on a flat net, the table's byte columns are those bytes, and the time falls
as the inter-node link speeds up."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gvq.aggregators.base import RunContext
from gvq.comm.clock import Stopwatch
from gvq.comm.links import Cluster
from gvq.comm.p2p import P2P, _Done
from gvq.predict import cost_model as M
from gvq.predict import qgz as Q
from gvq.predict.alltoall import qgz_traffic
from gvq.predict.structure import bucket_rounds
from gvq.predict.table import row

SHAPES = ((3000,), (70,), (1900,))                      # 4,970 values: 77 buckets of 64 and a short one


def _aggregator(**overrides):
    from gvq.hooks.config import build_aggregator
    agg = build_aggregator("qgz", **{"compressor.bucket": 64, **overrides})
    agg.bind([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES], RunContext(0, 1))
    return agg


def _logged(agg, per: int, nodes: int, monkeypatch) -> list[tuple[int, int]]:
    """(bytes_sent, bytes_inter) of every rank after the code's qgZ, each rank run in turn in this process
    (the messages dropped: the bytes are counted where they are posted)."""
    monkeypatch.setattr(dist, "isend", lambda *a, **k: _Done())
    monkeypatch.setattr(dist, "irecv", lambda *a, **k: _Done())
    ring, out = agg.rings(tuple(range(len(SHAPES))), per * nodes)[0], []
    for rank in range(per * nodes):
        p2p = P2P(rank, per * nodes, cluster=Cluster(per))
        ring.run_(torch.randn(sum(np.prod(s) for s in SHAPES)), p2p, Stopwatch())
        out.append((p2p.bytes_sent, p2p.bytes_inter))
    return out


@pytest.mark.parametrize("per,nodes", [(2, 2), (2, 4), (1, 4)])
@pytest.mark.parametrize("wires", [{}, {"intra": "fp16", "gather": "fp32"}])
def test_the_layout_sends_the_bytes_the_code_logs_per_link_class(per, nodes, wires, monkeypatch):
    agg = _aggregator(**wires)
    rnd = bucket_rounds("qgz", agg, range(len(SHAPES)), nodes)[0]     # stored at N = M, as the cost model reads it
    got = qgz_traffic(Q.layout(rnd, per, nodes), rnd["intra"], rnd["gather"])
    assert list(zip(got["sent"].tolist(), got["inter"].tolist())) == _logged(agg, per, nodes, monkeypatch)
    agg.close()


def test_the_stored_round_is_the_flat_all_to_alls_pieces_and_the_codecs_units():
    agg = _aggregator()
    rnd = bucket_rounds("qgz", agg, range(len(SHAPES)), 4)[0]
    codec = agg.rings(tuple(range(len(SHAPES))), 4)[0].codec
    assert (rnd["kind"], rnd["intra"], rnd["gather"]) == ("qgz", "compressed", "compressed")
    assert sum(v for (v,) in rnd["vals"]) == 4970 and len(rnd["vals"]) == 4
    assert rnd["units"] == [[77, 64, codec.payload_nbytes(slice(0, 64))], [1, 42, codec.payload_nbytes(slice(0, 42))]]
    assert [b for (b,) in rnd["bytes"]] == [codec.payload_nbytes(q) for (q,) in rnd["segs"]]
    agg.close()


def test_a_codec_whose_payload_is_not_its_units_sum_is_refused_in_one_line(monkeypatch):
    agg = _aggregator()
    codec = agg.rings(tuple(range(len(SHAPES))), 2)[0].codec
    real = type(codec).payload_nbytes
    monkeypatch.setattr(type(codec), "payload_nbytes", lambda self, q: real(self, q) + 4)   # a header a payload
    with pytest.raises(ValueError, match=r"^gvq.predict: 'qgz': its codec's payloads are not the sums of"):
        bucket_rounds("qgz", agg, range(len(SHAPES)), 2)
    agg.close()


def test_the_cost_model_prices_qgz_on_nodes_and_flat(records_with_qgz):
    m = records_with_qgz
    inter = [M.aggregation(m, "qgz", 8, b, 1e-4, cluster=Cluster(4, 1e11, 1e-6)) for b in (1e7, 1e8, 1e9, 1e10)]
    assert all(np.isfinite(inter)) and all(x > y for x, y in zip(inter, inter[1:]))
    flat = [M.aggregation(m, "qgz", 8, b, 1e-4) for b in (1e7, 1e8, 1e9)]
    assert all(x > y for x, y in zip(flat, flat[1:]))
    # one rank a node on any intra link is the flat net: every message on the one link
    assert M.aggregation(m, "qgz", 8, 1e8, cluster=Cluster(1, 1e6)) == M.aggregation(m, "qgz", 8, 1e8)
    assert M.aggregation(m, "qgz", 8, 1e8, cluster=Cluster(4, 1e12)) < M.aggregation(m, "qgz", 8, 1e8)
    # a fragment (Streaming DiLoCo's 1/P): the same all-to-alls on its share of every piece
    assert M.aggregation(m, "qgz", 8, 1e7, fraction=0.25) < M.aggregation(m, "qgz", 8, 1e7)


def test_the_tables_byte_columns_are_the_logged_bytes_per_class(records_with_qgz):
    m = records_with_qgz
    rnd = m.struct["aggregators"]["qgz"]["2"][0]
    got = qgz_traffic(Q.layout(rnd, 4, 2), rnd["intra"], rnd["gather"])
    r = row(m, "qgz", 8, 1e9, 0.0, 1.0, 1.0, Cluster(4, 1e12))
    assert r["MB_per_rank"] == pytest.approx(got["inter"].mean() / 1e6)
    assert r["MB_intra_per_rank"] == pytest.approx((got["sent"] - got["inter"]).mean() / 1e6)
    flat = row(m, "qgz", 8, 1e9, 0.0, 1.0, 1.0)
    one = qgz_traffic(Q.layout(m.struct["aggregators"]["qgz"]["8"][0], 1, 8), "compressed", "compressed")
    assert flat["MB_per_rank"] == pytest.approx(one["sent"].mean() / 1e6) and "MB_intra_per_rank" not in flat
