"""Start a run from a composed Hydra config: validate, then spawn ``world_size`` ranks (or, under
torchrun, become the rank its environment names), rendezvous through a file in the run dir (never a
fixed port), and turn any rank's failure into a non-zero exit carrying that rank's traceback.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from gvq.run import checkpoint
from gvq.run.logs import setup_logging
from gvq.run.validate import ConfigError, inert_knobs, validate


def config_error(msg: str) -> None:
    print(f"gvq: config error: {msg}", file=sys.stderr)
    sys.exit(2)


def preflight(cfg: DictConfig):
    """Fail fast, with one line and no traceback, on values only the code can judge; returns the
    instantiated aggregator and dataset (they name a checkpoint's identity)."""
    try:
        validate(cfg)
        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device=cuda: no CUDA device is visible here; use device=cpu")
    except ConfigError as e:
        config_error(str(e))
    agg = _try_instantiate("aggregator", cfg.aggregator, _convert_="object")
    if cfg.net.clock == "virtual" and not getattr(agg, "virtual_time", False):
        config_error(f"net.clock=virtual: aggregator {agg.name!r} communicates outside gvq's P2P (torch DDP's "
                     "collectives), so virtual time cannot see it; use net.clock=wall with kernel shaping "
                     "(sudo python -m gvq.bench netns train)")
    data = _try_instantiate("dataset", cfg.dataset)
    _try_instantiate("model", cfg.model, num_classes=data.num_classes, in_channels=data.in_channels)
    return agg, data


def check_identity(plain: dict, meta: dict, agg, data) -> None:
    """Record what this run's checkpoints belong to (``meta['identity']``); on ``resume=``, refuse a
    checkpoint of another run, or an unreadable one, before anything is written or spawned."""
    world = int(os.environ["WORLD_SIZE"]) if "RANK" in os.environ and "LOCAL_RANK" in os.environ \
        else plain["world_size"]
    name = getattr(agg, "name", None) or meta["job_type"] or plain["aggregator"]["_target_"]   # its state's kind
    meta["identity"] = checkpoint.identity(plain, name, data.num_classes, data.in_channels, world)
    if plain["resume"]:
        try:
            checkpoint.check_resume(plain["resume"], meta["identity"])
        except checkpoint.ResumeError as e:
            config_error(str(e))


def _try_instantiate(group: str, node, **kwargs):
    try:
        return instantiate(node, **kwargs)
    except (ValueError, TypeError, FileNotFoundError, InstantiationException) as e:
        inner = e.__cause__ if isinstance(e, InstantiationException) and e.__cause__ else e
        text = (str(inner).strip() or type(inner).__name__).splitlines()
        if isinstance(inner, TypeError):   # an unknown kwarg, e.g. aggregator.foo=1
            keys = ", ".join(k for k in node if k != "_target_")
            config_error(f"{group}: {text[-1]} (keys given: {keys or 'none'}; see conf/{group}/)")
        config_error(text[0])


def run_meta(cfg: DictConfig) -> dict:
    """Names for logs: run dir, wandb group / job_type / name from Hydra's view of this job."""
    hc = HydraConfig.get()
    choices = hc.runtime.choices
    multirun = str(hc.mode) == "RunMode.MULTIRUN"
    group = cfg.logger.wandb.group or choices.get("experiment") or (
        Path(hc.sweep.dir).name if multirun else None)
    name = hc.job.override_dirname or "default"
    overrides = list(hc.overrides.task)
    return {"run_dir": hc.runtime.output_dir, "group": group, "name": name,
            "job_type": choices.get("aggregator"), "overrides": overrides,
            "inert_knobs": inert_knobs(cfg, overrides)}


def warn_inert(cfg: DictConfig, meta: dict) -> None:
    """One line when knobs the user set are not read by this run's aggregator (they change nothing)."""
    inert = meta["inert_knobs"]
    if inert and int(os.environ.get("RANK", "0")) == 0:
        given = ", ".join(f"{k}={cfg[k]}" for k in inert)
        print(f"gvq: warning: aggregator={meta['job_type'] or cfg.aggregator._target_} does not read "
              f"{given}: no effect on this run (recorded as inert_knobs in summary.json)", file=sys.stderr)


def launch(cfg: DictConfig) -> dict | None:
    agg, data = preflight(cfg)
    meta = run_meta(cfg)
    plain = OmegaConf.to_container(cfg, resolve=True)
    check_identity(plain, meta, agg, data)
    warn_inert(cfg, meta)
    if "RANK" in os.environ and "LOCAL_RANK" in os.environ:     # started by torchrun: be that rank
        plain["world_size"] = int(os.environ["WORLD_SIZE"])
        return worker(int(os.environ["LOCAL_RANK"]), plain, meta, "env://")
    run_dir = Path(meta["run_dir"])
    init = f"file://{run_dir.resolve()}/.rendezvous-{uuid.uuid4().hex}"
    _plain_start_method()
    try:
        _spawn_and_join(plain, meta, init)
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
        write_failure(run_dir, plain, meta, str(e))
        if json.loads((run_dir / "summary.json").read_text()).get("status") == "completed":
            print(f"gvq: warning: a rank failed after training completed (results kept): {e}",
                  file=sys.stderr)
        else:
            print(f"gvq: run failed: {e}", file=sys.stderr)
            sys.exit(1)
    except KeyboardInterrupt:
        write_failure(run_dir, plain, meta, "interrupted (Ctrl-C): every rank was stopped")
        print("gvq: interrupted; every rank stopped", file=sys.stderr)
        sys.exit(130)
    finally:
        Path(init[len("file://"):]).unlink(missing_ok=True)
    summary = run_dir / "summary.json"
    return json.loads(summary.read_text()) if summary.exists() else None


def _spawn_and_join(plain: dict, meta: dict, init: str, grace_s: float = 10.0) -> None:
    """``mp.spawn`` that also stops every rank on Ctrl-C: ranks ignore SIGINT (so one keypress is not
    N+1 tracebacks racing), the launcher sends them SIGTERM (they finish their logs) and, after
    ``grace_s``, SIGKILL."""
    ctx = mp.start_processes(worker, args=(plain, meta, init), nprocs=plain["world_size"], join=False,
                             start_method="spawn")
    try:
        while not ctx.join():
            pass
    except KeyboardInterrupt:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + grace_s
        for p in ctx.processes:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
        raise


def _on_sigterm(signum, frame):
    raise SystemExit(128 + signum)     # unwinds through ``finally``: CSV closed, wandb marked failed


def _plain_start_method() -> None:
    """Inside a joblib (loky) worker the global start method is 'loky', which spawned children then
    try, and fail, to restore; reset it to 'spawn' so parallel Hydra launchers can run our jobs."""
    import multiprocessing
    if multiprocessing.get_start_method(allow_none=True) not in (None, "spawn", "fork", "forkserver"):
        multiprocessing.set_start_method("spawn", force=True)


def write_failure(run_dir: Path, cfg: dict, meta: dict, reason: str) -> None:
    """Record the failure; a run rank 0 already completed keeps its results (teardown error noted)."""
    path = run_dir / "summary.json"
    first = reason.strip().splitlines()
    line = first[-1] if first else "unknown"
    if path.exists():
        done = json.loads(path.read_text())
        if done.get("status") == "completed":
            path.write_text(json.dumps({**done, "teardown_error": line}, indent=2, default=str))
            return
    data = {"status": "failed", "reason": line, "config": cfg, **meta}
    path.write_text(json.dumps(data, indent=2, default=str))


def _adopt_rank0_run_dir(rank: int, meta: dict) -> dict:
    """Under torchrun every rank is a Hydra job with its own output dir (timestamps may differ): all
    adopt rank 0's, and the other ranks remove the dir Hydra made for them if it holds only Hydra's
    own files, so outputs are written once."""
    box = [meta["run_dir"]]
    dist.broadcast_object_list(box, 0)
    mine = Path(meta["run_dir"])
    if rank != 0 and box[0] != meta["run_dir"] and mine.exists():
        if {p.name for p in mine.iterdir()} <= {".hydra", "cli.log"}:
            shutil.rmtree(mine, ignore_errors=True)
    return {**meta, "run_dir": box[0]}


def worker(local_rank: int, cfg: dict, meta: dict, init_method: str):
    """Entry of one rank (spawned, or the torchrun process itself)."""
    torchrun = init_method == "env://"
    rank = int(os.environ["RANK"]) if torchrun else local_rank
    world = int(os.environ["WORLD_SIZE"]) if torchrun else cfg["world_size"]
    setup_logging(rank)
    if not torchrun:                   # Ctrl-C is the launcher's to handle (see _spawn_and_join)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    torch.set_num_threads(1 if cfg["device"] == "cpu" else torch.get_num_threads())
    backend = "nccl" if cfg["device"] == "cuda" else "gloo"
    if cfg["device"] == "cuda":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg["timeout_s"]))
    from gvq.run.train import train  # after init: keeps the spawn import light
    if torchrun:
        meta = _adopt_rank0_run_dir(rank, meta)
    try:
        return train(cfg, rank, world, meta["run_dir"], meta)
    finally:
        dist.destroy_process_group()
