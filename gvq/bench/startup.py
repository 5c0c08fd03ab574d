"""What a short run pays before and after it trains: ``python -m gvq.bench startup``.

Runs ``python cli.py world_size=2 iterations=1 logger=<csv|wandb>`` (wandb offline) as a user would, in a
fresh subprocess, ``reps`` times per setting, with the ranks forked from the warm fork server
(``forkserver``, the default) or spawned as fresh interpreters (``spawn``, ``GVQ_START_METHOD=spawn``),
side by side in one run.  The split comes from the start-up stamps every run writes into summary.json
(``startup``: gvq/run/logs.py ``mark``), all on the wall clock:

* ``imports``: interpreter start, Hydra, torch, composing the config (the launcher, up to ``launch()``)
* ``data``: the launcher's checks that need the data set and model (preflight)
* ``proc_start``: asking for the ranks until rank 0 runs (waiting for the fork server's imports, the fork;
  or, spawned, a new interpreter importing torch and gvq)
* ``rendezvous``: ``init_process_group`` through the run dir's file store
* ``build``: a rank's data, model, optimizer and aggregator
* ``log_init``: the CSV opened, wandb initialised (rank 0)
* ``train``: the iteration(s) themselves (first step included: lazy imports show here)
* ``teardown``: summary, wandb's finish, the ranks' exit, the launcher's join and exit
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gvq.bench import Progress

ROOT = Path(__file__).resolve().parents[2]
PHASES = [("imports", None, "main"), ("data", "main", "spawn"), ("proc_start", "spawn", "rank_start"),
          ("rendezvous", "rank_start", "rendezvous"), ("build", "rendezvous", "built"),
          ("log_init", "built", "logger"), ("train", "logger", "trained"), ("teardown", "trained", None)]


def one_run(run_dir: Path, world: int, logger: str, method: str, iterations: int = 1) -> dict:
    """Start the CLI once; returns its total wall seconds and the phases' (``PHASES``)."""
    env = dict(os.environ, GVQ_START_METHOD=method, WANDB_MODE="offline", WANDB_SILENT="true")
    cmd = [sys.executable, str(ROOT / "cli.py"), f"world_size={world}", f"iterations={iterations}",
           f"logger={logger}", "logger.progress=false", f"hydra.run.dir={run_dir}"]
    t0 = time.time()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    t_end = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    stamps = {**json.loads((run_dir / "summary.json").read_text())["startup"], None: None}
    def at(k, edge):
        return stamps[k] if k is not None else edge
    row = {p: at(b, t0) - at(a, t0) if a else at(b, t0) - t0 for p, a, b in PHASES[:-1]}
    row["teardown"] = t_end - stamps["trained"]
    return {**row, "total": t_end - t0}


def measure_startup(world: int, loggers: list[str], methods: list[str], reps: int) -> list[dict]:
    """Medians over ``reps`` runs of each (logger, method), the settings interleaved rep by rep so a
    noisy spell on the host hits them alike."""
    runs: dict[tuple, list[dict]] = {(lg, m): [] for lg in loggers for m in methods}
    shown = Progress("startup", reps * len(runs))
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(reps):
            for lg, m in runs:
                runs[lg, m].append(one_run(Path(tmp) / f"{lg}-{m}-{r}", world, lg, m))
                shown.done(f"logger={lg}, start={m}, run {r + 1} of {reps}")
    records = []
    for (lg, m), rows in runs.items():
        med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
        records.append({"logger": lg, "start": m, **med, "runs": reps})
    return records


def bench_startup(cfg, paths) -> list[dict]:
    """``python -m gvq.bench startup``: the start-up split of 1-iteration runs, per logger and start method."""
    from gvq.schema.tool import choose, namespace
    args = namespace(cfg, paths)
    choose("loggers", args.loggers, ("csv", "wandb"))
    choose("start", args.start, ("forkserver", "spawn"))
    records = measure_startup(args.world_size, args.loggers, args.start, args.reps)
    from gvq.bench.common import print_markdown
    cols = ["logger", "start", *(ph for ph, _, _ in PHASES), "total"]
    print_markdown(records, cols, f"start-up, seconds (wall clock, median of {args.reps}): python cli.py "
                   f"world_size={args.world_size} iterations=1 logger=<logger> (wandb offline), "
                   f"{os.cpu_count()} cores")
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))
    return records
