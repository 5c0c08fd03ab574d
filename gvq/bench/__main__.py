"""``python -m gvq.bench <command> [KEY=VALUE ...] [--out F]``: the benchmarks (speed targets live here,
never in tests).

    python -m gvq.bench aggregate grid.world_sizes=[4] grid.links_bps=[5e7,2e8]   # aggregation time per aggregator
    python -m gvq.bench train grid.world_sizes=[2,4]                   # whole iterations vs torch DDP
    python -m gvq.bench quantizers numel=8192                          # codec GB/s, one thread
    sudo python -m gvq.bench netns grid.links_bps=[5e7,2e8]            # kernel-shaped links (root): RAR vs emulator
    sudo python -m gvq.bench netns-train                               # ... and whole iterations vs DDP
    sudo python -m gvq.bench netns-nodes                               # ... nodes of ranks (2 x 2), hierarchical
    python -m gvq.bench clock                                          # virtual vs wall clock (V1-V3)
    python -m gvq.bench paper                                          # the GradiVeQ paper's time table
    python -m gvq.bench startup                                        # a 1-iteration run: start-up split
    python -m gvq.bench codecs                                         # every codec per call vs its floor
    python -m gvq.bench topk [ratios=[0.01,0.001]]                     # top-k's selection vs torch.topk, sort, ...
    python -m gvq.bench gpucheck [part=[tests,codecs,cli]]             # the CUDA path, one table (make gpu-check)
    python -m gvq.bench overlap [wall=true] [grid.world_sizes=[4]]     # compression vs the overlapped fp16 baseline
    python -m gvq.bench method-cost [every=10] [world_size=1]          # a step that does not sync: its cost
    python -m gvq.bench soak kills=4 every=5                           # planned SIGKILLs (seed), restarts=K,
                                                                       # nothing lost

``make bench`` runs ``aggregate`` bare (its grid, conf/grid/bench.yaml, is what docs/results.md quotes).
Each command's ``--help`` lists its keys with their defaults; ``--cfg`` prints them composed.
"""
from __future__ import annotations

import sys

from gvq.bench import BenchError
from gvq.bench.keys import (OUT, AggregateKeys, ClockKeys, CodecsKeys, GpucheckKeys, MethodCostKeys, NetnsKeys,
                            NetnsNodesKeys, NetnsTrainKeys, OverlapKeys, PaperKeys, QuantizersKeys, SoakKeys,
                            StartupKeys, TopkKeys, TrainKeys)
from gvq.schema.tool import Arg, Command, dispatch

COMMANDS = {
    "aggregate": Command(AggregateKeys, "gvq.bench.aggregate:bench_aggregate", "aggregation time of each setting, "
                         "compute paused, per world size and link", OUT, grid="bench"),
    "train": Command(TrainKeys, "gvq.bench.train:bench_train", "whole iterations of the runner's aggregators "
                     "against torch DDP, modes interleaved", OUT, grid="train"),
    "overlap": Command(OverlapKeys, "gvq.bench.overlap:bench_overlap", "compression against the overlapped fp16 "
                       "baseline, per cell of its grid", OUT, grid="overlap"),
    "method-cost": Command(MethodCostKeys, "gvq.bench.method_cost:bench_method_cost", "every_step's compute-only "
                           "path against DiLoCo's non-sync steps (train.step, wall clock): the paired ratio", OUT),
    "quantizers": Command(QuantizersKeys, "gvq.bench.quantizers:bench_quantizers", "quantize / dequantize GB/s of "
                          "every scalar quantizer, one thread", OUT),
    "codecs": Command(CodecsKeys, "gvq.bench.codecs:bench_codecs", "every codec per call against its floor", OUT),
    "topk": Command(TopkKeys, "gvq.bench.topk:bench_topk", "top-k's selection (the codec at each scope) against "
                    "torch.topk, a full sort, kthvalue and DGC's sampled threshold, one thread, paired", OUT),
    "clock": Command(ClockKeys, "gvq.bench.validate_clock:bench_clock", "virtual against wall clock (V1-V3)", OUT,
                     grid="clock"),
    "startup": Command(StartupKeys, "gvq.bench.startup:bench_startup", "a 1-iteration run: its start-up split", OUT),
    "paper": Command(PaperKeys, "gvq.bench.paper:bench_paper", "the GradiVeQ paper's time table (cli.py runs, "
                     "then python -m gvq.report cycle)",
                     (Arg("--out", "the runs and the report go here", default="runs/paper_time"),), grid="paper"),
    "soak": Command(SoakKeys, "gvq.bench.soak:bench_soak", "planned SIGKILLs of ranks, restarts: nothing lost",
                    OUT),
    "netns": Command(NetnsKeys, "gvq.bench.netns:bench_netns", "(root) RAR behind kernel tbf per-rank links "
                     "against the link emulator", OUT, grid="netns"),
    "netns-train": Command(NetnsTrainKeys, "gvq.bench.netns:bench_netns_train", "(root) whole iterations behind "
                           "kernel tbf per-rank links, RAR against torch DDP", OUT, grid="netns_train"),
    "netns-nodes": Command(NetnsNodesKeys, "gvq.bench.netns_nodes:bench_netns_nodes", "(root) nodes of ranks behind "
                           "kernel tbf links of two classes against the emulator and the virtual clock", OUT,
                           grid="netns_nodes"),
    "gpucheck": Command(GpucheckKeys, "gvq.bench.gpucheck:bench_gpucheck", "the CUDA path: tests, codecs, cli.py "
                        "runs, one table", (Arg("--out", "results folder (part JSONs, gpucheck.json/.md, runs)",
                                                default="runs/gpucheck"),)),
}


def main(argv: list[str] | None = None):
    """Dispatch ``argv[0]`` to its command; returns what the command returns (its records).  Nothing of
    torch is imported before a command runs: ``--help`` lists the benches at once."""
    return dispatch("python -m gvq.bench", COMMANDS, argv, errors=(BenchError,))


if __name__ == "__main__":
    from gvq.run.errors import RunEnded
    try:
        main()
    except RunEnded as e:              # netns: SIGTERM, after its teardowns (exit 128 + 15)
        sys.exit(e.code)
