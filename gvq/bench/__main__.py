"""``python -m gvq.bench <subcommand> [flags]``: the benchmarks (speed targets live here, never in tests).

    python -m gvq.bench aggregate --world-size 4 --bandwidth 5e7 2e8   # aggregation time per aggregator
    python -m gvq.bench train --world-size 2 4                         # whole iterations vs torch DDP
    python -m gvq.bench quantizers                                     # codec GB/s, one thread
    sudo python -m gvq.bench netns [train] --rates 5e7 2e8             # kernel-shaped links (root)
    python -m gvq.bench clock                                          # virtual vs wall clock (V1-V3)
    python -m gvq.bench paper                                          # the GradiVeQ paper's time table
    python -m gvq.bench startup                                        # a 1-iteration run: start-up split
    python -m gvq.bench codecs                                         # every codec per call vs its floor
    python -m gvq.bench gpucheck [--part tests codecs cli]             # the CUDA path, one table (make gpu-check)
    python -m gvq.bench overlap [--wall]                               # compression vs the overlapped fp16 baseline
    python -m gvq.bench soak --kills 4 --every 5                       # planned SIGKILLs (--seed), restarts=K,
                                                                       # nothing lost

``make bench`` runs ``aggregate`` with the settings docs/results.md quotes.  Each subcommand's ``--help`` lists its
flags.
"""
from __future__ import annotations

import sys

SUBCOMMANDS = {          # name -> module whose ``main(argv)`` runs it (imported on use: each is heavy)
    "aggregate": "gvq.bench.aggregate",
    "train": "gvq.bench.train",
    "quantizers": "gvq.bench.quantizers",
    "netns": "gvq.bench.netns",
    "clock": "gvq.bench.validate_clock",
    "paper": "gvq.bench.paper",
    "startup": "gvq.bench.startup",
    "codecs": "gvq.bench.codecs",
    "gpucheck": "gvq.bench.gpucheck",
    "overlap": "gvq.bench.overlap",
    "soak": "gvq.bench.soak",
}


def main(argv: list[str] | None = None):
    """Dispatch ``argv[0]`` to its subcommand; returns what the subcommand returns (its records)."""
    import importlib
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        print(f"usage: python -m gvq.bench {{{','.join(SUBCOMMANDS)}}} [--help]", file=sys.stderr)
        raise SystemExit(2)
    from gvq.bench.common import BenchError
    try:
        return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])
    except BenchError as e:
        raise SystemExit(str(e)) from None


if __name__ == "__main__":
    from gvq.run.errors import RunEnded
    try:
        main()
    except RunEnded as e:              # netns: SIGTERM, after its teardowns (exit 128 + 15)
        sys.exit(e.code)
