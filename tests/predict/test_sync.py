"""A method's syncs in the cost model (gvq/predict/sync.py) and ``gvq.predict utilization``, on the stored
calibration (tests/records/predict/cnn: rar and qsgd; nothing is timed here)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from gvq.predict import __main__ as cli
from gvq.predict import cost_model as M
from gvq.predict import sync as Y
from gvq.report.runs import Run
from gvq.schema.setting import canonical_named, method_name, split_named
from tests.helpers.records import RECORDS

CAL = RECORDS / "predict" / "cnn"


@pytest.fixture
def m():
    return M.Calibrated.load(CAL)


@pytest.mark.parametrize("name", ["rar", "qsgd"])
def test_every_step_is_todays_iteration(m, name):
    for n, bps in ((2, 5e7), (8, 1e9), (64, 1e6)):
        today, got = M.iteration(m, name, n, bps), Y.method_iteration(m, name, n, bps, Y.of_method("every_step"))
        for k in today:
            assert got[k] == pytest.approx(today[k], rel=1e-12)
    assert Y.of_method("") == Y.of_method("every_step") == Y.Sync()


@pytest.mark.parametrize("H", [10, 100])
def test_diloco_pays_one_blocking_sync_of_the_whole_vector_every_h_iterations(m, H):
    sync = Y.of_method(f"diloco every={H}")
    assert sync == Y.Sync(every=H)
    one, per = M.iteration(m, "qsgd", 8, 1e8), Y.method_iteration(m, "qsgd", 8, 1e8, sync)
    assert per["compute_s"] == one["compute_s"] and per["sync_s"] == one["aggregate_s"]
    assert per["iter_s"] - per["compute_s"] == pytest.approx((one["iter_s"] - one["compute_s"]) / H, rel=1e-12)
    rows = [Y.method_row(m, "qsgd", meth, 8, 1e8) for meth in ("every_step", f"diloco every={H}")]
    assert rows[1]["MB_per_rank_iter"] == pytest.approx(rows[0]["MB_per_rank_iter"] / H)


def test_streaming_moves_a_fragment_and_hides_tau_steps_of_compute(m):
    s = Y.Sync(every=100, fragments=4, delay=5)
    assert s.period == 25 and s.exposed(1.0, 0.1) == pytest.approx(0.5) and s.exposed(1.0, 0.3) == 0.0
    assert Y.Sync(every=8, fragments=4, delay=5).exposed(1.0, 0.1) == pytest.approx(0.8)   # at most a period hides
    whole, frag = M.aggregation(m, "rar", 4, 1e5), M.aggregation(m, "rar", 4, 1e5, fraction=0.25)
    assert frag == pytest.approx(whole / 4, rel=0.01)             # a slow link: the wire, a quarter of the bytes
    it = Y.method_iteration(m, "rar", 4, 1e5, s)
    c = it["compute_s"]
    assert it["sync_s"] == frag and it["exposed_s"] == pytest.approx(max(0.0, frag - 5 * c))
    assert it["iter_s"] == pytest.approx(c + (it["exposed_s"] + m.cal["measure"]["rar"] / 4) / 25)
    blocking = Y.method_iteration(m, "rar", 4, 1e5, Y.Sync(every=100, fragments=4))
    assert blocking["iter_s"] - it["iter_s"] == pytest.approx(5 * c / 25)
    assert M.aggregation(m, "qsgd", 4, 1e9, fraction=0.25) < M.aggregation(m, "qsgd", 4, 1e9)


def test_the_needed_link_gives_the_target_utilization_and_grows_with_it(m):
    assert Y.needed_bps(lambda b: b / (b + 1e6), 0.5) == pytest.approx(1e6, rel=1e-5)
    sync, last = Y.of_method("diloco every=100"), 0.0
    for target in (0.5, 0.8, 0.95):
        def util(b):
            it = Y.method_iteration(m, "rar", 8, b, sync)
            return it["compute_s"] / it["iter_s"]
        b = Y.needed_bps(util, target)
        assert util(b) == pytest.approx(target, abs=1e-4) and util(b * 0.99) < target and b > last
        last = b
    assert math.isnan(Y.needed_bps(lambda b: 0.4, 0.5))             # a floor no link removes


def test_a_name_with_its_method_round_trips_and_is_the_reports(m):
    name = Y.named("qsgd", "diloco every=100")
    assert name == "qsgd diloco every=100" and split_named(name) == ("qsgd", "diloco every=100")
    assert Y.of_method(split_named(name)[1]) == Y.Sync(every=100) and canonical_named(name) == name
    assert canonical_named("qsgd bits=2 diloco every=30 outer_lr=0.7") == "qsgd bits=2 diloco"   # defaults drop
    assert method_name("every_step") == "" and Y.named("rar", "every_step") == "rar"
    run = Run(CAL, "completed", "", "qsgd", ["aggregator=qsgd", "method=diloco", "method.every=100"], {}, None)
    assert run.named == name
    assert Y.method_row(m, "qsgd", "diloco every=100", 4, 1e8)["setting"] == name


def test_utilization_prints_the_links_and_what_is_measured(tmp_path, capsys):
    df = cli.main(["utilization", "--calibration", str(CAL), "world_size=8", "posting=false",
                   "methods=[every_step,diloco every=100]", "--out", str(tmp_path / "u.csv")])
    out = capsys.readouterr().out
    assert "# measured (cnn" in out and "# projected: N = 8" in out and "DDP on NCCL) left out" in out
    assert list(df["setting"]) == ["rar", "rar diloco every=100"]
    assert (df["x_dp@0.5"].iloc[1] > 50) and (df["0.5"] < df["0.8"]).all() and (df["0.8"] < df["0.95"]).all()
    assert pd.read_csv(tmp_path / "u.csv")["setting"].tolist() == ["rar", "rar diloco every=100"]


def test_project_with_methods_writes_their_projection(tmp_path, capsys):
    cli.main(["project", "models=[cnn]", "--calibration", str(RECORDS / "predict"), "max_world_size=8",
              "--out", str(tmp_path), "methods=[every_step,diloco every=30,diloco every=100]"])
    df = pd.read_csv(tmp_path / "projection_methods.csv")
    assert set(df["setting"]) == {"rar", "qsgd", "rar diloco", "qsgd diloco", "rar diloco every=100",
                                  "qsgd diloco every=100"}
    cell = df[(df["N"] == 8) & (df["link_bps"] == 1e8) & (df["compute_scale"] == 1)].set_index("setting")
    assert cell.loc["rar diloco", "every"] == 30
    assert cell.loc["rar diloco every=100", "iter_s"] < cell.loc["rar diloco", "iter_s"] < cell.loc["rar", "iter_s"]
    assert "# cnn, N = 8: seconds per iteration" in capsys.readouterr().out


def test_project_on_nodes_prices_workers_node(tmp_path, capsys):
    cli.main(["project", "models=[cnn]", "--calibration", str(RECORDS / "predict"), "max_world_size=8",
              "ranks_per_node=2", "--out", str(tmp_path), "methods=[every_step,diloco every=100 workers=node]"])
    df = pd.read_csv(tmp_path / "projection_methods.csv")
    assert sorted(df["N"].unique()) == [4, 8] and set(df["workers"]) == {"rank", "node"}
    cell = df[(df["N"] == 8) & (df["link_bps"] == 1e8) & (df["compute_scale"] == 1)].set_index("setting")
    node = cell.loc["rar diloco every=100 workers=node"]
    assert node["MB_per_rank_iter"] == pytest.approx(cell.loc["rar", "MB_per_rank_iter"] / 100)
    assert node["inner_s"] > 0 and node["MB_intra_per_rank_iter"] > cell.loc["rar", "MB_intra_per_rank_iter"]
    assert "# cnn, N = 8: seconds per iteration" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [
    (["methods=[diloco workers=node]"], "workers=node needs nodes of several ranks"),
    (["methods=[diloco evry=3]"], "methods: 'diloco evry=3'"),
    (["methods=[nosuch]"], "methods: 'nosuch'"),
    (["overlap=true", "methods=[every_step,diloco]"], "overlap=true prices a sync every step"),
])
def test_a_method_the_options_lack_is_refused_in_one_line(tmp_path, capsys, argv, says):
    with pytest.raises(SystemExit):
        cli.main(["project", "models=[cnn]", "--calibration", str(RECORDS / "predict"), "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1]


@pytest.fixture
def free(m):
    """The stored calibration with every vector pass and message free: only the links cost, so an iteration
    is its closed form."""
    return M.Calibrated({**m.cal, "msg": [0.0, 0.0], "vector": {k: [0.0, 0.0] for k in m.cal["vector"]}}, m.struct)


V = 4 * 15338                          # the stored CNN's fp32 vector, bytes


@pytest.mark.parametrize("per, nodes", [(2, 2), (4, 2)])
def test_workers_node_prices_the_nodes_ring_every_step_and_a_block_across_nodes_every_h(free, per, nodes):
    """DiLoCo every 10, workers=node, M x R on 1e10 bit/s inside a node, 1e8 between: each step the gradient's
    fp32 ring over R ranks (2(R-1)/R V bytes on the intra link); every 10 rar on V/R across M nodes
    (2(M-1)/M V/R on the inter link), then the blocks' all-gather ((R-1)/R V inside)."""
    from gvq.comm.links import Cluster
    cluster, intra, inter = Cluster(per, 1e10), 1e10, 1e8
    it = Y.method_iteration(free, "rar", per * nodes, inter, Y.of_method("diloco every=10 workers=node"),
                            cluster=cluster)
    inner = 2 * (per - 1) / per * V * 8 / intra
    sync = 2 * (nodes - 1) / nodes * V / per * 8 / inter + (per - 1) / per * V * 8 / intra
    assert it["inner_s"] == pytest.approx(inner, rel=1e-9) and it["sync_s"] == pytest.approx(sync, rel=1e-9)
    meas = free.cal["measure"]["rar"] / per
    assert it["iter_s"] == pytest.approx(it["compute_s"] + inner + (meas + sync) / 10, rel=1e-9)
    assert it["compute_s"] == pytest.approx(M.compute_phase(free, per * nodes))
    row = Y.method_row(free, "rar", "diloco every=10 workers=node", per * nodes, inter, cluster=cluster)
    assert row["setting"] == "rar diloco every=10 workers=node" and row["workers"] == "node"
    assert row["MB_per_rank_iter"] == pytest.approx(2 * (nodes - 1) / nodes * V / per / 10 / 1e6)
    assert row["MB_intra_per_rank_iter"] == pytest.approx((2 * (per - 1) / per * V + (per - 1) / per * V / 10) / 1e6)


def test_streaming_workers_node_moves_a_block_of_a_fragment_and_overlaps_tau_steps(free):
    """2 x 2, P = 2, tau = 1, every 10, a slow 1e6 bit/s between nodes: a sync is rar on V/4 across 2 nodes and
    the all-gather of V/2 inside, every 5 steps, exposed past one step's compute."""
    from gvq.comm.links import Cluster
    sync = Y.of_method("streaming_diloco every=10 fragments=2 delay=1 workers=node")
    it = Y.method_iteration(free, "rar", 4, 1e6, sync, cluster=Cluster(2, 1e10))
    one = V / 4 * 8 / 1e6 + V / 4 * 8 / 1e10
    assert it["sync_s"] == pytest.approx(one, rel=1e-9)
    assert it["exposed_s"] == pytest.approx(one - it["compute_s"], rel=1e-9)
    assert it["aggregate_s"] == pytest.approx(V * 8 / 1e10 + it["exposed_s"] / 5, rel=1e-9)


def test_workers_rank_on_nodes_is_hierarchical_and_workers_node_is_refused_on_the_flat_net(m):
    from gvq.comm.links import Cluster
    nodes = Cluster(2, 1e10)
    it = Y.method_iteration(m, "qsgd", 8, 1e8, Y.of_method("diloco every=10"), cluster=nodes)
    assert it["sync_s"] == M.aggregation(m, "qsgd", 8, 1e8, cluster=nodes) and it["inner_s"] == 0
    with pytest.raises(M.PredictError, match="workers=node needs nodes of several ranks"):
        Y.method_iteration(m, "rar", 8, 1e8, Y.of_method("diloco workers=node"))


def test_utilization_on_nodes_solves_the_link_between_nodes(capsys):
    df = cli.main(["utilization", "--calibration", str(CAL), "world_size=16", "ranks_per_node=8", "posting=false",
                   "methods=[every_step,diloco every=100 workers=node]"])
    out = capsys.readouterr().out
    assert "N = 16 as 2 nodes x 8" in out and "left out on nodes" in out
    assert list(df["workers"]) == ["rank", "node"] and (df["x_dp@0.5"].iloc[1] > 50)
    with pytest.raises(SystemExit):
        cli.main(["utilization", "--calibration", str(CAL), "world_size=16", "ranks_per_node=3"])
