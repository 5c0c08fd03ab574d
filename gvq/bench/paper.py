"""The GradiVeQ paper's time table (sec. 4, Fig. 7b) in virtual time: ``python -m gvq.bench paper``
(``make paper-time``).

See docs/design.md#gvqbenchpaperpy for how it works and why.
"""
from __future__ import annotations

import csv
import os
import statistics
import subprocess
import sys
from pathlib import Path

from gvq.bench import BenchError, Progress
from gvq.schema.compose import load_grid
from gvq.schema.errors import ConfigError
from gvq.schema.tool import namespace

ROOT = Path(__file__).resolve().parents[2]          # cli.py and conf/ (an editable install's checkout)
#: the paper's table times a whole {L_t, L_c} cycle: GradiVeQ's monitor (on by default) must not cut the
#: compressed phase short on the synthetic data's gradients (the methods: conf/grid/paper.yaml)
UNINTERRUPTED = {m: ["aggregator.monitor_threshold=null"] for m in load_grid("paper").settings
                 if m.startswith("gradiveq")}
PAPER_RATIO = 850 / 650                             # RAR aggregation / computation, paper's CPU cluster
CALIBRATION_BPS = 5.0e7                             # the link of the calibration run (any: solved from it)
L_T = 100                                           # the preset's L_t


def job_dir(out: Path, world: int, bps: float, scale: float, method: str) -> Path:
    return out / f"N{world}-{bps / 1e6:g}Mbps-compute{scale:g}" / method


def run_job(out: Path, world: int, bps: float, scale: float, method: str, iters: int, extra=(),
            force: bool = False) -> Path:
    """One ``cli.py experiment=paper_time`` run (skipped if it completed before); its run dir."""
    run_dir = job_dir(out, world, bps, scale, method)
    if (run_dir / "summary.json").is_file() and not force:
        return run_dir
    cmd = [sys.executable, str(ROOT / "cli.py"), "experiment=paper_time", f"aggregator={method}",
           f"world_size={world}", f"net.bandwidth_bps={bps:g}", f"net.compute_scale={scale:g}",
           f"iterations={iters}", *UNINTERRUPTED.get(method, []), f"hydra.run.dir={run_dir}", *extra]
    env = dict(os.environ, WANDB_MODE="disabled")
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    return run_dir


def read_columns(run_dir: Path, skip: int = 2) -> dict[str, float]:
    """Medians after ``skip`` start-up iterations of compute_s, aggregate_s and bytes_sent in metrics.csv."""
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))[skip:]
    if not rows:
        raise BenchError(f"gvq.bench paper: {run_dir}/metrics.csv has no row after the first {skip}")
    return {k: statistics.median(float(r[k]) for r in rows) for k in ("compute_s", "aggregate_s", "bytes_sent")}


def solve_bandwidth(compute_s: float, aggregate_s: float, bytes_sent: float, bps: float,
                    ratio: float = PAPER_RATIO) -> float:
    """The link B at which aggregation = ratio x compute, given one run at ``bps``: aggregation = other +
    bits / B, where ``other`` = the measured aggregation beyond bits / bps (never negative)."""
    bits = 8.0 * bytes_sent
    other = max(aggregate_s - bits / bps, 0.0)
    budget = ratio * compute_s - other
    if budget <= 0:
        raise BenchError(f"gvq.bench paper: RAR's non-wire aggregation ({other:.3f} s) already exceeds "
                         f"{ratio:.3f} x compute ({compute_s:.3f} s): no link gives the paper's ratio")
    return float(f"{bits / budget:.3g}")


def calibrate_link(args, world: int = 6) -> float:
    """The paper's ratio is a fact about its 6-node cluster: solved at N = 6 whatever ``grid.world_sizes`` runs."""
    run_dir = run_job(args.out / "calibrate", world, CALIBRATION_BPS, 1.0, "rar", args.steady_iters, args.set,
                      args.force)
    m = read_columns(run_dir)
    bps = solve_bandwidth(m["compute_s"], m["aggregate_s"], m["bytes_sent"], CALIBRATION_BPS)
    print(f"gvq.bench paper: calibrated at N={world}, virtual time: compute {m['compute_s']:.3f} s, RAR "
          f"aggregation {m['aggregate_s']:.3f} s at {CALIBRATION_BPS / 1e6:g} Mbit/s ({m['bytes_sent'] / 1e6:.2f} MB "
          f"a rank) => {bps / 1e6:g} Mbit/s gives aggregation/compute = 850/650", flush=True)
    return bps


def bench_paper(cfg, paths):
    """``python -m gvq.bench paper [KEY=VALUE ...] [--out DIR]``: every cell's runs, then the report's table."""
    args = namespace(cfg, paths)
    g = args.grid
    args.methods, args.world_size, args.compute_scale, args.set = g["settings"], g["world_sizes"], \
        g["compute_scales"], g["set"]
    bad = [b for b in args.links if b != "auto" and not _positive(b)]
    if bad or not args.links:
        raise ConfigError(f"links={bad[0] if bad else '[]'}: each bit/s > 0 or auto")
    args.out = args.out.resolve()
    auto = calibrate_link(args) if args.calibrate or "auto" in args.links else None
    if args.calibrate:
        return auto
    links = [auto if b == "auto" else float(b) for b in args.links]
    jobs = [(world, bps, scale, method) for world in args.world_size for bps in links
            for scale in args.compute_scale for method in args.methods]
    settings, shown = [], Progress("paper", len(jobs))    # the calibration run is not a row of the table
    for world, bps, scale, method in jobs:
        iters = L_T + args.compressed_iters if method.startswith("gradiveq") else args.steady_iters
        settings.append(run_job(args.out, world, bps, scale, method, iters, args.set, args.force))
        shown.done(f"{method}, N={world}, {bps / 1e6:g} Mbit/s, compute x{scale:g} -> {settings[-1]}")
    subprocess.run([sys.executable, "-m", "gvq.report", "cycle", *map(str, settings), "--out",
                    str(args.out / "report")], check=True, cwd=ROOT)
    return links


def _positive(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False
