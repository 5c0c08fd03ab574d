"""Aggregation benchmark: ``python -m gvq.bench aggregate [KEY=VALUE ...]`` (``make bench`` runs it bare:
its grid, conf/grid/bench.yaml).  (``python -m gvq.bench train`` compares whole iterations with torch DDP.)

Spawns each of ``grid.world_sizes`` gloo ranks (file rendezvous in a temp dir), gives every rank a
gradient with a real model's shapes (default ResNet-32 / CIFAR-100) and times each aggregator over
``reps`` repetitions after ``warmup``, with compute paused (a barrier before each repetition; the time of
a repetition is the max over ranks).  Aggregators are the Hydra option files of ``conf/aggregator/``
(plus ``allreduce``: gloo's own ``dist.all_reduce``, unshaped only) composed as the CLI would, with
``grid.set`` overrides.  ``grid.links_bps`` emulates every rank's outgoing link.  Prints a table and
writes the records as JSON (``--out``).
"""
from __future__ import annotations

import statistics
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist

from gvq.aggregators.base import Aggregator, RunContext
from gvq.bench import Progress
from gvq.bench.common import (check_net, clock_label, configure_clock, make_aggregator, model_shapes,
                              print_markdown, setting_name, spawn_loopback)
from gvq.comm import clock
from gvq.comm.links import Cluster
from gvq.comm.group import process_group
from gvq.schema.errors import ConfigError
from gvq.schema.tool import namespace
from gvq.run.logs import write_json_atomic


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
            # bytes to other nodes: what an aggregator declares it counts (net.ranks_per_node's slow links)
            inter = stats["bytes_inter"] if "bytes_inter" in agg.extra_fields else float("nan")
            rows.append([float(v) for v in wall] + [stats["bytes_sent"], inter])
    agg.close()
    return summarize_aggregation(rows, agg, args, ctx.world_size)


def summarize_aggregation(rows, agg, args, world) -> dict:
    times = [r[0] for r in rows]
    sent = rows[-1][4]
    bw = args.bandwidth
    bound = sent * 8 / bw if bw and sent == sent else None
    med = statistics.median(times)
    return {"aggregator": agg.name, "world_size": world, "bandwidth_bps": bw, "bytes_per_rank": sent,
            "bytes_inter_per_rank": rows[-1][5],
            "median_s": med, "min_s": min(times), "bound_s": bound,
            "time_over_bound": med / bound if bound else None,
            "wire_s": statistics.median(r[1] for r in rows),
            "compress_s": statistics.median(r[2] for r in rows),
            "decompress_s": statistics.median(r[3] for r in rows), "reps": len(rows)}


BASELINES = ("rar", "fp16", "qsgd")   # speed-up columns against each of these that ran


def aggregation_rank(rank, args, init, out):
    torch.set_num_threads(1)
    configure_clock(args.net)
    with process_group("gloo", init_method=init, rank=rank, world_size=args.world_size,
                timeout=timedelta(seconds=args.timeout)):
        _time_aggregators(rank, args, out)


def _time_aggregators(rank: int, args, out: str) -> None:
    """Every aggregator timed on this rank on the model's shapes; rank 0 writes the records."""
    gen = torch.Generator().manual_seed(1000 + rank)
    shapes = model_shapes(args.model, args.num_classes)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    grads = [torch.randn(s, generator=gen) * 1e-2 for s in shapes]
    for p in params:
        p.grad = torch.zeros_like(p)
    # net.ranks_per_node: nodes for topology=hierarchical; aggregation alone: no compression error measured
    ctx = RunContext(rank, args.world_size, 0, args.timeout, args.bandwidth, args.latency,
                     cluster=Cluster.of_net(args.net), compression_error=False)
    records = []
    for name in args.aggregators:
        if name == "allreduce" and (args.bandwidth or args.net["clock"] == "virtual"):
            continue                      # gloo's collective cannot be shaped in-process, nor timed virtually
        agg = AllReduceRef() if name == "allreduce" else make_aggregator(name, args.set)
        timed = time_aggregator(agg, params, grads, ctx, args)
        records.append({"aggregator": name, "setting": setting_name(name, args.set),
                         **{k: v for k, v in timed.items() if k != "aggregator"}})
    if rank == 0:
        write_json_atomic(out, records, indent=None)


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
    cols = ["setting", "bytes_per_rank", "byte_ratio", "median_s", "min_s"]
    cols += [f"speedup_vs_{b}" for b in BASELINES if records[0].get(f"speedup_vs_{b}") is not None]
    cols += ["bound_s", "time_over_bound", "compress_s", "wire_s", "decompress_s"]
    r0 = records[0]
    link = f"{r0['bandwidth_bps'] / 1e6:g} Mbit/s per rank (emulated)" if r0["bandwidth_bps"] else "unshaped loopback"
    print_markdown(records, cols, f"aggregation: model={r0['model']}, N={r0['world_size']}, link={link}, "
                   f"{r0['clock']}, reps={r0['reps']}, 1 thread/rank, {torch.get_num_threads()} cores visible")


def aggregation_args(cfg, paths) -> SimpleNamespace:
    """The composed keys as the namespace the ranks read (``args.world_size`` ... from the grid), checked
    before any rank starts: a bad size, a link key or a clock without a link is a ConfigError (one line)."""
    args = namespace(cfg, paths)
    g = args.grid
    args.aggregators, args.world_size, args.set = g["settings"], g["world_sizes"], g["set"]
    args.bandwidth = g["links_bps"] or [None]          # none: one unshaped loopback table
    if not args.aggregators or not args.world_size or min(args.world_size) < 1 or args.reps < 1:
        raise ConfigError("grid.settings: at least one; grid.world_sizes and reps >= 1")
    if any(b is not None and b <= 0 for b in args.bandwidth):
        raise ConfigError("grid.links_bps: each > 0")
    check_net(args.net, args.bandwidth, args.world_size)
    if args.rank is not None and (len(args.world_size) != 1 or len(args.bandwidth) != 1 or not args.init):
        raise ConfigError("rank: needs one of grid.world_sizes, at most one of grid.links_bps, and init")
    args.latency = args.net["latency_s"]
    return args


def bench_aggregate(cfg, paths) -> list[dict]:
    """``python -m gvq.bench aggregate [KEY=VALUE ...] [--out F]``: one table per world size and link."""
    args = aggregation_args(cfg, paths)
    if args.rank is not None:                 # one externally started rank (gvq.bench netns)
        args.bandwidth, args.world_size = args.bandwidth[0], args.world_size[0]
        aggregation_rank(args.rank, args, args.init, args.out or "/dev/null")
        return []
    records, shown = [], Progress("aggregate", len(args.world_size) * len(args.bandwidth))
    for world in args.world_size:
        for bw in args.bandwidth:
            recs = run_aggregation(SimpleNamespace(**{**vars(args), "world_size": world, "bandwidth": bw}))
            print_aggregation(recs)
            records += recs
            shown.done(f"N={world}, {f'{bw / 1e6:g} Mbit/s' if bw else 'unshaped loopback'}: "
                       f"{len(recs)} settings")
    if args.out:
        write_json_atomic(args.out, records)
        print(f"records -> {args.out}")
    return records
