"""Start a run from a composed Hydra config: validate, then spawn ``world_size`` ranks (or, under
torchrun, become the rank its environment names), rendezvous through a file in the run dir (never a
fixed port), and turn any rank's failure into one line, that rank's traceback and a
:class:`gvq.run.errors.RunEnded` carrying the CLI's exit status (a job of a sweep returns instead).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from gvq.data import group_batches_per_epoch
from gvq.hooks.builder import aggregator_from
from gvq.run import checkpoint, fault
from gvq.run.logs import mark, process_start, setup_logging
from gvq.run.placement import cuda_plan, group_backend
from gvq.run.signals import Interrupted, die_with_parent, on_sigterm, signals_interrupt
from gvq.run.guards import DeliberateStop, record_stop
from gvq.run.errors import RunEnded, RunFailed, refuse
from gvq.run.restart import attempt_store, discard_rows, resume_point, torchrun_restart
from gvq.run.supervise import supervise, write_failure
from gvq.run.validate import ConfigError, inert_knobs, validate
from gvq.run.warm import adopt_environment, start_fork_server, start_method
from gvq.schema.errors import instantiation_line
from gvq.workloads import of_data


def config_error(msg: str) -> NoReturn:
    """Refuse the run in one line (:class:`ConfigRefused`, exit 2), leaving nothing under runs/."""
    discard_run_dir()
    raise refuse(msg)


def discard_run_dir() -> None:
    """A run refused before its ranks start leaves nothing under runs/: Hydra has already made its dir
    (config copies, its log); remove those, then the dir and its parents while they are empty."""
    try:
        hc = HydraConfig.get()
    except ValueError:                 # not inside a Hydra job (a test calling launch directly)
        return
    out = Path(hc.runtime.output_dir)
    for p in (out / hc.output_subdir if hc.output_subdir else None, out / f"{hc.job.name}.log"):
        if p is not None and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p is not None:
            p.unlink(missing_ok=True)
    stop = {Path.cwd().resolve(), Path("/")}
    d = out.resolve()
    while d not in stop and d.name != "runs" and d.is_dir() and not any(d.iterdir()):
        d.rmdir()
        d = d.parent


def preflight(cfg: DictConfig):
    """Fail fast, with one line and no traceback, on values only the code can judge; returns the
    instantiated aggregator and dataset (they name a checkpoint's identity) and the GPU plan (or None)."""
    try:
        validate(cfg)
    except ConfigError as e:
        config_error(str(e))
    agg = _try_instantiate("aggregator", cfg.aggregator, build=aggregator_from)   # as the ranks build it
    try:                               # what the method sends, the aggregator must be able to average
        _try_instantiate("method", cfg.method).check(agg)
    except ValueError as e:
        config_error(str(e))
    plan = None
    if cfg.device == "cuda":           # nccl (a GPU per rank) | shared (gloo, host-staged) | one line
        try:                           # torch DDP's own collectives (not gvq's P2P) need a GPU per rank
            plan = cuda_plan(torchrun_world() or cfg.world_size, agg.name, not agg.virtual_time)
        except ConfigError as e:
            config_error(str(e))
    if cfg.net.clock == "virtual" and not agg.virtual_time:
        config_error(f"net.clock=virtual: aggregator {agg.name!r} communicates outside gvq's P2P (torch DDP's "
                     "collectives), so virtual time cannot see it; use net.clock=wall with kernel shaping "
                     "(sudo python -m gvq.bench netns-train)")
    if cfg.aggregator.get("bucket_cap_mb") is not None and not agg.inside_backward:
        print(f"gvq: warning: aggregator.bucket_cap_mb={cfg.aggregator.bucket_cap_mb} does nothing without "
              "aggregator.overlap=true (gradients are averaged after backward, as one vector)", file=sys.stderr)
    data = _try_instantiate("dataset", cfg.dataset)
    work = of_data(data)                   # what the ranks build their model for (gvq.run.train.build)
    model = _try_instantiate("model", cfg.model, num_classes=work.num_classes, in_channels=work.in_channels)
    world = torchrun_world() or cfg.world_size
    if cfg.batch_size * world > len(data):
        config_error(f"batch_size={cfg.batch_size}: the global batch (x {world} ranks = {cfg.batch_size * world}) "
                     f"exceeds the dataset's {len(data)} training examples")
    try:                                   # dataset.split: the smallest rank's share must hold a batch too
        if data.groups is not None:
            group_batches_per_epoch(data.groups, world, cfg.batch_size)
    except ValueError as e:
        config_error(str(e))
    try:                                   # checks that need the model's shapes (GradiVeQ's K), and one
        agg.preflight(list(model.parameters()))      # example through it (a window longer than the model's
        with torch.no_grad():                        # context, an image of another size)
            model(data.inputs(data.x_train[:1]))
    except (ValueError, RuntimeError) as e:
        config_error(str(e).strip().splitlines()[0])
    return agg, data, plan


def torchrun_world() -> int | None:
    """The world size torchrun's environment names (this process is one of its ranks), else None."""
    return int(os.environ["WORLD_SIZE"]) if "RANK" in os.environ and "LOCAL_RANK" in os.environ else None


def _check_torchrun_world(cfg: DictConfig, overrides: list[str]) -> None:
    """Under torchrun the world size is torchrun's: a different ``world_size=`` given is refused."""
    given = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] == "world_size"]
    world = torchrun_world()
    if given and world is not None and world != cfg.world_size:
        config_error(f"world_size={cfg.world_size}: torchrun started {world} ranks "
                     "(--nnodes x --nproc_per_node); drop world_size= or make them agree")


def check_identity(plain: dict, meta: dict, agg, data) -> None:
    """Record what this run's checkpoints belong to (``meta['identity']``); on ``resume=``, refuse a
    checkpoint of another run, or an unreadable one, before anything is written or spawned."""
    world = torchrun_world() or plain["world_size"]
    name = agg.name or meta["job_type"] or plain["aggregator"]["_target_"]   # its state's kind
    meta["identity"] = checkpoint.identity(plain, name, data.num_classes, data.in_channels, world)
    if plain["resume"]:
        try:
            checkpoint.check_resume(plain["resume"], meta["identity"])
        except checkpoint.ResumeError as e:
            config_error(str(e))


def _try_instantiate(group: str, node, build=instantiate, **kwargs):
    try:
        return build(node, **kwargs)
    except (ValueError, TypeError, FileNotFoundError, InstantiationException) as e:
        config_error(instantiation_line(group, node, e))


def run_meta(cfg: DictConfig) -> dict:
    """Names for logs: run dir, wandb group / job_type / name from Hydra's view of this job."""
    hc = HydraConfig.get()
    choices = hc.runtime.choices
    multirun = str(hc.mode) == "RunMode.MULTIRUN"
    group = cfg.logger.wandb.group or choices.get("experiment") or (
        Path(hc.sweep.dir).name if multirun else None)
    name = hc.job.override_dirname or "default"
    overrides = list(hc.overrides.task)
    return {"run_dir": hc.runtime.output_dir, "group": group, "name": name, "multirun": multirun,
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
    """Train the run ``cfg`` describes; returns rank 0's summary (None where none was written), or raises a
    :class:`gvq.run.errors.RunEnded` carrying the exit status, its one line printed (in a sweep a failed
    job returns instead)."""
    startup = {"process": process_start(), "main": time.time()}
    try:
        method = start_method()
        fault.planned()                # GVQ_KILLS: a malformed plan is refused before any rank starts
    except ValueError as e:
        config_error(str(e))
    agg, data, plan = preflight(cfg)
    meta = {**run_meta(cfg), "startup": startup, "cuda_plan": plan}
    _check_torchrun_world(cfg, meta["overrides"])
    plain = OmegaConf.to_container(cfg, resolve=True)
    check_identity(plain, meta, agg, data)
    warn_inert(cfg, meta)
    if torchrun_world() is not None:                            # started by torchrun: be that rank
        plain["world_size"] = torchrun_world()
        return _fail_if_unlearned(_torchrun_rank(plain, meta))
    run_dir = Path(meta["run_dir"])
    if (run_dir / "summary.json").exists() or (run_dir / "metrics.csv").exists():
        # never over another run's records, nor its failure taken for this run's ("after training completed")
        print(f"gvq: run refused: {run_dir} already holds a run (its summary.json or metrics.csv): give this run "
              "its own directory (hydra.run.dir=..., or in a sweep hydra.sweep.dir=...)", file=sys.stderr)
        return _end_job(meta, RunFailed(2))
    meta["launcher_pid"] = os.getpid()
    mark(meta, "spawn")
    _plain_start_method()
    start_fork_server()                # cli.py started it already; a direct launch() call starts it here
    try:
        with signals_interrupt():
            supervise(worker, run_dir, plain, meta, method)
    except RunFailed as e:             # its line is printed; in a sweep the next job runs
        return _end_job(meta, e)
    except KeyboardInterrupt as e:
        stop = e if isinstance(e, Interrupted) else Interrupted(signal.SIGINT)
        name = signal.Signals(stop.signum).name
        write_failure(run_dir, plain, meta, f"interrupted by {name}: every rank was stopped", "interrupted")
        print(f"gvq: interrupted ({name}); every rank stopped", file=sys.stderr)
        raise stop from None               # the signal is the whole story
    summary = run_dir / "summary.json"
    return _fail_if_unlearned(json.loads(summary.read_text()) if summary.exists() else None)


def _torchrun_rank(plain: dict, meta: dict) -> dict | None:
    """This process is a rank of torchrun's; a rank that ends with an exit status (a deliberate stop, a
    signal) raises :class:`RunFailed` with it."""
    try:
        return run_rank(int(os.environ["LOCAL_RANK"]), plain, meta, "env://", None, plain["resume"])
    except RunEnded as e:
        raise RunFailed(e.code) from None


def _fail_if_unlearned(summary: dict | None) -> dict | None:
    """A run that stopped learning (every step skipped to the end: diverged; the loss back at chance:
    collapsed) or never did (never_learned) is not a success: one line, and :class:`RunFailed` (exit 3;
    in a sweep the line only)."""
    if summary and summary.get("status") in ("diverged", "collapsed", "never_learned"):
        print(f"gvq: run {summary['status']}: {summary['reason']}", file=sys.stderr)
        _end_job(summary, RunFailed(3))
    return summary


def _end_job(meta: dict, failed: RunFailed) -> None:
    """A job that did not succeed, its one line printed and its status in summary.json: a single run raises
    ``failed``; inside a sweep (-m) the launcher returns, so one failed job does not cancel the rest."""
    if not meta.get("multirun"):
        raise failed


def _plain_start_method() -> None:
    """Inside a joblib (loky) worker the global start method is 'loky', which spawned children then
    try, and fail, to restore; reset it to 'spawn' so parallel Hydra launchers can run our jobs."""
    import multiprocessing
    if multiprocessing.get_start_method(allow_none=True) not in (None, "spawn", "fork", "forkserver"):
        multiprocessing.set_start_method("spawn", force=True)


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


def worker(local_rank: int, cfg: dict, meta: dict, init_method: str, env: dict | None, resume: str | None):
    """The entry function of a rank process (forked from the warm server, or spawned), as ``main`` is a
    command's: a run that ends (a deliberate stop, a signal) ends the process with its status."""
    try:
        return run_rank(local_rank, cfg, meta, init_method, env, resume)
    except RunEnded as e:
        raise SystemExit(e.code) from None


def run_rank(local_rank: int, cfg: dict, meta: dict, init_method: str, env: dict | None, resume: str | None):
    """One rank (in a process of the launcher's, or the torchrun process itself); it raises
    :class:`RunEnded` on a deliberate stop (:class:`RunFailed`) or a signal (:class:`Interrupted`).
    ``env``: the launcher's environment at launch, which a forked rank adopts (None: keep this one);
    ``resume``: the checkpoint dir this attempt starts from (the config's, or a restart's run dir), None
    from scratch."""
    adopt_environment(env)
    torchrun = init_method == "env://"
    rank = int(os.environ["RANK"]) if torchrun else local_rank
    mark(meta, "rank_start")
    world = int(os.environ["WORLD_SIZE"]) if torchrun else cfg["world_size"]
    setup_logging(rank)
    if not torchrun:                   # Ctrl-C is the launcher's to handle (see _spawn_and_join)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_sigterm)
    die_with_parent(None if torchrun else meta.get("launcher_pid"))
    torch.set_num_threads(1 if cfg["device"] == "cpu" else torch.get_num_threads())
    backend = group_backend(meta.get("cuda_plan"))
    if cfg["device"] == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())   # shared: round-robin
    timeout = timedelta(seconds=cfg["timeout_s"])
    if torchrun and torchrun_restart():
        dist.init_process_group(backend, store=attempt_store(rank, world, timeout), rank=rank, world_size=world,
                                timeout=timeout)
    else:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world, timeout=timeout)
    mark(meta, "rendezvous")
    from gvq.run.train import (
        train,  # preloaded by the fork server (spawned: imported here)
    )
    if torchrun:
        meta = _adopt_rank0_run_dir(rank, meta)
        if torchrun_restart():         # --max-restarts: continue from the newest set in the run dir
            start, resume = resume_point(Path(meta["run_dir"]))
            meta = {**meta, "restarts": int(os.environ["TORCHELASTIC_RESTART_COUNT"]), "resumed_from": [start]}
            if resume is None and rank == 0:
                discard_rows(Path(meta["run_dir"]))
            dist.barrier()             # rank 0 has the rows out of the way before anyone logs
    fault.install(rank, meta.get("restarts", 0))   # GVQ_KILLS: the kill soak's planned kills, if any
    try:
        return train(cfg, rank, world, meta["run_dir"], meta, resume)
    except DeliberateStop as e:        # nan_policy=error: one line, no traceback (see launch())
        if torchrun and rank == 0:
            print(f"gvq: stopped: {e}", file=sys.stderr)
        raise record_stop(meta["run_dir"], rank, e) from None
    finally:
        dist.destroy_process_group()
