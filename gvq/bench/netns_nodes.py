"""Nodes of ranks behind kernel-shaped links of two classes (root only): ``sudo python -m gvq.bench netns-nodes
[grid.links_bps=[1e8,1e9]] [ranks_per_node=2]`` runs ``gvq.bench aggregate`` (conf/grid/netns_nodes.yaml: RAR
and QSGD, ``aggregator.topology=hierarchical``, 2 x 2) with every rank in its namespace
(:mod:`gvq.bench.netns_links`: inter-node links shaped by tbf, intra-node ones too or unshaped), then the same
keys under gvq's own link emulator and under the virtual clock, and prints each against the kernel's.

See docs/design.md#gvqbenchnetns_nodespy for how it works and why.
"""
from __future__ import annotations

import json

from gvq.bench import Progress
from gvq.bench.netns import in_process, shaped_records, sigterm_interrupts
from gvq.bench.netns_links import TBF_MAX_BPS, Links, auto_burst_bytes, available
from gvq.schema.errors import ConfigError
from gvq.schema.tool import namespace
from gvq.run.logs import write_json_atomic

def aggregate_keys(args, rate: float, how: str) -> list[str]:
    """``gvq.bench aggregate``'s keys for one run of this check: ``kernel`` (nothing emulated: the kernel shapes
    both classes), ``emulated`` (wall clock, gvq's link emulator at the same rates) or ``virtual``."""
    keys = [f"grid.settings={json.dumps(args.settings)}", f"grid.set={json.dumps(args.set)}",
            f"grid.world_sizes=[{args.world_size}]", f"reps={args.reps}", f"model={args.model}",
            f"net.ranks_per_node={args.ranks_per_node}"]
    if how == "kernel":
        return keys + ["grid.links_bps=[]"]
    keys += [f"grid.links_bps=[{rate}]", f"net.intra_bandwidth_bps={args.intra_bandwidth_bps}"]
    return keys + (["net.clock=virtual"] if how == "virtual" else [])


def check(args) -> None:
    if args.world_size < 2 or args.ranks_per_node < 2 or args.world_size % args.ranks_per_node \
            or args.world_size == args.ranks_per_node:
        raise ConfigError("ranks_per_node: >= 2, dividing grid.world_sizes' first into at least two nodes")
    if not args.rates or min(args.rates) <= 0 or args.intra_bandwidth_bps <= 0 or args.reps < 1:
        raise ConfigError("grid.links_bps: at least one, each > 0; intra_bandwidth_bps > 0; reps >= 1")


def one_link(args, rate: float) -> list[dict]:
    """Every setting at one inter-node rate, on the kernel's links, the emulator's and the virtual clock's."""
    with Links(args.world_size, rate, ranks_per_node=args.ranks_per_node, intra_bps=args.intra_bandwidth_bps) as links:
        kernel = shaped_records(links, args, aggregate_keys(args, rate, "kernel"))
    emulated = in_process(aggregate_keys(args, rate, "emulated"))
    virtual = in_process(aggregate_keys(args, rate, "virtual"))
    burst = auto_burst_bytes(rate)
    rows = []
    for k, e, v in zip(kernel, emulated, virtual):
        inter = k["bytes_inter_per_rank"]
        bound = max(0, inter - burst) * 8 / rate     # a rank's inter band carries its bucket plus rate x time
        rows.append({"setting": k["setting"], "inter_mbps": rate / 1e6, "N": args.world_size,
                     "ranks_per_node": args.ranks_per_node, "bytes_inter_per_rank": inter,
                     "kernel_median_s": k["median_s"], "emulated_median_s": e["median_s"],
                     "virtual_median_s": v["median_s"], "emulated_over_kernel": e["median_s"] / k["median_s"],
                     "virtual_over_kernel": v["median_s"] / k["median_s"], "inter_bound_s": bound,
                     "kernel_over_bound": k["median_s"] / bound if bound else None})
    return rows


def intra_label(intra_bps: float) -> str:
    return "unshaped" if intra_bps > TBF_MAX_BPS else f"tbf {intra_bps / 1e6:g} Mbit/s"


def bench_netns_nodes(cfg, paths) -> list[dict]:
    """``python -m gvq.bench netns-nodes``: the grid's settings on kernel-shaped nodes against gvq's clocks."""
    args = namespace(cfg, paths)
    g = args.grid
    args.settings, args.set, args.rates = g["settings"], g["set"], g["links_bps"]
    args.world_size = (g["world_sizes"] or [0])[0]
    check(args)
    why = available()
    if why:
        print(f"gvq.bench netns-nodes: skipped: {why}")
        return []
    rows, shown = [], Progress("netns-nodes", len(args.rates))
    for rate in args.rates:
        with sigterm_interrupts():
            rows += one_link(args, rate)
        shown.done(f"{rate / 1e6:g} Mbit/s between nodes: kernel-shaped, emulated and virtual")
    import pandas as pd
    nodes = args.world_size // args.ranks_per_node
    print(f"\n# model={args.model}, {nodes} nodes x {args.ranks_per_node} ranks, {' '.join(args.set)}: kernel tbf "
          f"(inter-node per rank, burst 1 ms of the rate; intra {intra_label(args.intra_bandwidth_bps)}) vs gvq's "
          f"emulator (wall) and virtual clock at intra {args.intra_bandwidth_bps / 1e6:g} Mbit/s")
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4g"))
    if args.out:
        write_json_atomic(args.out, rows)
    return rows

