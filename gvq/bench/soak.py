"""A kill soak: ``python -m gvq.bench soak --kills 4 --every 5``.

One run with ``restarts=<kills>`` has a random rank SIGKILLed at random moments (``--kills`` times, each
after a few more rows than the last), then is compared with an uninterrupted run of the same config:
rows one per iteration, non-time columns equal.  Prints the iterations each kill cost (the rows the
killed attempt had written beyond the checkpoint it resumed from) against ``checkpoint.every``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
SAME = ("iteration", "train_loss", "train_acc", "test_loss", "test_acc", "bytes_sent")


def _start(run: Path, args, extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, str(ROOT / "cli.py"), f"iterations={args.iterations}", f"checkpoint.every={args.every}",
           "logger=csv", "logger.progress=false", f"hydra.run.dir={run}", *args.set, *extra]
    return subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, WANDB_MODE="disabled"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _rows(run: Path) -> int:
    path = run / "metrics.csv"
    return max(0, len(path.read_text().splitlines()) - 1) if path.exists() else 0


def _ranks(launcher: int) -> list[int]:
    """The launcher's rank processes: its fork server's children (or spawned ``spawn_main`` ones)."""
    def kids(pid):
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        return [int(k) for k in out]

    def cmd(pid):
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""
    direct = kids(launcher)
    below = [g for k in direct for g in kids(k)]
    return [p for p in below if b"forkserver" in cmd(p)] or [p for p in direct if b"spawn_main" in cmd(p)]


def soak(run: Path, args, rng: random.Random) -> tuple[subprocess.Popen, list[int], str]:
    """The killed run, the row count at each kill, and its stderr."""
    p, at = _start(run, args, [f"restarts={args.kills}"]), []
    target = 0
    for _ in range(args.kills):
        target = min(args.iterations - 2, target + rng.randint(1, 2 * args.every))
        deadline = time.monotonic() + args.timeout
        ranks = []
        while p.poll() is None and time.monotonic() < deadline and not (_rows(run) >= target and ranks):
            time.sleep(0.05)
            ranks = _ranks(p.pid) if _rows(run) >= target else []
        if p.poll() is not None or not ranks:
            break
        time.sleep(rng.uniform(0.0, args.jitter))        # anywhere in an iteration, not just after a row
        if _rows(run) >= args.iterations - 1:            # a rank past its last row is not a lost rank
            break
        at.append(_rows(run))
        os.kill(rng.choice(ranks), signal.SIGKILL)
        # the next kill is for the restarted attempt: wait for its ranks (none of the killed attempt's)
        while p.poll() is None and time.monotonic() < deadline and not (
                (now := _ranks(p.pid)) and not set(now) & set(ranks)):
            time.sleep(0.05)
        target = at[-1]                # the next kill after progress: a repeat at one row is "stuck"
    return p, at, p.communicate(timeout=args.timeout)[1]


def main(argv: list[str]) -> dict:
    """``python -m gvq.bench soak ...``: the soak's table (iterations lost per kill) and its check."""
    ap = argparse.ArgumentParser(prog="python -m gvq.bench soak", description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--every", type=int, default=5, help="checkpoint.every")
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0, help="which ranks die, and when")
    ap.add_argument("--jitter", type=float, default=0.3, help="a kill waits up to this many seconds after "
                    "its row (longer => kills later in an iteration, or iterations later)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--set", nargs="*", default=["model.width=8"], help="more cli.py overrides")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        ref = _start(Path(tmp) / "ref", args, [])
        ref.communicate(timeout=args.timeout)
        p, at, err = soak(Path(tmp) / "soak", args, random.Random(args.seed))
        summary = json.loads((Path(tmp) / "soak" / "summary.json").read_text())
        a, b = (pd.read_csv(Path(tmp) / d / "metrics.csv") for d in ("soak", "ref"))
    same = len(a) == len(b) == args.iterations and all(
        np.allclose(a[c], b[c], rtol=1e-6, atol=0, equal_nan=True) for c in SAME if c in a)
    lost = [rows - start for rows, start in zip(at, summary.get("resumed_from", []))]
    out = {"kills": len(at), "restarts": summary.get("restarts"), "status": summary.get("status"),
           "killed_at_rows": at, "resumed_from": summary.get("resumed_from"), "iterations_lost": lost,
           "checkpoint_every": args.every, "rows_and_metrics_equal": same}
    print(f"# kill soak: {args.iterations} iterations, checkpoint.every={args.every}, {len(at)} SIGKILLs of a "
          f"random rank (seed {args.seed}), restarts={args.kills}; {' '.join(args.set)}")
    for k, v in out.items():
        print(f"{k}: {v}")
    if lost:
        print(f"mean iterations lost per kill: {np.mean(lost):.2f} (checkpoint.every = {args.every}: "
              f"at most {args.every} redone per kill)")
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))
    if p.returncode != 0 or not same:
        raise SystemExit(f"gvq.bench soak: the soaked run {'failed' if p.returncode else 'differs'}: "
                         f"{err[-500:]}")
    return out
