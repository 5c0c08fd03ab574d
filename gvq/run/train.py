"""One rank's training loop.  Started by :mod:`gvq.run.launch` (spawned, or as a torchrun rank).

Each iteration: forward/backward on this rank's shard batch (``compute_s``), then the method
(``method=``, :mod:`gvq.methods`) decides what is averaged: ``every_step`` has ``aggregator.aggregate``
replace every gradient by the mean over ranks (``aggregate_s`` and its breakdown), then the optimizer
steps; local SGD and DiLoCo step alone and average parameters or the pseudo-gradient at their syncs.
With ``aggregator.overlap=true`` the aggregator is wrapped in :class:`gvq.hooks.Overlapped` (by
:func:`gvq.hooks.builder.aggregator_from`, in :func:`build`): DDP + the gvq hook average the gradient
bucket by bucket during backward, and ``aggregate`` reports what that cost.  Per-iteration times are the
max over ranks, loss/accuracy the mean; rank 0 logs them.  At the end every rank's parameters are
compared bitwise: replicas that drift apart fail the run.  Evaluation and that check see the method's
synced parameters (DiLoCo: the global copy, as its users evaluate the outer model), whichever iteration
they run at.
"""
from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist
from hydra.utils import instantiate

from gvq.aggregators.base import RunContext
from gvq.comm import clock
from gvq.comm.links import Cluster
from gvq.data import iterate_batches
from gvq.hooks.builder import aggregator_from
from gvq.methods.base import Method
from gvq.run import checkpoint, optim, restart
from gvq.run.guards import (
    aggregated_overflow,
    broadcast_,
    check_gradients,
    collapse_reason,
    comm_device,
    compute_device,
    peer_lost,
    never_learned_reason,
    track_chance,
)
from gvq.run.logs import RunLog, mark
from gvq.run.rows import TIME_KEYS, reduce_row
from gvq.run.signals import signals_deferred
from gvq.schema import columns
from gvq.workloads import Workload, of_data

log = logging.getLogger("gvq")


def lr_lambda(o: dict, iterations: int):
    """Multiplier of ``optim.lr`` at iteration ``it``: linear warm-up, then cosine / step / constant."""
    def f(it: int) -> float:
        if it < o["warmup_iters"]:
            return (it + 1) / o["warmup_iters"]
        if o["schedule"] == "cosine":
            span = max(1, iterations - o["warmup_iters"])
            return 0.5 * (1 + math.cos(math.pi * (it - o["warmup_iters"]) / span))
        if o["schedule"] == "step":
            return o["gamma"] ** sum(it >= m * iterations for m in o["milestones"])
        return 1.0
    return f


def build(cfg: dict, rank: int, world: int, run_dir: str | None = None):
    """Data and its workload, model (identical on all ranks: same seed, then a broadcast), optimizer,
    aggregator."""
    torch.manual_seed(cfg["seed"])
    data = instantiate(cfg["dataset"])
    work = of_data(data)
    model = instantiate(cfg["model"], num_classes=work.num_classes, in_channels=work.in_channels)
    model.to(compute_device(cfg["device"]))
    for t in list(model.parameters()) + list(model.buffers()):
        broadcast_(t.data, 0)
    opt = optim.build_optimizer(cfg["optim"], model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg["optim"], cfg["iterations"]))
    agg = aggregator_from(cfg["aggregator"])     # aggregator.overlap=true: the ring inside backward, via DDP
    net = cfg["net"]
    agg.setup(list(model.parameters()), RunContext(rank, world, cfg["seed"], cfg["timeout_s"],
                                                   net["bandwidth_bps"], net["latency_s"], run_dir=run_dir,
                                                   aggregate_error=cfg["aggregate_error"],
                                                   lr=functools.partial(first_lr, opt), cluster=cluster_of(net)))
    model = agg.wrap(model)            # the model itself, or torch DDP's wrapper (inside_backward)
    return data, work, model, opt, sched, agg


def cluster_of(net) -> Cluster:
    """Where the run's ranks sit (``net.ranks_per_node`` and the links inside a node)."""
    return Cluster(net["ranks_per_node"], net["intra_bandwidth_bps"], net["intra_latency_s"], str(net["intra_dtype"]))


def first_lr(opt) -> float:
    """The learning rate the optimizer's next step takes (its first group's: the run's one schedule)."""
    return opt.param_groups[0]["lr"]


@torch.no_grad()
def evaluate(model, data, work: Workload, rank: int, world: int, batch_size: int = 512) -> tuple[float, float]:
    """Exact test loss/accuracy over the whole test set, each rank scoring a disjoint shard; per target
    (an image, or a token of a text window), as the workload scores them."""
    for b in model.buffers():          # BN running stats differ per rank: use rank 0's everywhere
        broadcast_(b, 0)
    model.eval()
    idx = torch.arange(rank, len(data.y_test), world)
    dev = next(model.parameters()).device
    tot = torch.zeros(3, dtype=torch.float64, device=comm_device())
    for chunk in idx.split(batch_size):
        out = model(data.inputs(data.x_test[chunk]).to(dev))
        y = data.y_test[chunk].to(dev)
        tot += torch.tensor([work.loss(out, y, reduction="sum").item(), work.correct(out, y).sum().item(),
                             y.numel()], dtype=torch.float64, device=tot.device)
    dist.all_reduce(tot)
    model.train()
    return float(tot[0] / tot[2]), float(tot[1] / tot[2])


#: what runs at an iteration's named points, as ``callback(iteration, point)``: ``"aggregate"`` (its
#: gradients checked, before they are averaged) and ``"row"`` (its row logged, before its checkpoint).
#: Outside code attaches here (:func:`gvq.run.fault.install`: the kill soak's planned kills); the loop
#: knows nothing of what runs
ITERATION_CALLBACKS: list = []


def at_point(iteration: int, point: str) -> None:
    for callback in ITERATION_CALLBACKS:
        callback(iteration, point)


def build_method(cfg: dict, model, agg) -> Method:
    """The run's ``method`` (conf/method/), bound to the parameters the aggregator averages."""
    method = instantiate(cfg["method"])
    method.check_run(cfg)
    method.setup(list(model.parameters()), agg)
    return method


def step(model, opt, agg, method: Method, work: Workload, x, y, it: int, nan_policy: str = "error",
         clip_norm: float | None = None) -> dict:
    """One iteration's row; the ``aggregate`` point's callbacks run once the gradients are checked and
    before the method averages anything (every_step: the gradients; a local step: nothing).  The loss and
    accuracy are the workload's (a language model's ``(B, T, V)`` logits per token).  ``clip_norm``
    clips the averaged gradient (the same on every rank; a local step: this rank's own)."""
    t0 = clock.now()
    with clock.phase("compute"):                  # net.compute_scale applies here (virtual clock)
        out = model(x)
        loss = work.loss(out, y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
    compute_s = clock.now() - t0
    acc = work.correct(out, y).float().mean().item()
    row = {"compute_s": compute_s, "train_loss": loss.item(), "train_acc": acc, "skipped": 0}
    if check_gradients(model, agg, it, nan_policy):
        opt.zero_grad(set_to_none=False)
        return {**row, **columns.skipped_row()}     # each column's declared value on a skipped step
    at_point(it, "aggregate")
    stats = method.before_step(it)
    if agg.inside_backward:     # the wait backward already timed is aggregate_s's, not compute's
        row["compute_s"] -= agg.inside_compute_s
    # aggregators inside backward (torch DDP) were already checked aggregated, above: no second pass
    if method.averages_gradients(it) and not agg.inside_backward and aggregated_overflow(model, agg, it, nan_policy):
        opt.zero_grad(set_to_none=False)
        return {**row, **stats, "skipped": 1, "phase": "skipped"}
    with clock.phase("compute"):
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        opt.step()
    return {**row, **stats, **method.after_step(it)}



def clock_fields(cfg: dict) -> dict:
    """Which clock the run's times are on, with its scales (summary.json, and each CSV row's clock)."""
    net = cfg["net"]
    return {"clock": net["clock"], "compute_scale": net["compute_scale"], "codec_scale": net["codec_scale"]}


def replicas_identical(model) -> bool:
    """True when every rank holds bitwise the same parameters (compared against rank 0's)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    broadcast_(ref, 0)
    same = torch.tensor([int(torch.equal(flat.view(torch.uint8), ref.view(torch.uint8)))],   # NaN == NaN
                        device=comm_device())
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    return bool(same.item())


@dataclass
class Progress:
    """What the loop carries between iterations (and across a checkpoint)."""
    start: int = 0                     # first iteration of this process's run
    totals: dict = field(default_factory=lambda: dict.fromkeys(TIME_KEYS, 0.0))
    test_loss: float = float("nan")
    test_acc: float = float("nan")
    wall_offset: float = 0.0           # wall_s (on the run's clock) already spent before a resume
    real_wall_offset: float = 0.0      # real seconds already spent before a resume
    skip_streak: int = 0               # consecutive skipped steps up to now (diverged, at the end)
    loss_ema: float = float("nan")     # smoothed train loss; the first iteration of its current stretch
    chance_since: Optional[int] = None   # back at chance; whether it was ever below (guards.track_chance:
    learned: bool = False              # collapsed, at the end)


def train(cfg: dict, rank: int, world: int, run_dir: str, meta: dict, resume: str | None = None) -> dict | None:
    """The training loop; returns the summary on rank 0 (``None`` elsewhere).  ``resume``: the checkpoint
    dir to start from (the launcher passes the config's ``resume``, or a restart's run dir)."""
    net = cfg["net"]
    # before P2P is built; exclusive: timed phases one at a time on this host (ranks on one host only)
    clock.configure(net["clock"], net["compute_scale"], net["codec_scale"], net.get("exclusive", True),
                    cfg["device"], net.get("comm_core", "shared"))
    data, work, model, opt, sched, agg = build(cfg, rank, world, run_dir)
    method = build_method(cfg, model, agg)
    mark(meta, "built")
    prog, old_rows = Progress(), []
    if resume:
        state = checkpoint.load(resume, rank, world)
        checkpoint.restore(state, model, opt, sched, agg, method)
        prog = Progress(**state["progress"])
        old_rows = checkpoint.previous_rows(resume, prog.start) if rank == 0 else []
    if rank == 0 and restart.same_dir(resume, run_dir):
        restart.set_aside_rows(run_dir)   # restarted in place (restarts=K): its rows are written again
    asked = ("aggregate_error",) if cfg["aggregate_error"] else ()     # its column: NaN where not measurable
    # a column two parts log (bytes_received: DeMo's method and every aggregator) is one column
    fields = tuple(dict.fromkeys(("skipped",) + tuple(method.extra_fields) + tuple(agg.extra_fields)
                                 + work.extra_fields + asked))
    runlog = RunLog(run_dir, fields, cfg, meta) if rank == 0 else None
    mark(meta, "logger")
    failed = True
    try:
        for row in old_rows:
            runlog.row(row, replay=True)
        if rank == 0:
            restart.rows_replayed(run_dir)
        summary = _loop(cfg, rank, world, run_dir, (data, work, model, opt, sched, agg, method), runlog, prog,
                        meta.get("identity") or {})
        failed = False
        return summary
    except BaseException as e:
        with signals_deferred():         # the record first: a SIGTERM now (torchrun's, after a peer died) waits
            err = peer_lost(e, rank, cfg["timeout_s"])
            if runlog is not None:
                runlog.failure(err)
        if err is e:
            raise
        raise err from e
    finally:
        agg.close()
        if runlog is not None:
            runlog.close(failed=failed)


def _progress_bar(cfg, runlog, agg, world, prog):
    if runlog is None or not cfg["logger"]["progress"]:
        return None
    from tqdm import tqdm
    return tqdm(total=cfg["iterations"], initial=prog.start, desc=f"{agg.name} x{world}", unit="it",
                leave=False, mininterval=1.0)


def _loop(cfg, rank, world, run_dir, parts, runlog, prog: Progress, ident: dict):
    data, work, model, opt, sched, agg, method = parts
    iters, every = cfg["iterations"], cfg["checkpoint"]["every"]
    bar = _progress_bar(cfg, runlog, agg, world, prog)
    batches = iterate_batches(data, rank, world, cfg["batch_size"], cfg["seed"], prog.start)
    dev = compute_device(cfg["device"])
    t0, real0 = clock.sync() - prog.wall_offset, time.perf_counter() - prog.real_wall_offset
    last_wall = prog.wall_offset
    for it in range(prog.start, iters):
        epoch, x, y = next(batches)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        lr = opt.param_groups[0]["lr"]
        stats = step(model, opt, agg, method, work, x, y, it, cfg["nan_policy"], cfg["optim"]["clip_norm"])
        row = reduce_row(stats)
        sched.step()
        row.update(iteration=it, epoch=epoch, lr=lr, wall_s=clock.sync() - t0,
                   real_wall_s=time.perf_counter() - real0)
        row.setdefault("phase", agg.name)
        row["clock"] = cfg["net"]["clock"]
        if (it + 1) % cfg["eval_every"] == 0 or it + 1 == iters:
            with method.synced_parameters(model):         # DiLoCo: the outer (global) parameters
                prog.test_loss, prog.test_acc = evaluate(model, data, work, rank, world)
            row.update(test_loss=prog.test_loss, test_acc=prog.test_acc)
        work.row_metrics(row, y.numel() * world, row["wall_s"] - last_wall)
        last_wall = row["wall_s"]
        for k in TIME_KEYS:
            prog.totals[k] = prog.totals.get(k, 0.0) + row[k]      # (a key newer than a resumed checkpoint)
        prog.skip_streak = prog.skip_streak + 1 if row["skipped"] else 0
        prog.loss_ema, prog.chance_since, prog.learned = track_chance(
            prog.loss_ema, prog.chance_since, prog.learned, row["train_loss"], it, work.num_classes)
        if runlog is not None:
            runlog.row(row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{row['train_loss']:.3f}", acc=f"{prog.test_acc:.3f}", refresh=False)
        if it == prog.start and runlog is not None:
            mark(runlog.meta, "first_step")
        at_point(it, "row")
        if every and (it + 1) % every == 0 and it + 1 < iters:
            state = {**vars(prog), "start": it + 1, "wall_offset": clock.now() - t0,
                     "real_wall_offset": time.perf_counter() - real0}
            checkpoint.save(run_dir, rank, it + 1, model, opt, sched, agg,
                            {"progress": state, "method": method.state_dict()}, ident, cfg["checkpoint"]["keep"])
    if bar is not None:
        bar.close()
    if runlog is not None:
        mark(runlog.meta, "trained")
    return _finish(cfg, model, runlog, prog, clock.now() - t0, time.perf_counter() - real0, agg, work, method)


#: a run that ends with this many consecutive skipped steps (or skipped every step) diverged: it did not
#: train after that point, whatever its loop did; its summary says so and the launcher exits non-zero
DIVERGED_TAIL = 5


def lock_given_up() -> dict:
    """Virtual clock: how many ranks gave the host's clock lock up (``net.exclusive``), so their phases
    since then were timed with co-runners: a run whose virtual times are not to be trusted says so."""
    if not clock.get().virtual:
        return {}
    n = torch.tensor([int(clock.get().gave_up_lock)], device=comm_device())
    dist.all_reduce(n)
    return {"ranks_without_clock_lock": int(n.item())}


def end_status(prog: Progress, iters: int, num_classes: int) -> dict:
    """completed, or diverged (every step skipped at the end), collapsed (the loss back at chance), or
    never_learned (it never left chance)."""
    if prog.skip_streak >= min(DIVERGED_TAIL, iters):
        return {"status": "diverged", "reason": f"every step skipped since iteration {iters - prog.skip_streak} "
                "(non-finite gradients; nan_policy=skip)"}
    reason = collapse_reason(prog.loss_ema, prog.chance_since, iters, prog.test_acc, num_classes)
    if reason:
        return {"status": "collapsed", "reason": reason}
    reason = never_learned_reason(prog.learned, prog.loss_ema, iters, prog.test_acc, num_classes)
    return {"status": "never_learned", "reason": reason} if reason else {"status": "completed"}


def _finish(cfg, model, runlog, prog: Progress, wall_s: float, real_wall_s: float, agg, work: Workload, method):
    with method.synced_parameters(model):        # between syncs only the synced parameters agree
        identical = replicas_identical(model)
    lock = lock_given_up()
    if not identical:
        raise RuntimeError("replicas diverged: ranks hold different parameters after training")
    if runlog is None:
        return None
    iters = cfg["iterations"]
    text = work.summary_metrics(prog.test_loss, iters * cfg["batch_size"] * dist.get_world_size(), wall_s)
    summary = {**end_status(prog, iters, work.num_classes), "iterations": iters, "final_test_acc": prog.test_acc,
               "final_test_loss": prog.test_loss, **text, "wall_s": wall_s, "real_wall_s": real_wall_s,
               **clock_fields(cfg), **lock, "replicas_identical": identical,
               **{f"total_{k}": v for k, v in prog.totals.items()},
               "mean_aggregate_s": prog.totals["aggregate_s"] / iters, "config": cfg, **runlog.meta}
    agg_summary = agg.summary()
    if agg_summary:                                # e.g. GradiVeQ: refreshes, relays
        summary["aggregator"] = agg_summary
    runlog.summary(summary)
    bpb = f" test_bpb={text['final_test_bpb']:.4f}" if text else ""
    log.info("done: test_acc=%.4f test_loss=%.4f%s wall=%.1fs%s -> %s", prog.test_acc, prog.test_loss, bpb, wall_s,
             f" (virtual; real {real_wall_s:.1f}s)" if clock.get().virtual else "", runlog.run_dir)
    return summary
