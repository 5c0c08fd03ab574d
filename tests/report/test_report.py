"""gvq.report on a real 2-job sweep (rar, qsgd) plus derived runs: a second seed, an incomplete run (no
summary.json, truncated CSV) and a failed one.  Table values are recomputed here from the CSVs with the
csv module; the HTML is rendered by a headless Chromium when one is installed."""
from __future__ import annotations

import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gvq.report.__main__ import main as report_main
from tests.helpers.records import assert_csv_matches_record
from gvq.report.runs import ReportError, default_dirs

ROOT = Path(__file__).resolve().parents[2]
TARGET = 0.8
OUTPUTS = ("report.html", "table.csv", "table.md", "curves.png", "breakdown.png", "breakdown.csv", "frontier.png")


def _cli_env() -> dict:
    return {**os.environ, "WANDB_MODE": "disabled"}


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory) -> Path:
    """Two real jobs through the CLI: rar and qsgd, 2 ranks, 30 iterations."""
    out = tmp_path_factory.mktemp("report") / "sweep"
    cmd = [sys.executable, "cli.py", "-m", "aggregator=rar,qsgd", "world_size=2", "iterations=30",
           "eval_every=10", "logger=csv", "logger.progress=false", f"hydra.sweep.dir={out}"]
    res = subprocess.run(cmd, cwd=ROOT, env=_cli_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def _retag(run: Path, seed: int) -> None:
    """Make a copied run another seed of its group (overrides and summary say so)."""
    summary = json.loads((run / "summary.json").read_text())
    summary["overrides"] = summary["overrides"] + [f"seed={seed}"]
    (run / "summary.json").write_text(json.dumps(summary))


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def mixed(real_sweep, tmp_path_factory) -> Path:
    """The real sweep plus: rar seed 1 (rar's CSV, aggregate_s x1.5), an incomplete qsgd run, a failed one."""
    root = tmp_path_factory.mktemp("mixed") / "sweep"
    shutil.copytree(real_sweep, root)
    seed1 = root / "2"
    shutil.copytree(root / "0", seed1)
    _retag(seed1, 1)
    rows = _rows(seed1 / "metrics.csv")
    for r in rows:
        r["aggregate_s"] = str(float(r["aggregate_s"]) * 1.5)
        r["test_acc"] = str(float(r["test_acc"]) - 0.01) if r["test_acc"] else ""
    with open(seed1 / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    incomplete = root / "3"
    shutil.copytree(root / "1", incomplete)
    (incomplete / "summary.json").unlink()
    text = (incomplete / "metrics.csv").read_text().splitlines(keepends=True)
    (incomplete / "metrics.csv").write_text("".join(text[:13]) + text[13][:20])   # killed mid-row
    failed = root / "4"
    shutil.copytree(root / "1", failed)
    summary = json.loads((failed / "summary.json").read_text())
    (failed / "summary.json").write_text(json.dumps({
        "status": "failed", "reason": "RuntimeError: rank 1 exploded", "config": summary["config"],
        "job_type": "qsgd", "overrides": summary["overrides"] + ["aggregator.compressor.bits=2"]}))
    return root


@pytest.fixture(scope="module")
def built(mixed) -> tuple[Path, pd.DataFrame]:
    assert report_main([str(mixed), f"target_acc={TARGET}"]) == 0
    out = mixed / "report"
    return out, pd.read_csv(out / "table.csv")


def _row(table: pd.DataFrame, aggregator: str, status: str = "completed") -> pd.Series:
    hit = table[(table["aggregator"] == aggregator) & (table["status"] == status)]
    assert len(hit) == 1, table[["group", "aggregator", "status"]]
    return hit.iloc[0]


def _csv_stats(run: Path) -> dict:
    rows = _rows(run / "metrics.csv")
    evals = [r for r in rows if r["test_acc"]]
    hit = [r for r in evals if float(r["test_acc"]) >= TARGET]
    return {"final": float(evals[-1]["test_acc"]),
            "agg": statistics.fmean(float(r["aggregate_s"]) for r in rows),
            "iter": statistics.fmean(float(r["aggregate_s"]) + float(r["compute_s"]) for r in rows),
            "bytes": statistics.fmean(float(r["bytes_sent"]) for r in rows),
            "target": float(hit[0]["wall_s"]) - _startup(rows) if hit else math.nan}


def _startup(rows: list[dict]) -> float:
    """Iteration 0's seconds up to its end beyond the median step of its phase's later iterations."""
    later = [float(r["compute_s"]) + float(r["aggregate_s"]) for r in rows[1:] if r["phase"] == rows[0]["phase"]]
    return max(0.0, float(rows[0]["wall_s"]) - statistics.median(later))


@pytest.mark.slow
def test_report_writes_every_output(built):
    out, table = built
    for name in OUTPUTS:
        assert (out / name).stat().st_size > 0, name
    import matplotlib.image as mpimg
    for png in ("curves.png", "breakdown.png", "frontier.png"):
        assert mpimg.imread(out / png).std() > 0.01          # a drawn figure, not a blank canvas
    assert "final top-1" in (out / "table.md").read_text()
    assert len(table) == 4                                   # rar (2 seeds), qsgd, qsgd incomplete, failed
    assert_csv_matches_record(table, "report_table")         # the flags' version's columns and values (issue 62)


@pytest.mark.slow
def test_table_values_equal_the_csvs(built, mixed):
    _, table = built
    rar = [_csv_stats(mixed / "0"), _csv_stats(mixed / "2")]
    qsgd = _csv_stats(mixed / "1")
    r, q = _row(table, "rar"), _row(table, "qsgd")
    assert r["runs"] == 2 and q["runs"] == 1
    assert r["final_top1"] == pytest.approx(statistics.fmean(s["final"] for s in rar), rel=1e-9)
    assert r["final_top1_std"] == pytest.approx(statistics.stdev(s["final"] for s in rar), rel=1e-9)
    assert q["final_top1"] == pytest.approx(qsgd["final"], rel=1e-9)
    rar_agg = statistics.fmean(s["agg"] for s in rar)
    assert r["aggregate_s_per_iter"] == pytest.approx(rar_agg, rel=1e-9)
    assert q["aggregate_s_per_iter"] == pytest.approx(qsgd["agg"], rel=1e-9)
    assert q["aggregation_speedup"] == pytest.approx(rar_agg / qsgd["agg"], rel=1e-9)
    rar_iter = statistics.fmean(s["iter"] for s in rar)
    assert q["iteration_speedup"] == pytest.approx(rar_iter / qsgd["iter"], rel=1e-9)
    assert r["aggregation_speedup"] == pytest.approx(1.0)
    assert q["bytes_per_iter"] == pytest.approx(qsgd["bytes"], rel=1e-9)
    assert q["compression_ratio"] == pytest.approx(rar[0]["bytes"] / qsgd["bytes"], rel=1e-9)
    assert q["compression_ratio"] > 7                                   # 4-bit codes + bucket scales
    if math.isnan(qsgd["target"]):
        assert q["reached"] == "0/1"
    else:
        assert q["time_to_target_s"] == pytest.approx(qsgd["target"], rel=1e-9)
    assert q["compression_error"] > 0 and math.isnan(r["compression_error"])


@pytest.mark.slow
def test_failed_and_incomplete_runs_are_marked_not_dropped(built, mixed):
    out, table = built
    inc, bad = _row(table, "qsgd", "incomplete"), _row(table, "qsgd", "failed")
    assert "no summary.json" in inc["reason"] and "12/30 iterations" in inc["reason"]
    assert bad["reason"] == "RuntimeError: rank 1 exploded"
    assert math.isnan(inc["final_top1"]) and math.isnan(bad["final_top1"])
    md = (out / "table.md").read_text()
    assert "failed: RuntimeError: rank 1 exploded" in md and "incomplete: no summary.json" in md
    failed_line = next(line for line in md.splitlines() if "rank 1 exploded" in line)
    assert "—" in failed_line
    page = (out / "report.html").read_text()
    assert '<tr class="failed">' in page and '<tr class="incomplete">' in page
    assert "Not completed" in page and str(mixed / "3") in page and str(mixed / "4") in page


@pytest.mark.slow
def test_html_is_self_contained(built):
    page = (built[0] / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "<table" in page      # curves, breakdown, frontier
    assert 'id="time-to-target"' in page and 'id="frontier"' in page
    assert "DigitsCNN" in page and "world_size: 2" in page and "net: unshaped" in page
    assert "src=\"http" not in page and "src='http" not in page


@pytest.mark.parametrize("kind", ["empty", "not_runs", "missing"])
def test_no_runs_exit_2_with_one_line(tmp_path, capsys, kind):
    target = tmp_path / "d"
    if kind != "missing":
        target.mkdir()
    if kind == "not_runs":
        (target / "sub").mkdir()
        (target / "notes.txt").write_text("hello")
    assert report_main([str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gvq.report: error:") and len(err.splitlines()) == 1 and str(target) in err


@pytest.mark.slow
def test_cli_exit_2_without_traceback(tmp_path):
    res = subprocess.run([sys.executable, "-m", "gvq.report", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().startswith("gvq.report: error: no run dirs")


def test_default_dir_is_the_latest_sweep(tmp_path):
    runs = tmp_path / "runs"
    with pytest.raises(ReportError):
        default_dirs(runs)
    single = runs / "2026-01-01" / "10-00-00"
    (single / ".hydra").mkdir(parents=True)
    assert default_dirs(runs) == [single]
    for i, name in enumerate(("a", "b")):
        sweep = runs / "multirun" / name
        (sweep / "0" / ".hydra").mkdir(parents=True)
        (sweep / "multirun.yaml").write_text("{}")
        os.utime(sweep / "multirun.yaml", (1000 + 10 * (i == 0), 1000 + 10 * (i == 0)))
    assert default_dirs(runs) == [runs / "multirun" / "a"]


def test_the_default_report_skips_a_newer_sweep_dir_with_no_run_and_says_so(tmp_path, monkeypatch, capsys):
    """A sweep dir holding only multirun.yaml (an older gvq left one behind for a refused sweep) is not
    "the latest sweep": the report takes the latest sweep with a run, and names the one it skipped."""
    runs = tmp_path / "runs"
    older, empty = runs / "multirun" / "older", runs / "multirun" / "refused"
    _scripted_run(older / "0")
    empty.mkdir(parents=True)
    for sweep, t in ((older, 1000), (empty, 2000)):
        (sweep / "multirun.yaml").write_text("{}")
        os.utime(sweep / "multirun.yaml", (t, t))
    skipped = []
    assert default_dirs(runs, skipped) == [older] and skipped == [empty]
    monkeypatch.chdir(tmp_path)
    assert report_main([]) == 0
    err = capsys.readouterr().err
    assert f"skipped {Path('runs/multirun/refused')}: a sweep dir with no run in it" in err
    assert (Path("runs/multirun/older/report/table.csv")).is_file()


def _scripted_run(d: Path) -> None:
    """A finished rar run: summary.json and a 20-iteration metrics.csv."""
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"status": "completed", "job_type": "rar",
                                                "overrides": ["aggregator=rar"], "config": {"world_size": 2}}))
    rows = ["iteration,phase,compute_s,aggregate_s,bytes_sent,wall_s,train_loss,test_acc"]
    rows += [f"{i},rar,0.01,0.01,1000,{0.02 * (i + 1)},1.0,{0.5 if i % 10 == 9 else ''}" for i in range(20)]
    (d / "metrics.csv").write_text("\n".join(rows) + "\n")


@pytest.mark.parametrize("exp", ["quick_compare", "paper_orq"])
def test_presets_compose_and_sweep(compose_cfg, exp):
    cfg = compose_cfg(f"experiment={exp}", return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    assert "rar" in params.aggregator and "bingrad_b" in params.aggregator
    first = (ROOT / "conf" / "experiment" / f"{exp}.yaml").read_text().splitlines()
    assert first[0] == "# @package _global_" and "python cli.py -m experiment=" + exp in first[1]
    if exp == "paper_orq":
        assert cfg.iterations == 78125 and cfg.batch_size * cfg.world_size == 128
        assert cfg.model._target_.endswith("resnet56") and cfg.optim.schedule == "step"


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def _screenshot(base: list[str], page: Path, shot: Path) -> "np.ndarray":
    """``page`` as headless Chromium draws it (a 1200 x 4000 window: every figure of a small report), read
    back as RGB floats; fails naming Chromium's stderr where no screenshot came (never a timing assert: a
    busy machine only takes longer, up to the timeout)."""
    import matplotlib.image as mpimg
    res = subprocess.run(base + [f"--screenshot={shot}", "--window-size=1200,4000", page.resolve().as_uri()],
                         capture_output=True, text=True, timeout=300)
    assert shot.is_file(), res.stderr[-2000:]
    return mpimg.imread(shot)[..., :3]


@pytest.mark.slow
def test_report_renders_in_a_headless_browser(built, tmp_path):
    """report.html in a real browser: the page is drawn (not blank), its inlined figures load (the page
    differs from the same page without its <img> elements, by the figures' own pixels: qsgd's palette blue
    is there only with them), and the DOM holds the tables."""
    import re
    from gvq.schema.palette import colour_of
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium on this machine (CI installs Debian's chromium; here: apt-get install -y chromium)")
    html_path = built[0] / "report.html"
    bare = tmp_path / "bare.html"
    bare.write_text(re.sub(r"<img [^>]*>", "", html_path.read_text()))
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}"]
    pixels = _screenshot(base, html_path, tmp_path / "shot.png")
    without = _screenshot(base, bare, tmp_path / "bare.png")
    assert pixels.shape[0] >= 2000 and pixels.std() > 0.05                     # text and figures, not blank
    assert np.abs(pixels - without).mean() > 0.01                               # the figures drew something
    blue = np.array([int(colour_of("qsgd")[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    near = [int((np.abs(p - blue) <= 0.08).all(axis=-1).sum()) for p in (pixels, without)]
    assert near[0] > 100 and near[1] < near[0] / 10, near                        # qsgd's colour: in the figures
    dom = subprocess.run(base + ["--dump-dom", html_path.resolve().as_uri()], capture_output=True, text=True,
                         timeout=300).stdout
    assert dom.count("<img") == 3 and 'id="summary"' in dom and "rank 1 exploded" in dom
    assert 'id="time-to-target"' in dom and 'id="frontier"' in dom and "Accuracy-cost frontier" in dom


def test_peers_preset_sweeps_the_peers_unshaped(compose_cfg):
    """experiment=peers_compare: quick_compare's budget, every peer in the sweep, no emulated link
    (the emulator cannot slow DDP's collectives, so none is shaped)."""
    cfg = compose_cfg("experiment=peers_compare", return_hydra_config=True)
    assert cfg.hydra.sweeper.params.aggregator.split(",") == [
        "rar", "fp16", "qsgd", "gradiveq", "powersgd", "ddp", "ddp_fp16", "ddp_powersgd"]
    assert cfg.net.bandwidth_bps is None and cfg.world_size == 2 and cfg.iterations == 300
    assert cfg.dataset._target_.endswith("digits") or "digits" in str(cfg.dataset)


@pytest.mark.slow
def test_a_collapsed_seed_counts_with_its_group_and_is_marked(real_sweep, tmp_path):
    """A run whose loss went back to chance trained every iteration: its seed stays in its group's mean ±
    std (dropping it would flatter the method), and the table and curves say how many collapsed; the
    table's iterations to target are read off the CSV."""
    root = tmp_path / "sweep"
    shutil.copytree(real_sweep / "0", root / "0")
    shutil.copytree(real_sweep / "0", root / "1")
    _retag(root / "1", 1)
    summary = json.loads((root / "1" / "summary.json").read_text())
    summary.update(status="collapsed", reason="train loss back at chance since iteration 9 to the end")
    (root / "1" / "summary.json").write_text(json.dumps(summary))
    assert report_main([str(root), "target_acc=0.3"]) == 0
    table = pd.read_csv(root / "report" / "table.csv")
    assert len(table) == 1 and table.loc[0, "runs"] == 2 and table.loc[0, "collapsed"] == 1
    assert table.loc[0, "status"] == "completed" and not math.isnan(table.loc[0, "final_top1"])
    assert table.loc[0, "run_status"] == "completed 1/2, collapsed 1/2"
    assert "completed 1/2, collapsed 1/2: train loss back at chance" in (root / "report" / "table.md").read_text()
    evals = [r for r in _rows(root / "0" / "metrics.csv") if r["test_acc"]]
    hit = [int(r["iteration"]) + 1 for r in evals if float(r["test_acc"]) >= 0.3]
    if hit:
        assert table.loc[0, "iters_to_target"] == hit[0] and table.loc[0, "reached"] == "2/2"


@pytest.mark.parametrize("exp", ["fmnist_orq", "fmnist_gradiveq", "fmnist_compare", "fmnist_tta"])
def test_fashion_presets_compose_what_their_tables_need(compose_cfg, exp):
    """The Fashion-MNIST comparisons of docs/results.md: the data set, the sweep, and each paper's setting."""
    cfg = compose_cfg(f"experiment={exp}", return_hydra_config=True)
    first = (ROOT / "conf" / "experiment" / f"{exp}.yaml").read_text().splitlines()
    assert first[0] == "# @package _global_" and "python cli.py -m experiment=" + exp in "\n".join(first[:12])
    assert cfg.dataset._target_ == "gvq.data.fashion_mnist" and cfg.hydra.sweep.dir == f"runs/multirun/{exp}"
    aggs = cfg.hydra.sweeper.params.aggregator.split(",")
    if exp == "fmnist_orq":                          # Table 2: one worker, the quantizers without a level count
        assert cfg.world_size == 1 and aggs == ["rar", "bingrad_b", "bingrad_pb", "signsgd", "terngrad_unclipped"]
        assert cfg.hydra.sweeper.params.seed == "0,1,2"
    if exp == "fmnist_gradiveq":                     # sec. 4: the run ends in GradiVeQ's compressed phase
        assert aggs == ["rar", "qsgd", "gradiveq"] and cfg.world_size == 4 and cfg.model._target_.endswith("resnet20")
        assert (cfg.L_t, cfg.L_c) == (100, 400) and cfg.warmup + cfg.L_t + cfg.L_c == cfg.iterations
    if exp == "fmnist_compare":
        assert len(aggs) == 11 and "terngrad" in aggs and cfg.world_size == 4   # clipped: trains at the shared lr
    if exp == "fmnist_tta":                          # the overlap bench's options (PowerSGD at its rank: the header)
        from gvq.schema.compose import load_grid
        from gvq.schema.setting import Setting
        table = load_grid("overlap")                      # conf/grid/overlap.yaml
        assert sorted(aggs + ["powersgd"]) == sorted(table.settings) and cfg.hydra.sweeper.params.world_size == "4,8"
        powersgd = Setting.parse("powersgd", table.set).overrides
        assert "aggregator=powersgd " + " ".join(powersgd) in "\n".join(first[:12])
        assert cfg.warmup + cfg.L_t < cfg.iterations / 2 and cfg.warmup + cfg.L_t + cfg.L_c >= cfg.iterations


@pytest.mark.slow
def test_the_orq_table_quantizes_at_one_worker(tmp_path, fashion_root, monkeypatch):
    """world_size 1 (the ORQ paper's Table 2): every gradient is quantized before the step (an error is
    logged every iteration) though nothing crosses a wire."""
    from tests.helpers.launch import launch_job
    monkeypatch.setenv("GVQ_DATA", str(fashion_root))
    code, summary = launch_job(tmp_path / "run", "experiment=fmnist_orq", "aggregator=orq",
                               "aggregator.compressor.levels=3", "iterations=8", "eval_every=4",
                               "dataset.n_train=600", "logger.progress=false")
    assert code == 0 and summary["status"] == "completed", summary
    m = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert len(m) == 8 and (m.bytes_sent == 0).all() and (m.compression_error > 0.05).all()


@pytest.mark.parametrize("exp", ["fmnist_orq", "paper_orq"])
def test_the_orq_presets_sweep_the_papers_unclipped_terngrad(compose_cfg, exp):
    """TernGrad clips by default (it trains at N = 4 then); the ORQ paper's TernGrad does not, and its presets
    must keep reproducing that: each TernGrad in their sweep composes with clipping off."""
    aggs = compose_cfg(f"experiment={exp}", return_hydra_config=True).hydra.sweeper.params.aggregator.split(",")
    terngrads = [a for a in aggs if a.startswith("terngrad")]
    assert terngrads == ["terngrad_unclipped"]
    unclipped = compose_cfg(f"experiment={exp}", "aggregator=terngrad_unclipped").aggregator.compressor
    assert unclipped.clip is None and unclipped._target_ == "gvq.compressors.terngrad.TernGrad"
    assert compose_cfg(f"experiment={exp}", "aggregator=terngrad").aggregator.compressor.clip == 2.5


def test_report_html_carries_time_to_target_and_the_frontier(tmp_path):
    """report.html shows, beside the summary, each setting's time to the target and the accuracy-cost
    frontier (its table and figure), as ``--frontier`` would write them."""
    root = tmp_path / "sweep"
    for seed in (0, 1):
        _scripted_run(root / f"rar{seed}")
        run = root / f"q{seed}"
        _scripted_run(run)
        summary = json.loads((run / "summary.json").read_text())
        summary.update(job_type="qsgd", overrides=["aggregator=qsgd", f"seed={seed}"])
        (run / "summary.json").write_text(json.dumps(summary))
        (run / "metrics.csv").write_text((run / "metrics.csv").read_text().replace(",1000,", ",100,"))
    assert report_main([str(root), "target_acc=0.5"]) == 0
    page = (root / "report" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "Accuracy-cost frontier" in page
    ttt = page.split('id="time-to-target"', 1)[1].split("</table>", 1)[0]
    assert "iterations to acc 0.5" in ttt and "<td>2/2</td>" in ttt and "<td>10 ± 0</td>" in ttt
    front = page.split('id="frontier"', 1)[1].split("</table>", 1)[0]
    assert "qsgd" in front and "rar" in front and front.count("<td>yes</td>") == 2     # qsgd: cheaper, as good
