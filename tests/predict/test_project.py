"""Projection (gvq/predict/project.py) and the default query CLI: a table, a heatmap, a CSV."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gvq.predict import __main__ as cli
from gvq.predict import cost_model as M
from gvq.predict import project


def test_default_query_prints_a_table(calibrated, capsys):
    df = cli.main(["--calibration", str(calibrated)])
    assert len(df) == 4 * 3 * 5 and set(df["bound"]) <= {"compute", "bandwidth", "latency", "codec"}
    assert (df[df["aggregator"] == "rar"]["speedup_vs_rar"] == 1).all()
    assert "predicted, virtual-time terms" in capsys.readouterr().out


def test_project_writes_heatmap_and_csv(calibrated, tmp_path):
    cli.main(["project", f"models=[{calibrated.name}]", "--calibration", str(calibrated.parent), "max_world_size=8",
              "--out", str(tmp_path)])
    df = pd.read_csv(tmp_path / "projection.csv")
    cells = df.drop_duplicates(["N", "link_bps", "compute_scale"])
    assert len(cells) == 3 * len(project.LINKS) * len(project.SCALES)            # N = 2, 4, 8
    fastest = df.loc[df.groupby(["N", "link_bps", "compute_scale"])["iter_s"].idxmin()]
    assert (fastest["aggregator"] == fastest["winner"]).all() and (cells["margin"] >= 1).all()
    assert (tmp_path / "projection_cnn.png").stat().st_size > 10_000
    cross = pd.read_csv(tmp_path / "crossovers.csv")
    assert len(cross) == 3 * len(project.SCALES) and "rar_bandwidth_bound_to_bps" in cross


def test_posting_false_projects_every_cell_with_messages_posted_free(calibrated, tmp_path):
    """``project posting=false`` (a NIC or NCCL posts the messages): each cell is the model's with the
    calibration's message cost zero, as ``utilization posting=false`` prices it; rar at N = 8 and 10 Gbit/s is
    message-bound here, so it is faster than with this host's posting."""
    cli.main(["project", f"models=[{calibrated.name}]", "--calibration", str(calibrated.parent),
              "max_world_size=8", "posting=false", "--out", str(tmp_path)])
    m = M.Calibrated.load(calibrated)
    free = M.Calibrated({**m.cal, "msg": [0.0, 0.0]}, m.struct)
    df = pd.read_csv(tmp_path / "projection.csv").set_index(["aggregator", "N", "link_bps", "compute_scale"])
    got = df.loc[("rar", 8, 1e10, 1.0), "iter_s"]
    assert got == pytest.approx(M.iteration(free, "rar", 8, 1e10)["iter_s"], rel=1e-9)
    assert got < M.iteration(m, "rar", 8, 1e10)["iter_s"]


def test_project_takes_the_folder_calibrate_wrote_as_its_calibration(calibrated, tmp_path, capsys):
    """``calibrate --out DIR`` then ``project models=[cnn] --calibration DIR``: DIR is the calibration (it
    was read as DIR/cnn, with advice to calibrate into DIR/cnn); a folder of calibrations (DIR/<model>, the
    default runs/predict/) reads as before (above); another model's calibration is refused in one line."""
    cli.main(["project", "models=[cnn]", "--calibration", str(calibrated), "max_world_size=4", "--out", str(tmp_path)])
    assert (tmp_path / "projection_cnn.png").stat().st_size > 10_000
    with pytest.raises(SystemExit):
        cli.main(["project", "models=[resnet32]", "--calibration", str(calibrated), "--out", str(tmp_path)])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        f"--calibration {calibrated}: a calibration of cnn, not resnet32: give models=[cnn], or the folder holding "
        "resnet32's calibration")


def test_crossing_is_interpolated_geometrically_between_links():
    r = pd.Series([3.0, 2.0, 0.5, 0.25], index=[1e6, 1e7, 1e8, 1e9])
    assert project._last_crossing(r) == pytest.approx(10 ** (7 + 1 / 1.5))
    assert np.isnan(project._last_crossing(pd.Series([2.0, 1.5], index=[1e6, 1e7])))     # pays everywhere
    assert np.isnan(project._last_crossing(pd.Series([0.5, 0.2], index=[1e6, 1e7])))     # never


class _ScriptedOverlap:
    """Stands for :class:`gvq.predict.overlap.Overlap`: iteration seconds by (aggregator, mode), with
    the link's speed-up on overlapped RAR only."""
    m = type("M", (), {"aggregators": ["rar", "fp16", "gradiveq_bf16"], "cal": {"model": "scripted"}})()
    POST = {"rar": 2.0, "fp16": 1.5, "gradiveq_bf16": 1.2}
    OVER = {"rar": 1.6, "fp16": 1.0, "gradiveq_bf16": 1.1}

    def post_iteration(self, name, n, bps, compute_scale=1.0):
        return {"iter_s": self.POST[name] * compute_scale}

    def iteration(self, name, n, bps, compute_scale=1.0, shared=True):
        fast = 0.25 if name == "rar" and bps >= 1e9 else 1.0
        return {"iter_s": self.OVER[name] * fast * compute_scale}


def test_overlap_projection_names_the_winning_mode_and_its_gain_over_overlapped_fp16():
    from gvq.predict.project import overlap_grid, overlap_winners
    df = overlap_grid(_ScriptedOverlap(), [8, 16], links=[5e7, 1e10], scales=[1.0, 0.5])
    assert len(df) == 2 * 2 * 2 * 3 * 2 and set(df["mode"]) == {"post", "overlap"}
    win = overlap_winners(df).set_index(["N", "link_bps", "compute_scale"])
    slow, fast = win.loc[(8, 5e7, 1.0)], win.loc[(16, 1e10, 0.5)]
    assert (slow["winner"], slow["runner_up"]) == ("fp16 overlap", "gradiveq_bf16 overlap")
    assert slow["margin"] == pytest.approx(1.0)
    assert slow["gradiveq_vs_rar"] == pytest.approx(1.6 / 1.1)
    assert fast["winner"] == "rar overlap" and fast["margin"] == pytest.approx(1.0 / 0.4)


def test_overlap_projection_ranks_by_time_to_accuracy_where_iterations_are_given():
    from gvq.predict.project import overlap_grid, overlap_winners
    df = overlap_grid(_ScriptedOverlap(), [8], links=[5e7], scales=[1.0])
    # fp16 overlapped is fastest per iteration (1.0 s) but needs 150 iterations; GradiVeQ 1.1 s x 100
    win = overlap_winners(df, {"fp16": 150, "gradiveq_bf16": 100}).iloc[0]
    assert win["winner"] == "fp16 overlap"
    assert win["tta_winner"] == "gradiveq_bf16 overlap" and win["tta_s"] == pytest.approx(110.0)
    assert win["tta_margin"] == pytest.approx(150.0 / 110.0)
    assert "tta_winner" not in overlap_winners(df).columns            # no iterations: no such ranking


@pytest.mark.parametrize("bad", ["rar", "rar=x", "rar=0"])
def test_iterations_to_target_are_refused_in_one_line(bad, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["project", "overlap=true", "--out", str(tmp_path), f"iterations_to_target=[{bad}]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(f"iterations_to_target {bad!r}: " + ("iterations must be > 0" if bad == "rar=0"
                                                                     else "expected AGGREGATOR=ITERATIONS (a number)"))


def test_the_projection_ranks_settings_by_their_names(calibrated_settings, tmp_path, capsys):
    """``project overlap=true iterations_to_target=[qsgd bits=2=80]``: a setting the calibration priced is
    ranked under its name beside its family's default; one it did not price is refused in one line, never
    left out of the ranking unseen."""
    main = cli.main
    # gvq's ring prices fp16 in both regimes (DDP on NCCL would take the GPU regime's cells from every setting)
    base = ["project", "overlap=true", "models=[cnn]", "--calibration", str(calibrated_settings.parent),
            "max_world_size=8", "--out", str(tmp_path), "baseline=gvq_ring"]
    # 2-bit: fewer bytes than 4-bit and (scripted here) fewer iterations: it wins every cell it is ranked in
    full = main([*base, "iterations_to_target=[fp16=150,qsgd=150,qsgd bits=2=60]"])
    assert set(full["tta_winner"]) <= {"qsgd bits=2 post", "qsgd bits=2 overlap"}
    assert (full["tta_margin"] > 1).all()
    assert (tmp_path / "projection_overlap_cnn.png").stat().st_size > 10_000     # one N, no GradiVeQ: no line
    assert "qsgd bits=2" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*base, "iterations_to_target=[qsgd bits=3=100]"])
    assert capsys.readouterr().err.strip().endswith(
        "cnn: iterations_to_target qsgd bits=3: not calibrated (the calibration priced qsgd, qsgd bits=2); "
        "calibrate qsgd bits=3 or give iterations for qsgd or qsgd bits=2")


def test_time_to_accuracy_names_the_modes_tied_with_the_winner_within_the_seed_spread():
    from gvq.predict.project import overlap_winners, overlap_grid
    df = overlap_grid(_ScriptedOverlap(), [8], links=[5e7], scales=[1.0])
    # GradiVeQ overlapped: 1.1 s x (100 +- 40) = 110 [66, 154]; GradiVeQ post 1.2 x 100 = 120 [72, 168] and
    # fp16 overlapped 1.0 x (150 +- 10) = 150 [140, 160] reach its band; fp16 post 1.5 x 150 = 225 [210, 240] does not
    win = overlap_winners(df, {"fp16": 150, "gradiveq_bf16": 100}, {"fp16": 10, "gradiveq_bf16": 40}).iloc[0]
    assert win["tta_winner"] == "gradiveq_bf16 overlap" and win["tta_s"] == pytest.approx(110.0)
    assert win["tta_tied"] == "gradiveq_bf16 post, fp16 overlap"
    assert overlap_winners(df, {"fp16": 150, "gradiveq_bf16": 100}).iloc[0]["tta_tied"] == ""   # no spread: none


def test_the_frontier_csv_gives_each_settings_iterations_where_every_seed_reached(tmp_path):
    from gvq.predict.project import frontier_iterations
    csv = tmp_path / "frontier.csv"
    pd.DataFrame({"setting": ["qsgd bits=2", "gradiveq", "powersgd rank=1", "rar"],
                  "iters_to_target": [140.0, 200.0, np.nan, 113.0], "iters_to_target_std": [20.0, 85.0, np.nan, 12.0],
                  "reached": ["3/3", "2/3", "0/1", "3/3"], "ranked": [True, True, False, True]}
                 ).to_csv(csv, index=False)
    iters, spread, left = frontier_iterations(csv)
    assert iters == {"qsgd bits=2": 140.0, "rar": 113.0} and spread == {"qsgd bits=2": 20.0, "rar": 12.0}
    assert left == ["gradiveq (reached in 2/3)", "powersgd rank=1 (unranked)"]
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(M.PredictError, match=r"--frontier .*other.csv: not a `gvq.report frontier` frontier.csv"):
        frontier_iterations(tmp_path / "other.csv")


def test_the_projection_reads_the_reports_frontier(calibrated_settings, tmp_path, capsys):
    """``project --overlap --frontier frontier.csv``: the report's setting names are the calibration's, so
    each calibrated setting is ranked with its seeds' iterations and its ties; a frontier setting the
    calibration lacks is left out and said so; a typed entry replaces the frontier's figure."""
    main = cli.main
    csv = tmp_path / "frontier.csv"
    pd.DataFrame({"setting": ["fp16", "qsgd", "qsgd bits=2", "rar"], "iters_to_target": [150.0, 150.0, 60.0, 100.0],
                  "iters_to_target_std": [10.0, 10.0, 5.0, 10.0], "reached": ["3/3"] * 4,
                  "ranked": [True] * 4}).to_csv(csv, index=False)
    base = ["project", "overlap=true", "models=[cnn]", "--calibration", str(calibrated_settings.parent),
            "max_world_size=8", "--out", str(tmp_path / "out"), "baseline=gvq_ring"]   # as above: settings vs settings
    full = main([*base, "--frontier", str(csv)])
    assert set(full["tta_winner"]) <= {"qsgd bits=2 post", "qsgd bits=2 overlap"} and "tta_tied" in full
    assert "cnn: left out: rar: not calibrated (have fp16, qsgd, qsgd bits=2)" in capsys.readouterr().out
    assert (tmp_path / "out" / "projection_overlap_tta_cnn.png").stat().st_size > 10_000   # settings ranked
    full = main([*base, "--frontier", str(csv), "iterations_to_target=[qsgd bits=2=1000]"])
    assert not any(str(w).startswith("qsgd bits=2") for w in full["tta_winner"])


def _recorded_overlap(tmp_path):
    """The recorded CNN calibration (rar, qsgd; nothing timed) with a bucketless ``overlap.json``: ``project
    overlap=true`` loads one, and on nodes prices nothing in it."""
    import json
    import shutil
    from tests.helpers.records import RECORDS
    folder = tmp_path / "cal" / "cnn"
    shutil.copytree(RECORDS / "predict" / "cnn", folder)
    profile = {"forward": [0.001], "backward": [0.002], "step": [0.0005], "ready": []}
    (folder / "overlap.json").write_text(json.dumps({"profile": profile, "buckets": {}, "host_msg": {}}))
    return folder


def test_time_to_target_on_nodes_is_iterations_times_the_two_level_post_backward_iteration(tmp_path, capsys):
    """``project overlap=true ranks_per_node=4 iterations_to_target=[...]``: every setting post-backward on
    the two-level net (the overlapped model prices flat rings), said in the table's head; time to the target =
    iterations x the hierarchical iteration's seconds (``cost_model.iteration``'s, as plain ``project
    ranks_per_node=4`` prices it), ranked by the flat net's rule."""
    from gvq.comm.links import Cluster
    folder = _recorded_overlap(tmp_path)
    full = cli.main(["project", "overlap=true", "ranks_per_node=4", "models=[cnn]", "max_world_size=16",
                     "--calibration", str(folder.parent), "--out", str(tmp_path), "baseline=gvq_ring",
                     "iterations_to_target=[rar=100,qsgd=300]"])
    assert "every setting post-backward" in capsys.readouterr().out
    assert sorted(full["N"].unique()) == [8, 16] and (full["nodes"] == full["N"] // 4).all()
    assert (full["baseline"] == project.NODE_BASELINE).all() and full["margin"].isna().all()
    m, nodes = M.Calibrated.load(folder), Cluster(4, 2.4e12)
    for _, cell in full.iterrows():
        want = {a: iters * M.iteration(m, a, cell["N"], cell["link_bps"], compute_scale=cell["compute_scale"],
                                       cluster=nodes)["iter_s"] for a, iters in (("rar", 100), ("qsgd", 300))}
        best = min(want, key=want.get)
        assert cell["tta_winner"] == f"{best} post" and cell["tta_s"] == pytest.approx(want[best], rel=1e-9)
        assert cell["winner_s"] == pytest.approx(min(M.iteration(m, a, cell["N"], cell["link_bps"], compute_scale=
                                                 cell["compute_scale"], cluster=nodes)["iter_s"] for a in want))
    assert (tmp_path / "projection_overlap_tta_cnn_nodes4.png").stat().st_size > 10_000
    # the hierarchical ring is not the flat one (a 1 Gbit/s link between nodes carries 1/4 of rar's bytes a rank)
    assert M.iteration(m, "rar", 16, 1e9, cluster=nodes)["iter_s"] < M.iteration(m, "rar", 16, 1e9)["iter_s"]


def test_time_to_target_without_overlap_is_refused_in_one_line(tmp_path, capsys):
    """The per-iteration projection has no time to the target: iterations given to it are refused, not ignored."""
    folder = _recorded_overlap(tmp_path)
    with pytest.raises(SystemExit):
        cli.main(["project", "ranks_per_node=4", "models=[cnn]", "--calibration", str(folder.parent),
                  "--out", str(tmp_path), "iterations_to_target=[rar=100]"])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("add overlap=true")


def test_a_cell_without_overlapped_fp16_takes_its_gain_over_fp16_post_backward():
    """On nodes nothing is overlapped (:func:`project.node_grid`): the gain is over fp16 post-backward, and a
    flat cell's stays over overlapped fp16."""
    nodes = pd.DataFrame({"aggregator": ["rar", "fp16", "qsgd"], "mode": ["post"] * 3, "iter_s": [2.0, 3.0, 1.5]})
    assert project._fastest(nodes)["margin"] == pytest.approx(3.0 / 1.5)
    flat = pd.concat([nodes, pd.DataFrame({"aggregator": ["fp16"], "mode": ["overlap"], "iter_s": [2.4]})])
    assert project._fastest(flat)["margin"] == pytest.approx(2.4 / 1.5)
