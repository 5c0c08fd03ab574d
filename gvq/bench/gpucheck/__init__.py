"""The CUDA path checked in one command: ``python -m gvq.bench gpucheck [part=[tests,codecs,cli]]``.

On a CUDA machine (``make gpu-check`` runs every part):

* ``tests``:  every test marked ``cuda`` (``pytest -m cuda``, a run per file), a row per test (JUnit XML);
* ``codecs``: ``python -m gvq.bench codecs device=cuda``, a run per codec;
* ``cli``:    ``cli.py device=cuda`` for every option in ``conf/aggregator/`` at world_size 1 and 3 (more ranks
  than GPUs: the shared plan), a few iterations each.  Passed: completed with identical replicas on the
  expected plan; torch DDP on shared GPUs: refused in one line, as the placement rules require.

Each check is a subprocess with a time limit (its process group is killed there), ``jobs`` of them at a
time (half the CPUs, at most 8: on a 16-core GPU machine the whole check in one command of a few
minutes); where it still does not fit a time-boxed session, run one part at a time or narrow it (``k=``,
``aggregators=``, ``world_sizes=``, ``codecs=``).  ``--out`` (``runs/gpucheck``) gets
``parts/<part>-<command>.json`` as each check ends, then ``gpucheck.json`` and ``gpucheck.md`` merged from every
part file there (a check's newest row wins; delete the folder to start over), each part headed by its date,
commit, machine and command (for docs/results.md); that one table is printed.  Exit status: 0 all passed,
1 something failed, 2 no CUDA device is visible (one line, before anything runs) or a key is refused.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from gvq.bench import Progress
from gvq.bench.gpucheck.judge import Check, Proc, judge_cli, judge_codec, judge_tests, outcome
from gvq.schema.errors import ConfigError
from gvq.schema.tool import choose, namespace

ROOT = Path(__file__).resolve().parents[3]
AGGREGATORS = ROOT / "conf" / "aggregator"
PARTS = ("tests", "codecs", "cli")
SHORT = ["device=cuda", "iterations=8", "eval_every=8", "logger=csv", "logger.progress=false", "batch_size=16",
         "warmup=1", "L_t=3", "L_c=3"]      # short, yet through GradiVeQ's sampling and compressed phases
DDP_REFUSAL = "torch DDP needs one GPU per rank"


def visible_gpus() -> tuple[int, str]:
    """(CUDA devices torch sees, why none); torch is imported here so its absence is one line too."""
    try:
        import torch
    except ImportError as e:
        return 0, f"torch is not importable by {sys.executable} ({e})"
    if torch.cuda.is_available():
        return torch.cuda.device_count(), ""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    build = "a build without CUDA" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no device"
    return 0, (f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU" if hidden is not None
               else f"torch {torch.__version__} ({build})")


def machine_meta(part: str, argv: list[str], gpus: int) -> dict:
    """Provenance of a part's table: date, commit, machine, versions, the command that regenerates it."""
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "a stand-in GPU"
    git = shutil.which("git") and subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                                 capture_output=True, text=True).stdout.strip()
    return {"part": part, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git or "unknown (no git here)", "machine": f"{gpus} x {gpu}, {os.cpu_count()} CPUs",
            "versions": f"torch {torch.__version__}, CUDA {torch.version.cuda}",
            "command": "python -m gvq.bench gpucheck " + shlex.join(argv)}


def aggregator_options() -> list[str]:
    return sorted(p.stem for p in AGGREGATORS.glob("*.yaml"))


def is_ddp(name: str) -> bool:
    """Whether the option builds torch DDP (its ``_target_``), which needs one GPU per rank."""
    return bool(re.search(r"^_target_:\s*\S*\.DDPAggregator\b", (AGGREGATORS / f"{name}.yaml").read_text(), re.M))


def cli_plan(out: Path, gpus: int, world_sizes=(1, 3), names=None, timeout_s: float = 300) -> list[Check]:
    checks = []
    for world in world_sizes:
        for name in names or aggregator_options():
            refused = is_ddp(name) and world > gpus
            expect = {"refusal": DDP_REFUSAL} if refused else {"plan": "nccl" if world <= gpus else "shared"}
            run_dir = out / "runs" / f"{name}_w{world}"
            argv = [sys.executable, str(ROOT / "cli.py"), f"aggregator={name}", f"world_size={world}", *SHORT,
                    f"hydra.run.dir={run_dir}"]
            checks.append(Check("cli", "cli.py device=cuda", f"aggregator={name} world_size={world} "
                                f"({expect.get('plan', 'refused')})", argv, timeout_s, expect, str(run_dir)))
    return checks


def codecs_plan(out: Path, names=None, reps: int = 3, timeout_s: float = 300) -> list[Check]:
    from gvq.bench.codecs import DEFAULT        # on use: it imports torch and Hydra
    checks = []
    for name in names or DEFAULT:
        path = out / "codecs" / f"{name}.json"
        argv = [sys.executable, "-m", "gvq.bench", "codecs", "device=cuda", f"codecs=[{name}]",
                f"reps={reps}", "--out", str(path)]
        checks.append(Check("codecs", "gvq.bench codecs", f"{name}, cuda", argv, timeout_s, path=str(path)))
    return checks


def cuda_test_files() -> list[str]:
    """Test files that mark tests ``cuda`` (as a decorator or a parameter's mark)."""
    mark = re.compile(r"@pytest\.mark\.cuda\b|marks=\[pytest\.mark\.cuda\b")
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if mark.search(p.read_text()))


def tests_plan(out: Path, k: str | None = None, timeout_s: float = 540) -> list[Check]:
    """A pytest run per file (a file past its limit loses no other file's rows); a test gets 90% of it."""
    checks = []
    for f in cuda_test_files():
        junit = out / "junit" / Path(f).with_suffix(".xml")      # tests/run/test_train.xml ...
        argv = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", f"--junitxml={junit}",
                f"--timeout={0.9 * timeout_s:g}", f, *(["-k", k] if k else [])]
        checks.append(Check("tests", "pytest -m cuda", f + (f" -k {k!r}" if k else ""), argv, timeout_s,
                            path=str(junit)))
    return checks


def run_bounded(argv: list[str], timeout_s: float) -> Proc:
    """``argv`` from the repository root, wandb off; at the limit its process group (ranks, pytest's own
    subprocesses) is killed, so nothing it started outlives the check."""
    env = dict(os.environ, WANDB_MODE="disabled",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    t0 = time.monotonic()
    p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
        return Proc(p.returncode, out, err, time.monotonic() - t0, False)
    except subprocess.TimeoutExpired:
        pass
    finally:                       # whatever it left, past the limit, or on Ctrl-C (its session misses that)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:              # a descendant that left the group still holds the pipes
        out, err = "", ""
    return Proc(p.returncode, out, err, time.monotonic() - t0, True)


JUDGES = {"tests": judge_tests, "codecs": judge_codec, "cli": judge_cli}


def run_check(check: Check) -> list[dict]:
    """The real runner: a fresh output path, the bounded subprocess, then its part's judge."""
    if check.part == "cli":        # no stale output may pass for this run's
        shutil.rmtree(check.path, ignore_errors=True)
    elif check.path:
        Path(check.path).unlink(missing_ok=True)
        Path(check.path).parent.mkdir(parents=True, exist_ok=True)
    proc = run_bounded(check.argv, check.timeout_s)
    if proc.timed_out:
        return [outcome(check, "timeout", proc.seconds, f"killed after {check.timeout_s:g} s")]
    return JUDGES[check.part](check, proc)


def markdown_table(metas: list[dict], rows: list[dict]) -> str:
    head = ["### CUDA check: `python -m gvq.bench gpucheck`", ""]
    head += [f"- {m['part']}: {m['date']}, commit {m['commit']}, {m['machine']}, {m['versions']}; "
             f"`{m['command']}`" for m in metas]
    cols = ["check", "setting", "result", "seconds", "detail"]
    body = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r["check"], r["setting"], r["result"], f"{r['seconds']:.1f}", r["detail"]]
        body.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    counts = {k: sum(r["result"] == k for r in rows) for k in ("passed", "failed", "timeout", "skipped")}
    return "\n".join(head + [""] + body + ["", ", ".join(f"{n} {k}" for k, n in counts.items())])


def write_results(out: Path) -> str:
    """Merge every part file under ``out/parts`` into gpucheck.json and gpucheck.md (a check run again, e.g.
    by a narrower later command, keeps its newest row); returns the markdown."""
    parts = sorted((json.loads(f.read_text()) for f in (out / "parts").glob("*.json")), key=lambda p: p["written"])
    newest = {(r["check"], r["setting"]): (PARTS.index(p["meta"]["part"]), i, r)
              for i, p in enumerate(parts) for r in p["rows"]}
    rows = [r for _, _, r in sorted(newest.values(), key=lambda t: t[0])]      # stable: plan order in a part
    used = {i for _, i, _ in newest.values()}
    metas = sorted((p["meta"] for i, p in enumerate(parts) if i in used), key=lambda m: PARTS.index(m["part"]))
    (out / "gpucheck.json").write_text(json.dumps({"parts": metas, "rows": rows}, indent=1))
    table = markdown_table(metas, rows)
    (out / "gpucheck.md").write_text(table + "\n")
    return table


def run_part(checks: list[Check], runner: Callable, meta: dict, path: Path, jobs: int = 1) -> list[dict]:
    """Every check, ``jobs`` at a time (each is a subprocess; the GPU and the host's cores are shared), the
    rows saved as each ends (a session killed at its limit keeps them) and returned in plan order."""
    done: dict[int, list[dict]] = {}
    lock, shown = threading.Lock(), Progress("gpucheck", len(checks))

    def one(i: int, check: Check) -> None:
        try:
            outcomes = runner(check)
        except Exception as e:     # a judge that cannot read a result fails that check, not the rest
            outcomes = [outcome(check, "failed", 0.0, f"gpucheck: {e!r}"[:200])]
        with lock:
            done[i] = outcomes
            rows = [r for j in sorted(done) for r in done[j]]
            path.write_text(json.dumps({"meta": meta, "written": time.time(), "rows": rows}, indent=1))
            shown.done("; ".join(f"{o['check']} {o['setting']}: {o['result']}" +
                                 (f" {o['detail']}" if o["result"] != "passed" else "") for o in outcomes),
                       sum(o["seconds"] for o in outcomes))        # checks run side by side: each its own

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(lambda ic: one(*ic), enumerate(checks)))
    return [r for j in sorted(done) for r in done[j]]


def default_jobs() -> int:
    """Checks at a time: half the host's cores, at most 8 (a run's ranks and pytest need cores of their own)."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def plan_checks(part: str, args, gpus: int, out: Path) -> list[Check]:
    if part == "tests":
        return tests_plan(out, args.k, args.file_timeout)
    if part == "codecs":
        return codecs_plan(out, args.codecs, args.reps, args.timeout)
    return cli_plan(out, gpus, args.world_sizes, args.aggregators, args.timeout)


def given(cfg) -> list[str]:
    """The keys set away from their defaults, as ``KEY=VALUE`` in key order: the command a part file
    records (the same command again replaces its file, however its words were ordered)."""
    from omegaconf import OmegaConf

    from gvq.bench.keys import GpucheckKeys
    now, default = (OmegaConf.to_container(c) for c in (cfg, OmegaConf.structured(GpucheckKeys)))
    return [f"{k}={_value_text(v)}" for k, v in now.items() if v != default[k]]


def _value_text(v) -> str:
    return f"[{','.join(map(str, v))}]" if isinstance(v, list) else "null" if v is None else str(v)


def bench_gpucheck(cfg, paths, runner: Callable | None = None, gpus: int | None = None) -> list[dict]:
    """Run the chosen parts; ``runner`` and ``gpus`` stand in for the subprocesses and the machine in tests."""
    args = namespace(cfg, paths)
    choose("part", args.part, PARTS)
    args.jobs = args.jobs or default_jobs()
    if gpus is None:
        gpus, why = visible_gpus()
        if not gpus:
            raise ConfigError(f"no CUDA device is visible: {why}; run it on a CUDA machine")
    if "cli" in args.part:
        choose("aggregators", args.aggregators, aggregator_options())
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    plans = {part: plan_checks(part, args, gpus, out) for part in args.part}     # a bad key fails before any run
    (out / "parts").mkdir(exist_ok=True)
    argv = given(cfg)
    tag = hashlib.sha1(shlex.join(argv).encode()).hexdigest()[:8]     # the same command again replaces its file
    rows = [r for part, checks in plans.items() for r in run_part(
        checks, runner or run_check, machine_meta(part, argv, gpus), out / "parts" / f"{part}-{tag}.json",
        args.jobs)]
    print(write_results(out), flush=True)
    if any(r["result"] in ("failed", "timeout") for r in rows):
        raise SystemExit(1)
    return rows
