"""A kill soak: ``python -m gvq.bench soak kills=4 every=5``.

One run with ``restarts=<kills>`` loses a rank in each of its first ``kills`` attempts: the plan, drawn
from ``seed`` (which rank, after how many rows, and where: right after a row is written, or mid-iteration
between backward and the aggregate), goes to the run in ``GVQ_KILLS`` (gvq/run/fault.py) and the chosen
rank SIGKILLs itself there, so a seed kills at the same rows on any machine.  The run is then compared
with an uninterrupted run of the same config: rows one per iteration, non-time columns equal, and each
restart resumed from the checkpoint its kill left.  Prints the iterations each kill cost (the rows written
at the kill beyond the checkpoint its restart resumed from) against ``checkpoint.every``.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from gvq.bench import Progress
from gvq.run import fault
from gvq.schema.errors import ConfigError
from gvq.schema.tool import namespace
from gvq.run.logs import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]
SAME = ("iteration", "train_loss", "train_acc", "test_loss", "test_acc", "bytes_sent")


def draw_kills(kills: int, iterations: int, ranks: int, rng: random.Random) -> list[fault.Kill]:
    """One kill in each of the first ``kills`` attempts, each after more rows than the one before (a
    restart that makes no progress stops the run) and before the last row (a rank past its last row is
    not a lost rank)."""
    if not 0 <= kills < iterations:
        raise ValueError(f"kills={kills}: must be in [0, iterations) (one more row written before each)")
    out = []
    for attempt, rows in enumerate(sorted(rng.sample(range(1, iterations), kills))):
        point = rng.choice(fault.POINTS)
        out.append(fault.Kill(attempt, rows - (point == "row"), rng.randrange(ranks), point))
    return out


def resumes(kills: list[fault.Kill], every: int) -> list[int]:
    """Where each restart resumes: the newest checkpoint at or before the kill's iteration (a ``row``
    kill comes before its iteration's checkpoint, an ``aggregate`` one after the one before it)."""
    return [k.iteration // every * every if every else 0 for k in kills]


def _start(run: Path, args, extra: list[str], kills: list[fault.Kill]) -> subprocess.Popen:
    cmd = [sys.executable, str(ROOT / "cli.py"), f"iterations={args.iterations}", f"checkpoint.every={args.every}",
           f"world_size={args.ranks}", "logger=csv", "logger.progress=false", f"hydra.run.dir={run}", *args.set,
           *extra]
    env = dict(os.environ, WANDB_MODE="disabled", **{fault.ENV: fault.plan_text(kills)})
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _outcome(tmp: Path, args, kills: list[fault.Kill], err: str) -> dict:
    summary = json.loads((tmp / "soak" / "summary.json").read_text())
    a, b = (pd.read_csv(tmp / d / "metrics.csv") for d in ("soak", "ref"))
    same = len(a) == len(b) == args.iterations and all(
        np.allclose(a[c], b[c], rtol=1e-6, atol=0, equal_nan=True) for c in SAME if c in a)
    done, resumed = fault.announced(err), summary.get("resumed_from", [])
    return {"kills": len(done), "restarts": summary.get("restarts"), "status": summary.get("status"),
            "killed_at_rows": [k.rows for k in done], "resumed_from": resumed,
            "iterations_lost": [k.rows - start for k, start in zip(done, resumed)], "checkpoint_every": args.every,
            "rows_and_metrics_equal": same, "plan": fault.plan_text(kills),
            "kills_as_planned": done == kills and resumed == resumes(kills, args.every)}


def bench_soak(cfg, paths) -> dict:
    """``python -m gvq.bench soak [KEY=VALUE ...] [--out F]``: the soak's table (iterations lost per kill)
    and its check."""
    args = namespace(cfg, paths)
    try:
        kills = draw_kills(args.kills, args.iterations, args.ranks, random.Random(args.seed))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    with tempfile.TemporaryDirectory() as tmp:
        shown, t0 = Progress("soak", 2), time.perf_counter()      # the two runs side by side: each since the start
        ref = _start(Path(tmp) / "ref", args, [], [])
        p = _start(Path(tmp) / "soak", args, [f"restarts={args.kills}"], kills)
        err = p.communicate(timeout=args.timeout)[1]
        shown.done(f"the soaked run ({args.kills} planned kills, exit {p.returncode})", time.perf_counter() - t0)
        ref_err = ref.communicate(timeout=args.timeout)[1]
        shown.done(f"the uninterrupted run (exit {ref.returncode})", time.perf_counter() - t0)
        if ref.returncode:
            raise SystemExit(f"gvq.bench soak: the uninterrupted run failed: {ref_err[-500:]}")
        out = _outcome(Path(tmp), args, kills, err)
    print(f"# kill soak: {args.iterations} iterations, checkpoint.every={args.every}, {args.kills} planned "
          f"SIGKILLs (seed {args.seed}), restarts={args.kills}, {args.ranks} ranks; {' '.join(args.set)}")
    for k, v in out.items():
        print(f"{k}: {v}")
    if out["iterations_lost"]:
        print(f"mean iterations lost per kill: {np.mean(out['iterations_lost']):.2f} (checkpoint.every = "
              f"{args.every}: at most {args.every} redone per kill)")
    if args.out:
        write_json_atomic(args.out, out)
    problem = ("the soaked run failed" if p.returncode else "the soaked run differs"
               if not out["rows_and_metrics_equal"] else "" if out["kills_as_planned"] else "not killed as planned")
    if problem:
        raise SystemExit(f"gvq.bench soak: {problem}: {err[-500:]}")
    return out
