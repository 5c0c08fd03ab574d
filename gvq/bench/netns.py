"""Kernel-shaped per-rank links (root only): ``sudo python -m gvq.bench netns [grid.links_bps=[5e7,2e8]]``
validates the link emulator; ``sudo python -m gvq.bench netns-train`` compares whole training iterations
of the runner's ``rar`` with torch DDP (``ddp``, ``ddp_fp16``, ``ddp_powersgd``): conf/grid/netns_train.yaml.

See docs/design.md#gvqbenchnetnspy for how it works and why.
"""
from __future__ import annotations

import contextlib
import json
import signal
import tempfile
from pathlib import Path
from types import SimpleNamespace

from gvq.bench import Progress
from gvq.bench import train as bench_train
from gvq.bench.aggregate import aggregation_args, run_aggregation
from gvq.bench.netns_links import Links, auto_burst, auto_burst_bytes, available
from gvq.schema.errors import ConfigError
from gvq.schema.tool import namespace
from gvq.run.signals import Interrupted
from gvq.run.logs import write_json_atomic


def rar_keys(args, link: str) -> list[str]:
    """``gvq.bench aggregate``'s keys for uncompressed RAR on this check's ranks and model, on ``link``
    (``[]``: none emulated)."""
    return ["grid.settings=[rar]", f"grid.world_sizes=[{args.world_size}]", f"grid.links_bps={link}",
            "grid.set=[]", f"reps={args.reps}", f"model={args.model}"]


def aggregation_rank_argv(args, rank: int, tmp: str, out: str, keys: list[str] | None = None) -> list[str]:
    """``python -m`` words of one namespaced rank of :func:`kernel_shaped` (``keys``: ``gvq.bench aggregate``'s,
    default RAR), unshaped by gvq (the kernel shapes it)."""
    keys = rar_keys(args, "[]") if keys is None else keys
    return ["gvq.bench", "aggregate", *keys, f"rank={rank}", f"init=file://{tmp}/rendezvous", "--out", out]


def shaped_records(links: Links, args, keys: list[str]) -> list[dict]:
    """``gvq.bench aggregate`` on ``keys`` with every rank in its namespace of ``links``: rank 0's records."""
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/records.json"
        links.run_ranks(lambda i: aggregation_rank_argv(args, i, tmp, out, keys))
        return json.loads(Path(out).read_text())


def kernel_shaped(args, rate: float) -> dict:
    """RAR with every rank in its namespace, no emulation: the kernel shapes the links."""
    with Links(args.world_size, rate) as links:
        rec = shaped_records(links, args, rar_keys(args, "[]"))[0]
    burst = auto_burst_bytes(rate)
    rec.update(bandwidth_bps=rate, shaping=f"kernel tbf, per-rank veth, burst {burst}b")
    # A rank's egress can carry at most its bucket plus rate x time, whatever the schedule.
    rec["bound_s"] = max(0, rec["bytes_per_rank"] - burst) * 8 / rate
    return rec


def in_process(keys: list[str]) -> list[dict]:
    """``gvq.bench aggregate`` on ``keys`` (one world size, one link) on loopback ranks spawned here."""
    from gvq.bench.__main__ import COMMANDS
    from gvq.schema.tool import compose_command
    ns = aggregation_args(compose_command(COMMANDS["aggregate"], keys), SimpleNamespace(out=None))
    ns.world_size, ns.bandwidth = ns.world_size[0], ns.bandwidth[0]    # one cell, as bench_aggregate runs each
    return run_aggregation(ns)


def emulated(args, rate: float) -> dict:
    rec = in_process(rar_keys(args, f"[{rate}]"))[0]
    rec["shaping"] = "in-process emulator, loopback"
    return rec


def _interrupt(signum, frame):
    raise Interrupted(signum)


@contextlib.contextmanager
def sigterm_interrupts():
    """While inside: SIGTERM raises :class:`Interrupted`, so the ``finally`` / ``__exit__`` teardowns run
    as on Ctrl-C (the entry point then exits 128 + 15)."""
    try:
        old = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:                        # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def shaping_label(rate: float, burst: str, world: int) -> str:
    return f"kernel tc tbf, {rate / 1e6:g} Mbit/s per rank (burst {burst}), N={world}"


def bench_netns_train(cfg, paths) -> list[dict]:
    """``python -m gvq.bench netns-train``: whole iterations, kernel-shaped per-rank links and loopback."""
    args = namespace(cfg, paths)
    g = args.grid
    args.aggregators, args.world_size, args.set, args.rates = g["settings"], g["world_sizes"], g["set"], g["links_bps"]
    if not args.world_size or min(args.world_size) < 2 or args.iters < 1 or not args.rates or min(args.rates) <= 0:
        raise ConfigError("grid.world_sizes: each >= 2; iters >= 1; grid.links_bps: at least one, each > 0")
    why = available()
    if why:
        print(f"gvq.bench netns-train: skipped: {why}")
        return []
    with sigterm_interrupts():
        records = _train(args)
    _print_summary(records)
    if args.out:
        write_json_atomic(args.out, records)
    return records


def rank_overrides(args) -> list[str]:
    """What a namespaced rank's ``gvq.bench train`` is given: the workload and modes, no emulated link (the
    kernel shapes it) and the shaped run's timeout."""
    keys = [f"{k}={json.dumps(getattr(args, k))}" for k in ("model", "num_classes", "batch_size", "iters", "warmup",
                                                             "input_shape", "timeout")]
    return keys + [f"grid.settings={json.dumps(args.aggregators)}", f"grid.set={json.dumps(args.set)}",
                   "grid.links_bps=[]"]


def _train(args) -> list[dict]:
    passthrough = rank_overrides(args)
    records, shown = [], Progress("netns-train", len(args.world_size) * (len(args.rates) + bool(args.loopback)))
    for world in args.world_size:
        if args.loopback:
            recs = bench_train.summarize_iterations(bench_train.run_iterations(args, world), args, world,
                                                    "unshaped loopback")
            bench_train.print_iterations(recs, f"iteration time, unshaped loopback, N={world}")
            records += [{**r, "rate_bps": None} for r in recs]
            shown.done(f"N={world}, unshaped loopback")
        for rate in args.rates:
            burst = auto_burst(rate) if args.burst == "auto" else args.burst
            label = shaping_label(rate, burst, world)
            with tempfile.TemporaryDirectory() as tmp, Links(world, rate, burst) as links:
                out = f"{tmp}/o.json"
                links.run_ranks(lambda i: ["gvq.bench", "train", f"rank={i}", f"grid.world_sizes=[{world}]",
                                           f"init=file://{tmp}/rendezvous", "--out", out, *passthrough],
                                args.timeout)
                raw = json.loads(Path(out).read_text())
            recs = bench_train.summarize_iterations(raw, args, world, label, rate_bps=rate)
            bench_train.print_iterations(recs, f"iteration time, {label}")
            records += [{**r, "rate_bps": rate, "burst": burst} for r in recs]
            shown.done(label)
    return records


def _print_summary(records: list[dict]) -> None:
    import pandas as pd
    df = pd.DataFrame(records)
    df["link"] = [f"N={n}, " + ("loopback" if r is None or r != r else f"{r / 1e6:g} Mbit/s")
                  for n, r in zip(df["N"], df["rate_bps"])]
    order = list(dict.fromkeys(df["link"]))
    piv = df.pivot(index="aggregator", columns="link", values="iter_s")[order]
    piv = piv.reindex(list(dict.fromkeys(df["aggregator"])))
    print("\n# summary: median iteration time (s); shaped columns: kernel tc tbf per-rank links")
    print(piv.to_markdown(floatfmt=".4g"))


def bench_netns(cfg, paths) -> list[dict]:
    """``python -m gvq.bench netns``: uncompressed RAR, kernel tbf per-rank links against the emulator."""
    args = namespace(cfg, paths)
    args.rates, args.world_size = args.grid["links_bps"], (args.grid["world_sizes"] or [0])[0]
    if args.world_size < 2 or not args.rates or min(args.rates) <= 0 or args.reps < 1:
        raise ConfigError("grid.world_sizes: its first >= 2; grid.links_bps: at least one, each > 0; reps >= 1")
    why = available()
    if why:
        print(f"gvq.bench netns: skipped: {why}")
        return []
    rows, shown = [], Progress("netns", len(args.rates))
    for rate in args.rates:
        with sigterm_interrupts():
            k, e = kernel_shaped(args, rate), emulated(args, rate)
        shown.done(f"{rate / 1e6:g} Mbit/s, N={args.world_size}: kernel-shaped and emulated")
        rows.append({"rate_mbps": rate / 1e6, "N": args.world_size, "kernel_median_s": k["median_s"],
                     "emulated_median_s": e["median_s"], "emulated_over_kernel": e["median_s"] / k["median_s"],
                     "bound_s": k["bound_s"], "kernel_over_bound": k["median_s"] / k["bound_s"],
                     "emulated_over_bound": e["median_s"] / e["bound_s"]})
    import pandas as pd
    print(f"\n# uncompressed RAR, model={args.model}, N={args.world_size}: kernel tbf per-rank links "
          "(burst 1 ms of the rate) vs emulator")
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4g"))
    if args.out:
        write_json_atomic(args.out, rows)
    return rows
