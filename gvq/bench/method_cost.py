"""Does a method that does not sync in a step cost anything?  ``python -m gvq.bench method-cost [every=10]
[world_size=1] [model=cnn] [iters=60]``: a benchmark, never a timed test.

Two modes step through the real loop's :func:`gvq.run.train.step` on the wall clock, in one process per
rank, on the same model, batch and optimizer, interleaved (which goes first alternates by iteration):

* ``every_step``: every_step's compute-only path, ``aggregator=rar`` bound as a run binds it (the gradients
  in its flat bucket, checked before and after the average as a run checks them) with the averaging taken
  out (:class:`SendsNothing`): what a method that syncs every step costs without its communication;
* ``diloco``: ``method=diloco method.every=<every>`` through rar.  Its syncs run (the run has them) but are
  not compared: its other iterations are the steps of a method that does not sync.

The figure is the median per-iteration ratio diloco / every_step over diloco's non-sync iterations, paired
(iteration i of each mode saw the same load), with its bootstrap interval
(:func:`gvq.report.intervals.median_interval`): "no measurable cost" where the interval reaches 1 or lies
below it.  Both modes share one thread per rank, so contention on the host widens the interval, not the ratio.
"""
from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from gvq.aggregators.base import RunContext
from gvq.aggregators.rar import RingAllReduce
from gvq.bench import BenchError, Progress
from gvq.bench.common import (build_model, collections_untimed, configure_clock, model_workload, net_defaults,
                              print_markdown, spawn_loopback)
from gvq.comm import clock
from gvq.comm.group import process_group
from gvq.methods.base import Method
from gvq.methods.diloco import DiLoCo
from gvq.methods.every_step import EveryStep
from gvq.report.intervals import CONFIDENCE, Interval, median_interval
from gvq.run import train
from gvq.schema import columns
from gvq.schema.tool import namespace

COLS = ("iter_s", "compute_s", "aggregate_s")


class SendsNothing(RingAllReduce):
    """rar with its average taken out: the gradients stay this rank's, the step's row says nothing was
    sent (a local step's columns).  every_step's path, less its communication."""

    name = "sends_nothing"

    def aggregate(self, iteration: int) -> dict:
        return columns.unsynced_row()


class _Mode:
    """One mode's model (the same start in both), optimizer, aggregator and method."""

    def __init__(self, args, rank: int, world: int, method: Method, agg, work):
        model = build_model(args.model, args.num_classes, work.in_channels)
        self.work = work
        agg.setup(list(model.parameters()), RunContext(rank, world, 0, args.timeout))
        self.model, self.agg, self.method = agg.wrap(model), agg, method
        method.setup(list(self.model.parameters()), agg)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)

    def iterate(self, x, y, it: int) -> list[float]:
        """One :func:`gvq.run.train.step`: this rank's seconds by :data:`COLS`."""
        t0 = clock.now()
        row = train.step(self.model, self.opt, self.agg, self.method, self.work, x, y, it)
        return [clock.now() - t0, row["compute_s"], row["aggregate_s"]]


def cost_rank(rank: int, world: int, args, init: str, out: str) -> None:
    torch.set_num_threads(1)
    configure_clock(net_defaults())                 # the wall clock, as a run's default
    with process_group("gloo", init_method=init, rank=rank, world_size=world,
                       timeout=timedelta(seconds=args.timeout)):
        _time_both(rank, world, args, out)


def _time_both(rank: int, world: int, args, out: str) -> None:
    """Both modes timed, interleaved; rank 0 writes every timed iteration (the slowest rank's)."""
    work = model_workload(args.model, args.num_classes, args.input_shape)
    modes = {"every_step": _Mode(args, rank, world, EveryStep(), SendsNothing(topology="ring"), work),
             "diloco": _Mode(args, rank, world, DiLoCo(every=args.every), RingAllReduce(topology="ring"), work)}
    g = torch.Generator().manual_seed(rank)
    x, y = work.synthetic_batch(args.batch_size, g)
    rows: dict[str, list[dict]] = {name: [] for name in modes}
    with collections_untimed() as collect:
        for it in range(args.warmup + args.iters):
            for name in (list(modes) if it % 2 == 0 else list(reversed(modes))):
                dist.barrier()
                t = torch.tensor(modes[name].iterate(x, y, it), dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                if it >= args.warmup:
                    rows[name].append(dict(zip(COLS, t.tolist())))
                collect()                           # untimed: after this mode's step, before the next
    syncs = [modes["diloco"].method.syncs(it) for it in range(args.warmup, args.warmup + args.iters)]
    for m in modes.values():
        m.agg.close()
    if rank == 0:
        Path(out).write_text(json.dumps({"rows": rows, "syncs": syncs}))


def summarize(raw: dict, args, world: int) -> dict:
    """The paired ratio over diloco's non-sync iterations, its interval and the verdict; the medians."""
    pairs = [(a, b) for a, b, s in zip(raw["rows"]["diloco"], raw["rows"]["every_step"], raw["syncs"]) if not s]
    if len(pairs) < 2:
        raise BenchError(f"method-cost: {len(pairs)} non-sync iteration(s) timed: raise iters or every")
    ratio = median_interval([a["iter_s"] / b["iter_s"] for a, b in pairs])
    local = [a for a, _ in pairs]
    base = [b for _, b in pairs]
    synced = [a for a, s in zip(raw["rows"]["diloco"], raw["syncs"]) if s]
    free = ratio.lo is None or ratio.lo <= 1.0
    med = {f"{who}_{k}": float(torch.tensor([r[k] for r in rs]).median())
           for who, rs in (("every_step", base), ("diloco", local)) for k in COLS}
    return {"model": args.model, "N": world, "batch_per_rank": args.batch_size, "every": args.every,
            "clock": "wall", "pairs": len(pairs), "sync_iters": len(synced), "warmup": args.warmup, **med,
            "diloco_sync_iter_s": float(torch.tensor([r["iter_s"] for r in synced]).median()) if synced else None,
            "ratio": ratio.median, "ratio_lo": ratio.lo, "ratio_hi": ratio.hi,
            "verdict": "no measurable cost" if free else f"costs {ratio.lo - 1:.2%} or more"}


def print_cost(rec: dict) -> None:
    shown = [{"mode": "every_step (rar, averaging taken out)", "iter_s": rec["every_step_iter_s"],
              "compute_s": rec["every_step_compute_s"], "aggregate_s": rec["every_step_aggregate_s"]},
             {"mode": f"diloco every={rec['every']}, non-sync steps", "iter_s": rec["diloco_iter_s"],
              "compute_s": rec["diloco_compute_s"], "aggregate_s": rec["diloco_aggregate_s"]}]
    ci = Interval(rec["ratio"], rec["ratio_lo"], rec["ratio_hi"]).text(".4g")
    print_markdown(shown, ["mode", "iter_s", "compute_s", "aggregate_s"],
                   f"method cost, model={rec['model']}, N={rec['N']}, batch {rec['batch_per_rank']}/rank, wall clock, "
                   f"train.step, modes interleaved, medians of {rec['pairs']} paired non-sync iterations after "
                   f"{rec['warmup']} warm-up")
    print(f"\ndiloco / every_step per iteration (paired): {rec['ratio']:.4f}, {CONFIDENCE:.0%} bootstrap interval "
          f"{ci}: {rec['verdict']}", flush=True)


def bench_method_cost(cfg, paths) -> list[dict]:
    """``python -m gvq.bench method-cost [KEY=VALUE ...] [--out F]``: one record."""
    args = namespace(cfg, paths)
    if args.world_size < 1 or args.every < 2 or args.iters < 2 or args.warmup < 0:
        raise BenchError("method-cost: world_size >= 1, every >= 2 (a sync every step has no local step), "
                         "iters >= 2, warmup >= 0")
    shown = Progress("method-cost", 1)
    rec = summarize(spawn_loopback(cost_rank, args.world_size, args.world_size, args), args, args.world_size)
    print_cost(rec)
    shown.done(f"N={args.world_size}: {rec['pairs']} pairs")
    if args.out:
        Path(args.out).write_text(json.dumps([rec], indent=2))
    return [rec]
