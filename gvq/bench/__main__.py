"""``python -m gvq.bench <subcommand> [flags]``: the benchmarks (speed targets live here, never in tests).

    python -m gvq.bench aggregate --world-size 4 --bandwidth 5e7 2e8   # aggregation time per aggregator
    python -m gvq.bench train --world-size 2 4                         # whole iterations vs torch DDP
    python -m gvq.bench quantizers [numel=8192]                        # codec GB/s, one thread
    sudo python -m gvq.bench netns [train] --rates 5e7 2e8             # kernel-shaped links (root)
    python -m gvq.bench clock                                          # virtual vs wall clock (V1-V3)
    python -m gvq.bench paper                                          # the GradiVeQ paper's time table
    python -m gvq.bench startup                                        # a 1-iteration run: start-up split
    python -m gvq.bench codecs                                         # every codec per call vs its floor
    python -m gvq.bench gpucheck [--part tests codecs cli]             # the CUDA path, one table (make gpu-check)
    python -m gvq.bench overlap [wall=true] [grid.world_sizes=[4]]     # compression vs the overlapped fp16 baseline
    python -m gvq.bench soak --kills 4 --every 5                       # planned SIGKILLs (--seed), restarts=K,
                                                                       # nothing lost

``make bench`` runs ``aggregate`` with the settings docs/results.md quotes.  Each subcommand's ``--help`` lists its
keys (KEY=VALUE; ``--cfg`` prints them composed) or, for those still in ``LEGACY``, its flags.
"""
from __future__ import annotations

import sys

from gvq.bench.keys import OUT, ClockKeys, CodecsKeys, OverlapKeys, QuantizersKeys, StartupKeys
from gvq.schema.tool import Command, dispatch

COMMANDS = {
    "overlap": Command(OverlapKeys, "gvq.bench.overlap:bench_overlap", "compression against the overlapped fp16 "
                       "baseline, per cell of its grid", OUT, grid="overlap"),
    "quantizers": Command(QuantizersKeys, "gvq.bench.quantizers:bench_quantizers", "quantize / dequantize GB/s of "
                          "every scalar quantizer, one thread", OUT),
    "clock": Command(ClockKeys, "gvq.bench.validate_clock:bench_clock", "virtual against wall clock (V1-V3)", OUT,
                     grid="clock"),
    "startup": Command(StartupKeys, "gvq.bench.startup:bench_startup", "a 1-iteration run: its start-up split", OUT),
    "codecs": Command(CodecsKeys, "gvq.bench.codecs:bench_codecs", "every codec per call against its floor", OUT),
}
#: the commands still on flags (name -> module whose ``main(argv)`` runs it, imported on use: each is heavy),
#: until each moves into COMMANDS
LEGACY = {
    "aggregate": "gvq.bench.aggregate",
    "train": "gvq.bench.train",
    "netns": "gvq.bench.netns",
    "paper": "gvq.bench.paper",
    "gpucheck": "gvq.bench.gpucheck",
    "soak": "gvq.bench.soak",
}


def main(argv: list[str] | None = None):
    """Dispatch ``argv[0]`` to its command; returns what the command returns (its records)."""
    import importlib
    argv = sys.argv[1:] if argv is None else list(argv)
    from gvq.bench.common import BenchError
    if argv and argv[0] in LEGACY:
        try:
            return importlib.import_module(LEGACY[argv[0]]).main(argv[1:])
        except BenchError as e:
            raise SystemExit(str(e)) from None
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m gvq.bench {{{','.join([*LEGACY, *COMMANDS])}}} [--help]", file=sys.stderr)
        raise SystemExit(2)
    return dispatch("python -m gvq.bench", COMMANDS, argv, errors=(BenchError,))


if __name__ == "__main__":
    from gvq.run.errors import RunEnded
    try:
        main()
    except RunEnded as e:              # netns: SIGTERM, after its teardowns (exit 128 + 15)
        sys.exit(e.code)
