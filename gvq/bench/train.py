"""Iteration-time benchmark: the runner's aggregators against torch ``DistributedDataParallel`` (gloo) on
the same model, batch and ranks: ``python -m gvq.bench train --world-size 2 4``.

See docs/design.md#gvqbenchtrainpy for how it works and why.
"""
from __future__ import annotations

import argparse
import json
import sys
import statistics
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gvq.aggregators.base import RunContext
from gvq.aggregators.ddp import wrap_ddp
from gvq.bench.common import (BenchError, add_clock_args, add_timeout_arg, build_model, check_clock_args,
                              clock_label, collections_untimed, configure_clock, net_defaults, make_aggregator,
                              print_markdown, spawn_loopback)
from gvq.report.intervals import CONFIDENCE, Interval, median_interval
from gvq.comm import clock
from gvq.run import train
from gvq.run.rows import reduce_row
from gvq.schema import columns
from gvq.run.placement import cuda_plan, group_backend
from gvq.run.validate import ConfigError

DEFAULT_MODES = ("rar", "ddp", "torch_ddp", "local")
#: what an iteration run reads beyond the workload flags (:func:`add_workload_args`), for callers whose
#: parser has only those (``gvq.bench netns train``): no link, the wall clock, the host, no GPU plan
RUN_DEFAULTS = {"bandwidth": None, "timeout": 120.0, "compressed_only": False, "device": "cpu", "plan": None,
                "net": net_defaults(), "specs": None, "input_shape": None}


def with_run_defaults(args) -> argparse.Namespace:
    """``args`` with :data:`RUN_DEFAULTS` filled in where its parser had no such flag."""
    return argparse.Namespace(**{**RUN_DEFAULTS, **vars(args)})
COLS = ("iter_s", *(c for c in columns.BENCH if c != "iter_s"))   # iter_s first: the reference ratio reads it


@dataclass(frozen=True)
class ModeSpec:
    """One timed mode: its label, the conf/aggregator option it builds (``torch_ddp``: a bare DDP loop;
    ``local``: no communication) with its own overrides, and its own emulated link (bit/s, or None)."""
    label: str
    option: str
    overrides: tuple[str, ...] = ()
    bandwidth: float | None = None
    variant: str = "post"              # post-backward, or ``overlap`` (inside backward, gvq's hook)
    bucket_mb: float | None = None     # overlapped: DDP's bucket size (None: its defaults)
    setting: str = ""                  # the setting it times (``report.runs.setting_label``; "": the option)


def mode_specs(args) -> list[ModeSpec]:
    """``--aggregators`` as modes: each option under its own name, ``--set`` and ``--bandwidth`` for all."""
    return [ModeSpec(m, m, tuple(args.set), args.bandwidth) for m in args.aggregators]


class _Mode:
    """One mode's model, optimizer and aggregator (None for ``torch_ddp`` / ``local``)."""

    def __init__(self, spec: ModeSpec, rank: int, world: int, args, shape, device: torch.device):
        self.name, self.agg = spec.label, None
        net = build_model(args.model, args.num_classes, shape[0]).to(device)
        if spec.option == "torch_ddp":
            net = wrap_ddp(net)           # as gvq's own DDP options wrap it (no per-forward buffer sync)
        elif spec.option != "local":
            # as the runner builds it: aggregator.overlap=true runs the ring inside backward, via DDP
            self.agg = make_aggregator(spec.option, list(spec.overrides))
            # the link applies to gvq's aggregators only: torch DDP's collectives are not shaped
            ctx = RunContext(rank, world, 0, args.timeout, spec.bandwidth)
            self.agg.setup(list(net.parameters()), ctx)
            if args.compressed_only:
                # pin the compressed phase (GradiVeQ: a fitted basis, no sampling; PowerSGD: no warm-up)
                self.agg.prepare_benchmark([torch.zeros_like(p) for p in net.parameters()], args)
            net = self.agg.wrap(net)                   # torch DDP's wrapper; the model for the others
        self.net = net
        self.opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def warmup_needed(self) -> int:
        # e.g. torch's PowerSGD hook all-reduces uncompressed before its start_iter: time it once compressed
        return 0 if self.agg is None else self.agg.benchmark_warmup()

    def iterate(self, x, y, it: int) -> list[float]:
        """One iteration; this rank's [iter_s, compute_s, ...] (times of the runner's columns)."""
        t0 = clock.now()
        if self.agg is None:
            with clock.phase("compute"):
                loss = F.cross_entropy(self.net(x), y)
                self.opt.zero_grad(set_to_none=False)
                t_backward = clock.now()
                loss.backward()
            t_end = clock.now()
            with clock.phase("compute"):
                self.opt.step()
            # backward alone: the only span an overlapped aggregator's buckets can hide behind
            row = {"compute_s": t_end - t0, "backward_s": t_end - t_backward}
        else:                                          # the runner's own per-iteration path
            row = train.step(self.net, self.opt, self.agg, x, y, it)
            row = reduce_row(row)
        row["iter_s"] = clock.now() - t0
        return [float(row.get(k, 0.0)) for k in COLS]


def time_rounds(modes, x, y, warmup: int, iters: int) -> dict[str, list[dict[str, float]]]:
    """Every mode's rows of its timed iterations (after ``warmup``), each the maximum over ranks, by
    column name (:data:`COLS`).  Modes
    interleaved, so every mode sees the same load; garbage collected between iterations, outside every
    timed span, never inside one (:func:`gvq.bench.common.collections_untimed`)."""
    rows: dict[str, list[dict[str, float]]] = {m.name: [] for m in modes}
    with collections_untimed() as collect:
        for it in range(warmup + iters):
            for m in modes:
                dist.barrier()
                clock.sync()                           # virtual: every rank starts the iteration together
                t = torch.tensor(m.iterate(x, y, it), dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                if it >= warmup:
                    rows[m.name].append(dict(zip(COLS, t.tolist())))
                collect()                              # untimed: after this mode's span, before the next
    return rows


def iteration_rank(rank: int, world: int, args, init: str, out: str) -> None:
    torch.set_num_threads(1)
    args = with_run_defaults(args)
    device = torch.device("cpu")
    if args.device == "cuda":                                 # a GPU per rank, or shared round-robin
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    configure_clock(args.net, device.type)
    dist.init_process_group(group_backend(args.plan), init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=args.timeout))
    try:
        shape = input_shape(args)
        modes = [_Mode(spec, rank, world, args, shape, device) for spec in args.specs or mode_specs(args)]
        warmup = max([args.warmup] + [m.warmup_needed() for m in modes])
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(args.batch_size, *shape, generator=g).to(device)
        y = torch.randint(0, args.num_classes, (args.batch_size,), generator=g).to(device)
        rows = time_rounds(modes, x, y, warmup, args.iters)
        for m in modes:
            if m.agg is not None:
                m.agg.close()
        lock = train.lock_given_up()                   # virtual: were phases timed with co-runners?
        if rank == 0:
            Path(out).write_text(json.dumps({"warmup": warmup, "rows": rows, **lock}))
    finally:
        dist.destroy_process_group()


def summarize_iterations(raw: dict, args, world: int, link: str, rate_bps: float | None = None) -> list[dict]:
    """One row per mode: medians over the timed iterations, and the paired ratio to the reference."""
    rows, args = raw["rows"], with_run_defaults(args)
    ref = next((m for m in ("torch_ddp", "ddp") if m in rows), None)
    out = []
    for mode, its in rows.items():
        col = {k: [r[k] for r in its] for k in COLS}
        rec = {"link": link, "model": args.model, "device": args.device, "plan": args.plan, "N": world,
               "batch_per_rank": args.batch_size,
               "aggregator": mode, **{k: statistics.median(col[k]) for k in COLS if k != "bytes_sent"},
               "MB_per_rank": col["bytes_sent"][-1] / 1e6 if mode != "torch_ddp" else None,   # unknown
               "iters": len(its), "warmup": raw["warmup"]}
        if rate_bps:                                   # the link's bound on the bytes sent (if any)
            rec["bound_s"] = col["bytes_sent"][-1] * 8 / rate_bps if col["bytes_sent"][-1] else None
        rec.update(iteration_intervals(col["iter_s"], [r["iter_s"] for r in rows[ref]] if ref else None))
        rec["ref"] = ref
        out.append(rec)
    return out


def iteration_intervals(seconds: list[float], ref_seconds: list[float] | None) -> dict:
    """The bootstrap interval of the median seconds per iteration, and the median per-iteration ratio to
    the reference mode with its own (the modes are interleaved, so iteration i of each saw the same load:
    the ratio is paired)."""
    ci = median_interval(seconds)
    out = {"iter_lo_s": ci.lo, "iter_hi_s": ci.hi, "over_ref": None, "over_ref_lo": None, "over_ref_hi": None}
    if ref_seconds:
        ratio = median_interval([a / b for a, b in zip(seconds, ref_seconds)])
        out.update(over_ref=ratio.median, over_ref_lo=ratio.lo, over_ref_hi=ratio.hi)
    return out


def print_iterations(records: list[dict], header: str) -> None:
    cols = ["aggregator", "iter_s", "iter_ci", "compute_s", "aggregate_s", "wire_s", "comm_s", "exposed_s",
            "MB_per_rank"] + (["bound_s"] if "bound_s" in records[0] else []) + ["over_ref", "over_ref_ci"]
    r0 = records[0]
    ref = f"over_ref = median per-iteration ratio to {r0['ref']}" if r0["ref"] else "no reference mode"
    where = f"cuda ({r0['plan']})" if r0.get("device") == "cuda" else "cpu, 1 thread/rank"
    shown = [{**r, "iter_ci": Interval(r["iter_s"], r["iter_lo_s"], r["iter_hi_s"]).text(),
              "over_ref_ci": Interval(r["over_ref"], r["over_ref_lo"], r["over_ref_hi"]).text(".3g")
              if r["over_ref"] is not None else None} for r in records]
    print_markdown(shown, cols, f"{header}\n# model={r0['model']}, {where}, batch {r0['batch_per_rank']}/rank, "
                   f"modes interleaved, median of {r0['iters']} iterations after {r0['warmup']} warm-up "
                   f"(_ci: {CONFIDENCE:.0%} bootstrap interval of the median), {ref}")


def input_shape(args) -> tuple[int, int, int]:
    """``--input-shape``, else :func:`default_input_shape`."""
    if args.input_shape:
        return tuple(args.input_shape)
    return default_input_shape(args.model)


def default_input_shape(model: str) -> tuple[int, int, int]:
    """The shape of the data a model is built for by default (digits for the CNN, CIFAR for the ResNets)."""
    return (1, 8, 8) if model == "cnn" else (3, 32, 32)


def add_workload_args(p, model: str, iters: int) -> None:
    """What one timed iteration is (model, batch, counts, aggregator overrides): shared with
    ``gvq.bench netns train``, which passes these flags on to the ranks it starts."""
    p.add_argument("--model", default=model)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--input-shape", type=int, nargs=3, default=None, metavar=("C", "H", "W"),
                   help="one input's shape (default: 1 8 8 for cnn, 3 32 32 otherwise); e.g. 1 28 28 for "
                        "Fashion-MNIST, so seconds per iteration match a run on it")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--iters", type=int, default=iters)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--set", nargs="*", default=[], help="Hydra overrides for the aggregators (as gvq.bench "
                   "aggregate), e.g. ddp_powersgd:aggregator.rank=4")


def parse_iteration_args(argv):
    p = argparse.ArgumentParser(prog="python -m gvq.bench train", description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, nargs="+", default=[2, 4])
    p.add_argument("--aggregators", nargs="+", default=list(DEFAULT_MODES),
                   help="conf/aggregator options, torch_ddp (bare DDP loop) or local (no communication)")
    add_workload_args(p, model="cnn", iters=30)
    p.add_argument("--bandwidth", type=float, default=None,
                   help="emulated per-rank link (bit/s) for the runner's aggregators; DDP's are never shaped")
    p.add_argument("--compressed-only", action="store_true",
                   help="time compressed iterations only (as gvq.bench aggregate: fit GradiVeQ's basis first)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: model, data and codecs on the GPU (a GPU per rank over NCCL, else ranks "
                        "sharing GPUs over host-staged gloo; wall clock, synchronised at every reading)")
    add_clock_args(p)
    add_timeout_arg(p)
    p.add_argument("--out", default=None, help="write the table's records as JSON (with --rank: the raw "
                   "per-iteration rows, rank 0 only)")
    p.add_argument("--rank", type=int, default=None,
                   help="run only this rank (ranks started elsewhere, e.g. in network namespaces)")
    p.add_argument("--init", default=None, help="with --rank: the rendezvous URL (file://...)")
    args = p.parse_args(argv)
    if min(args.world_size) < 1 or args.iters < 1 or args.warmup < 0:
        p.error("--world-size and --iters must be >= 1, --warmup >= 0")
    if len(set(args.aggregators)) != len(args.aggregators):
        p.error("--aggregators: each mode once")
    if args.rank is not None and (len(args.world_size) != 1 or not args.init):
        p.error("--rank needs one --world-size and --init")
    if args.bandwidth is not None and args.bandwidth <= 0:
        p.error("--bandwidth must be > 0")
    check_clock_args(p, args, [args.bandwidth])
    unseen = [m for m in args.aggregators if m.startswith(("ddp", "torch_ddp"))]
    if args.net["clock"] == "virtual" and unseen:
        p.error(f"--clock virtual: {', '.join(unseen)} communicate outside gvq's P2P (torch DDP); "
                "time them with --clock wall (kernel shaping: python -m gvq.bench netns train)")
    return args


def _cuda_plan(args, world: int) -> str:
    """The launcher's placement (:func:`gvq.run.placement.cuda_plan`), or the exit with its one line."""
    ddp = [m for m in args.aggregators if m.startswith(("ddp", "torch_ddp"))]
    try:
        return cuda_plan(world, ddp[0] if ddp else args.aggregators[0], bool(ddp))
    except ConfigError as e:
        raise BenchError(f"gvq.bench train --device cuda --world-size {world}: {e}") from None


def run_iterations(args, world: int) -> dict:
    """Spawn ``world`` loopback ranks; rank 0's raw per-iteration rows."""
    raw = spawn_loopback(iteration_rank, world, world, args)
    if raw.get("ranks_without_clock_lock"):
        print(f"gvq.bench: warning: {raw['ranks_without_clock_lock']} rank(s) gave the host's clock lock up "
              "(another gvq run held it): their virtual times include co-runners' contention", file=sys.stderr)
    return raw


def main(argv: list[str]) -> list[dict]:
    """``python -m gvq.bench train ...`` (``argv``: the words after ``train``)."""
    args = parse_iteration_args(argv)
    if args.rank is not None:                 # one externally started rank (gvq.bench.netns train)
        iteration_rank(args.rank, args.world_size[0], args, args.init, args.out or "/dev/null")
        return []
    records = []
    link = (f"{args.bandwidth / 1e6:g} Mbit/s per rank (emulated, runner aggregators)" if args.bandwidth
            else "unshaped loopback")
    for world in args.world_size:
        args.plan = _cuda_plan(args, world) if args.device == "cuda" else None
        recs = summarize_iterations(run_iterations(args, world), args, world, link, rate_bps=args.bandwidth)
        print_iterations(recs, f"iteration time, {link}, N={world}, {clock_label(args.net)}")
        records += recs
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=2))
    return records
