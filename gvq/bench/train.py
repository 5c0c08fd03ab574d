"""Iteration-time benchmark: the runner's aggregators against torch ``DistributedDataParallel`` (gloo) on
the same model, batch and ranks: ``python -m gvq.bench train grid.world_sizes=[2,4]`` (conf/grid/train.yaml).

See docs/design.md#gvqbenchtrainpy for how it works and why.
"""
from __future__ import annotations

import json
import sys
import statistics
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from gvq.aggregators.base import RunContext
from gvq.aggregators.ddp import wrap_ddp
from gvq.bench import BenchError, Progress
from gvq.bench.common import (build_model, check_net, clock_label, collections_untimed, configure_clock,
                              make_aggregator, model_workload, net_defaults, print_markdown, setting_name,
                              spawn_loopback)
from gvq.bench.keys import TrainKeys
from gvq.report.intervals import CONFIDENCE, Interval, median_interval
from gvq.comm import clock
from gvq.comm.links import Cluster
from gvq.comm.group import process_group
from gvq.methods.every_step import EveryStep
from gvq.run import train
from gvq.run.rows import reduce_row
from gvq.schema import columns
from gvq.run.placement import cuda_plan, group_backend
from gvq.schema.errors import ConfigError
from gvq.schema.tool import choose, namespace

#: what an iteration run reads beyond a :class:`gvq.bench.keys.Workload`'s keys, for callers whose keys are
#: only those (``gvq.bench overlap``, ``netns-train``): no link, the wall clock, the host, no GPU plan
RUN_DEFAULTS = {"bandwidth": None, "timeout": TrainKeys.timeout, "compressed_only": False, "device": "cpu",
                "plan": None, "net": net_defaults(), "specs": None, "set": ()}


def with_run_defaults(args) -> SimpleNamespace:
    """``args`` with :data:`RUN_DEFAULTS` filled in where its keys have none."""
    return SimpleNamespace(**{**RUN_DEFAULTS, **vars(args)})
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
    setting: str = ""                  # the setting it times (``Setting.canonical``; "": the option)


def mode_specs(args) -> list[ModeSpec]:
    """``grid.settings`` as modes: each option under its own name, ``grid.set`` and the link for all."""
    return [ModeSpec(m, m, tuple(args.set), args.bandwidth) for m in args.aggregators]


class _Mode:
    """One mode's model, optimizer and aggregator (None for ``torch_ddp`` / ``local``)."""

    def __init__(self, spec: ModeSpec, rank: int, world: int, args, work, device: torch.device):
        self.name, self.agg, self.work = spec.label, None, work
        net = build_model(args.model, work.num_classes, work.in_channels).to(device)
        if spec.option == "torch_ddp":
            net = wrap_ddp(net)           # as gvq's own DDP options wrap it (no per-forward buffer sync)
        elif spec.option != "local":
            # as the runner builds it: aggregator.overlap=true runs the ring inside backward, via DDP
            self.agg = make_aggregator(spec.option, list(spec.overrides))
            # the link applies to gvq's aggregators only: torch DDP's collectives are not shaped
            # net.ranks_per_node: nodes of the net (topology=hierarchical's rings), as a run's ranks sit
            ctx = RunContext(rank, world, 0, args.timeout, spec.bandwidth, cluster=Cluster.of_net(args.net))
            self.agg.setup(list(net.parameters()), ctx)
            if args.compressed_only:
                # pin the compressed phase (GradiVeQ: a fitted basis, no sampling; PowerSGD: no warm-up)
                self.agg.prepare_benchmark([torch.zeros_like(p) for p in net.parameters()], args)
            net = self.agg.wrap(net)                   # torch DDP's wrapper; the model for the others
            self.method = EveryStep()                  # the runner's default: the gradients every step
            self.method.setup(list(net.parameters()), self.agg)
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
                loss = self.work.loss(self.net(x), y)
                self.opt.zero_grad(set_to_none=False)
                t_backward = clock.now()
                loss.backward()
            t_end = clock.now()
            with clock.phase("compute"):
                self.opt.step()
            # backward alone: the only span an overlapped aggregator's buckets can hide behind
            row = {"compute_s": t_end - t0, "backward_s": t_end - t_backward}
        else:                                          # the runner's own per-iteration path
            row = train.step(self.net, self.opt, self.agg, self.method, self.work, x, y, it)
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
    with process_group(group_backend(args.plan), init_method=init, rank=rank, world_size=world,
                timeout=timedelta(seconds=args.timeout)):
        _time_modes(rank, args, device, out)


def _time_modes(rank: int, args, device: torch.device, out: str) -> None:
    """Every mode timed on this rank; rank 0 writes the rows.  The modes (DDP models among them) are
    freed when it returns, inside the group (:mod:`gvq.comm.group`)."""
    world = dist.get_world_size()
    work = workload(args)
    modes = [_Mode(spec, rank, world, args, work, device) for spec in args.specs or mode_specs(args)]
    warmup = max([args.warmup] + [m.warmup_needed() for m in modes])
    g = torch.Generator().manual_seed(rank)
    x, y = (t.to(device) for t in work.synthetic_batch(args.batch_size, g))
    rows = time_rounds(modes, x, y, warmup, args.iters)
    for m in modes:
        if m.agg is not None:
            m.agg.close()
    lock = train.lock_given_up()                   # virtual: were phases timed with co-runners?
    if rank == 0:
        Path(out).write_text(json.dumps({"warmup": warmup, "rows": rows, **lock}))


def summarize_iterations(raw: dict, args, world: int, link: str, rate_bps: float | None = None) -> list[dict]:
    """One row per mode: medians over the timed iterations, and the paired ratio to the reference."""
    rows, args = raw["rows"], with_run_defaults(args)
    ref = next((m for m in ("torch_ddp", "ddp") if m in rows), None)
    specs = {s.label: s for s in args.specs or ()}
    out = []
    for mode, its in rows.items():
        col = {k: [r[k] for r in its] for k in COLS}
        spec = specs.get(mode, ModeSpec(mode, mode, tuple(args.set)))        # grid.settings' mode: its option
        rec = {"link": link, "model": args.model, "device": args.device, "plan": args.plan, "N": world,
               "batch_per_rank": args.batch_size, "aggregator": mode,
               "setting": spec.setting or setting_name(spec.option, spec.overrides),
               **{k: statistics.median(col[k]) for k in COLS if k != "bytes_sent"},
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
    cols = ["setting", "iter_s", "iter_ci", "compute_s", "aggregate_s", "wire_s", "comm_s", "exposed_s",
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


def workload(args):
    """The timed step's workload: inputs of the ``input_shape`` key, else the input ``model``'s config
    declares (:func:`gvq.bench.common.model_workload`)."""
    return model_workload(args.model, args.num_classes, args.input_shape)


def iteration_args(cfg, paths) -> SimpleNamespace:
    """The composed keys as the namespace the ranks read (``args.world_size`` ... from the grid), checked
    before any rank starts: a bad count, a link key, a clock that cannot time a mode is a ConfigError."""
    args = namespace(cfg, paths)
    g = args.grid
    args.aggregators, args.world_size, args.set = g["settings"], g["world_sizes"], g["set"]
    args.links = g["links_bps"] or [None]              # none: unshaped loopback
    if not args.aggregators or not args.world_size or min(args.world_size) < 1 or args.iters < 1 or args.warmup < 0:
        raise ConfigError("grid.settings: at least one; grid.world_sizes and iters >= 1, warmup >= 0")
    if len(set(args.aggregators)) != len(args.aggregators):
        raise ConfigError("grid.settings: each mode once")
    if any(b is not None and b <= 0 for b in args.links):
        raise ConfigError("grid.links_bps: each > 0")
    choose("device", args.device, ("cpu", "cuda"))
    check_net(args.net, args.links, args.world_size, ("bandwidth_bps", "latency_s"))
    if args.rank is not None and (len(args.world_size) != 1 or len(args.links) != 1 or not args.init):
        raise ConfigError("rank: needs one of grid.world_sizes, at most one of grid.links_bps, and init")
    unseen = [m for m in args.aggregators if m.startswith(("ddp", "torch_ddp"))]
    if args.net["clock"] == "virtual" and unseen:
        raise ConfigError(f"net.clock=virtual: {', '.join(unseen)} communicate outside gvq's P2P (torch DDP); "
                          "time them with net.clock=wall (kernel shaping: python -m gvq.bench netns-train)")
    args.plan, args.specs, args.bandwidth = None, None, args.links[0]
    return args


def _cuda_plan(args, world: int) -> str:
    """The launcher's placement (:func:`gvq.run.placement.cuda_plan`), or the exit with its one line."""
    ddp = [m for m in args.aggregators if m.startswith(("ddp", "torch_ddp"))]
    try:
        return cuda_plan(world, ddp[0] if ddp else args.aggregators[0], bool(ddp))
    except ConfigError as e:
        raise BenchError(f"train device=cuda, N={world}: {e}") from None


def run_iterations(args, world: int) -> dict:
    """Spawn ``world`` loopback ranks; rank 0's raw per-iteration rows."""
    raw = spawn_loopback(iteration_rank, world, world, args)
    if raw.get("ranks_without_clock_lock"):
        print(f"gvq.bench: warning: {raw['ranks_without_clock_lock']} rank(s) gave the host's clock lock up "
              "(another gvq run held it): their virtual times include co-runners' contention", file=sys.stderr)
    return raw


def bench_train(cfg, paths) -> list[dict]:
    """``python -m gvq.bench train [KEY=VALUE ...] [--out F]``: one table per world size and link."""
    args = iteration_args(cfg, paths)
    if args.rank is not None:                 # one externally started rank (gvq.bench netns-train)
        iteration_rank(args.rank, args.world_size[0], args, args.init, args.out or "/dev/null")
        return []
    records, shown = [], Progress("train", len(args.links) * len(args.world_size))
    for bw in args.links:
        args.bandwidth = bw
        link = f"{bw / 1e6:g} Mbit/s per rank (emulated, runner aggregators)" if bw else "unshaped loopback"
        for world in args.world_size:
            args.plan = _cuda_plan(args, world) if args.device == "cuda" else None
            recs = summarize_iterations(run_iterations(args, world), args, world, link, rate_bps=bw)
            print_iterations(recs, f"iteration time, {link}, N={world}, {clock_label(args.net)}")
            records += recs
            shown.done(f"N={world}, {f'{bw / 1e6:g} Mbit/s' if bw else 'unshaped loopback'}: {len(recs)} modes")
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=2))
    return records
