"""Aggregation benchmark: ``python -m gvq.bench aggregate [flags]`` (``make bench`` runs the default).
(``python -m gvq.bench train`` compares whole iterations with torch DDP: :mod:`gvq.bench.train`.)

Spawns ``--world-size`` gloo ranks (file rendezvous in a temp dir), gives every rank a gradient with a
real model's shapes (default ResNet-32 / CIFAR-100) and times each aggregator over
``--reps`` repetitions after ``--warmup``, with compute paused (a barrier before each repetition; the
time of a repetition is the max over ranks).  Aggregators are the Hydra option files of
``conf/aggregator/`` (plus ``allreduce``: gloo's own ``dist.all_reduce``, unshaped only) composed as the
CLI would, with ``--set key=value`` overrides.  ``--bandwidth`` emulates every rank's outgoing link.
Prints a table and writes the records as JSON (``--out``).
"""
from __future__ import annotations

import argparse
import json
import statistics
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from gvq.aggregators.base import Aggregator, RunContext
from gvq.bench.common import (add_clock_args, add_timeout_arg, check_clock_args, clock_label, configure_clock,
                              make_aggregator, model_shapes, print_markdown, spawn_loopback)
from gvq.comm import clock
from gvq.schema.compose import load_grid


class AllReduceRef(Aggregator):
    """gloo's ``dist.all_reduce`` on the flat buffer: the reference our ring is held to."""
    name = "allreduce"

    def setup(self, params, ctx):
        self.params, self.bytes = params, sum(p.numel() for p in params) * 4

    def aggregate(self, it):
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        t0 = clock.now()
        dist.all_reduce(flat)
        return {"aggregate_s": clock.now() - t0, "bytes_sent": float("nan"), "wire_s": 0.0,
                "compress_s": 0.0, "decompress_s": 0.0}


def time_aggregator(agg, params, grads, ctx, args) -> dict:
    agg.setup(params, ctx)
    agg.prepare_benchmark(grads, args)          # e.g. GradiVeQ: fit a basis before timing
    rows = []
    for rep in range(args.warmup + args.reps):
        for p, g in zip(params, grads):
            p.grad.copy_(g)
        dist.barrier()
        clock.sync()                            # virtual: every rank starts the repetition together
        stats = agg.aggregate(rep)
        # the runner's aggregate_s column: untimed measurements (compression error) excluded
        wall = torch.tensor([stats["aggregate_s"], stats["wire_s"], stats["compress_s"],
                             stats["decompress_s"]], dtype=torch.float64)
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)
        if rep >= args.warmup:
            rows.append([float(v) for v in wall] + [stats["bytes_sent"]])
    agg.close()
    return summarize_aggregation(rows, agg, args, ctx.world_size)


def summarize_aggregation(rows, agg, args, world) -> dict:
    times = [r[0] for r in rows]
    sent = rows[-1][4]
    bw = args.bandwidth
    bound = sent * 8 / bw if bw and sent == sent else None
    med = statistics.median(times)
    return {"aggregator": agg.name, "world_size": world, "bandwidth_bps": bw, "bytes_per_rank": sent,
            "median_s": med, "min_s": min(times), "bound_s": bound,
            "time_over_bound": med / bound if bound else None,
            "wire_s": statistics.median(r[1] for r in rows),
            "compress_s": statistics.median(r[2] for r in rows),
            "decompress_s": statistics.median(r[3] for r in rows), "reps": len(rows)}


BASELINES = ("rar", "fp16", "qsgd")   # speed-up columns against each of these that ran


def aggregation_rank(rank, args, init, out):
    torch.set_num_threads(1)
    configure_clock(args.net)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.world_size,
                            timeout=timedelta(seconds=args.timeout))
    try:
        gen = torch.Generator().manual_seed(1000 + rank)
        shapes = model_shapes(args.model, args.num_classes)
        params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
        grads = [torch.randn(s, generator=gen) * 1e-2 for s in shapes]
        for p in params:
            p.grad = torch.zeros_like(p)
        ctx = RunContext(rank, args.world_size, 0, args.timeout, args.bandwidth, args.latency)
        records = []
        for name in args.aggregators:
            if name == "allreduce" and (args.bandwidth or args.net["clock"] == "virtual"):
                continue                      # gloo's collective cannot be shaped in-process, nor timed virtually
            agg = AllReduceRef() if name == "allreduce" else make_aggregator(name, args.set)
            records.append({**time_aggregator(agg, params, grads, ctx, args), "aggregator": name})
        if rank == 0:
            Path(out).write_text(json.dumps(records))
    finally:
        dist.destroy_process_group()


def run_aggregation(args) -> list[dict]:
    """Every aggregator of ``args`` timed on ``args.world_size`` loopback ranks, with ratio columns."""
    records = spawn_loopback(aggregation_rank, args.world_size, args)
    base = next((r for r in records if r["aggregator"] == "rar"), None)
    for ref in BASELINES:                      # e.g. speedup_vs_qsgd = qsgd's median / this median
        other = next((r for r in records if r["aggregator"] == ref), None)
        for r in records:
            r[f"speedup_vs_{ref}"] = other["median_s"] / r["median_s"] if other else None
    for r in records:
        r["ratio_to_rar"] = r["median_s"] / base["median_s"] if base else None
        r["byte_ratio"] = base["bytes_per_rank"] / r["bytes_per_rank"] if base and r["bytes_per_rank"] else None
        r["model"], r["latency_s"], r["clock"] = args.model, args.latency, clock_label(args.net)
    return records


def print_aggregation(records: list[dict]) -> None:
    cols = ["aggregator", "bytes_per_rank", "byte_ratio", "median_s", "min_s"]
    cols += [f"speedup_vs_{b}" for b in BASELINES if records[0].get(f"speedup_vs_{b}") is not None]
    cols += ["bound_s", "time_over_bound", "compress_s", "wire_s", "decompress_s"]
    r0 = records[0]
    link = f"{r0['bandwidth_bps'] / 1e6:g} Mbit/s per rank (emulated)" if r0["bandwidth_bps"] else "unshaped loopback"
    print_markdown(records, cols, f"aggregation: model={r0['model']}, N={r0['world_size']}, link={link}, "
                   f"{r0['clock']}, reps={r0['reps']}, 1 thread/rank, {torch.get_num_threads()} cores visible")


def parse_aggregation_args(argv):
    p = argparse.ArgumentParser(prog="python -m gvq.bench aggregate", description=__doc__.splitlines()[0])
    g = load_grid("bench")                  # the defaults: conf/grid/bench.yaml (make bench's grid)
    p.add_argument("--aggregators", nargs="+", default=g.settings)
    p.add_argument("--world-size", type=int, nargs="+", default=g.world_sizes, help="ranks N (one table each)")
    p.add_argument("--bandwidth", type=float, nargs="*", default=g.links_bps,
                   help="per-rank link in bit/s (several => one table each); the flag alone: unshaped loopback")
    p.add_argument("--latency", type=float, default=0.0, help="extra per-message latency, s")
    p.add_argument("--model", default="resnet32")
    p.add_argument("--num-classes", type=int, default=100)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--set", nargs="*", default=g.set, help="Hydra overrides for the aggregators, e.g. lambda=0.05; "
                        "prefix name: to target one, e.g. gradiveq:aggregator.compressor.target_ratio=8 (given: "
                        "replaces the grid's)")
    add_clock_args(p)
    add_timeout_arg(p)
    p.add_argument("--out", default=None, help="write all records as JSON here")
    p.add_argument("--rank", type=int, default=None,
                   help="run only this rank (ranks started elsewhere, e.g. in network namespaces)")
    p.add_argument("--init", default=None, help="with --rank: the rendezvous URL (file://...)")
    args = p.parse_args(argv)
    args.bandwidth = args.bandwidth or [None]        # the flag alone: one unshaped table
    if min(args.world_size) < 1 or args.reps < 1:
        p.error("--world-size and --reps must be >= 1")
    if any(b is not None and b <= 0 for b in args.bandwidth):
        p.error("--bandwidth must be > 0")
    check_clock_args(p, args, args.bandwidth)
    return args


def main(argv: list[str]) -> list[dict]:
    """``python -m gvq.bench aggregate ...`` (``argv``: the words after ``aggregate``)."""
    args = parse_aggregation_args(argv)
    if args.rank is not None:                 # one externally started rank (gvq.bench.netns)
        args.bandwidth, args.world_size = args.bandwidth[0], args.world_size[0]
        aggregation_rank(args.rank, args, args.init, args.out or "/dev/null")
        return []
    records = []
    for world in args.world_size:
        for bw in args.bandwidth:
            one = argparse.Namespace(**{**vars(args), "world_size": world, "bandwidth": bw})
            recs = run_aggregation(one)
            print_aggregation(recs)
            records += recs
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=2))
        print(f"records -> {args.out}")
    return records
