"""``python -m gvq.predict [flags]``: predicted aggregation and iteration times per aggregator.

    python -m gvq.predict calibrate [--model resnet32]       # once per machine: costs + ring structure
    python -m gvq.predict calibrate-overlap [--model resnet32]   # then: backward profile + DDP's buckets
    python -m gvq.predict calibrate-overlap --host-ranks 4 8     # ... + messages as N ranks here pay them
    python -m gvq.predict rings [--model resnet32]           # are the stored rings still the declared ones?
    python -m gvq.predict --world-size 6 16 --bandwidth 5e7 1e9 --compute-scale 0.16667
    python -m gvq.predict --validate                         # model vs virtual-time benchmarks
    python -m gvq.predict --validate-overlap BENCH.json      # model vs gvq.bench overlap --out BENCH.json
    python -m gvq.predict project                            # winners for N = 2..1024 x 1 Mbit/s..100 Gbit/s

Every figure is on the virtual clock's terms (CPU time of this machine x the scales, plus the link model),
for the aggregators ``calibrate`` measured (make bench's settings: GradiVeQ bf16 pooled K/d = 8,
PowerSGD rank 6).  ``bound`` says what dominates a row: compute, bandwidth (bytes / B), latency
(messages x (alpha + posting)) or codec (the rest of the aggregation).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from gvq.predict import codec_costs
from gvq.predict import cost_model as M

ROOT_DIR = Path("runs/predict")          # calibrate writes <ROOT_DIR>/<model>/


def traffic(m: M.Calibrated, name: str, n: int) -> tuple[float, int]:
    """(bytes a rank sends on average, messages it sends) per aggregation, from the ring structure."""
    nbytes, msgs = 0.0, 0
    for rnd in m.struct["aggregators"][name][str(n)]:
        total = sum(sum(b) for b in rnd["bytes"])
        pieces = sum(1 for seg in rnd["bytes"] for b in seg if b > 0)
        if rnd["kind"] == "allgather":                # every payload forwarded N - 1 times
            nbytes, msgs = nbytes + (n - 1) * total, msgs + n - 1
        elif rnd["kind"] == "ps":                     # N - 1 up, N - 1 down, averaged over ranks
            nbytes, msgs = nbytes + 2 * (n - 1) / n * total, msgs + 2 * (n - 1) // n
        else:
            nbytes += 2 * (n - 1) / n * total
            msgs += 2 * (n - 1) * pieces // max(n, 1)
    return nbytes, msgs


def row(m: M.Calibrated, name: str, n: int, bps: float, alpha: float, codec: float, compute: float) -> dict:
    it = M.iteration(m, name, n, bps, alpha, codec, compute)
    nbytes, msgs = traffic(m, name, n)
    parts = {"compute": it["compute_s"], "bandwidth": 8 * nbytes / bps,
             "latency": msgs * (alpha + 2 * m.cal["msg"][0])}                 # a send and a receive posted
    parts["codec"] = max(it["aggregate_s"] - parts["bandwidth"] - parts["latency"], 0.0) + it["measure_s"]
    return {"N": n, "link_bps": bps, "compute_scale": compute, "aggregator": name, **it,
            "MB_per_rank": nbytes / 1e6, "bound": max(parts, key=parts.get)}


def table(m: M.Calibrated, names, worlds, links, alpha=0.0, codec=1.0, computes=(1.0,)) -> pd.DataFrame:
    df = pd.DataFrame([row(m, a, n, b, alpha, codec, c) for n in worlds for b in links for c in computes
                       for a in names])
    keys = ["N", "link_bps", "compute_scale"]
    base = df[df["aggregator"] == "rar"].set_index(keys)["iter_s"].rename("_rar")
    df = df.join(base, on=keys)
    df["speedup_vs_rar"] = df["_rar"] / df["iter_s"]
    return df.drop(columns="_rar")


def main(argv=None):
    """``python -m gvq.predict [subcommand] ...``; what it cannot answer ends it with one line."""
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    except M.PredictError as e:
        raise SystemExit(str(e)) from None


def _main(argv: list[str]):
    subcommands = {"calibrate": "calibrate", "calibrate-overlap": "calibrate_overlap", "project": "project",
                   "rings": "structure"}
    if argv and argv[0] in subcommands:
        from importlib import import_module
        return import_module(f"gvq.predict.{subcommands[argv[0]]}").main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m gvq.predict", description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--bandwidth", type=float, nargs="+", default=[5e7, 2e8, 1e9], help="bit/s per rank")
    p.add_argument("--latency", type=float, default=0.0, help="alpha: seconds per message on the link")
    p.add_argument("--compute-scale", type=float, nargs="+", default=[1.0])
    p.add_argument("--codec-scale", type=float, default=1.0)
    p.add_argument("--aggregators", nargs="+", default=None, help="default: every calibrated one")
    p.add_argument("--model", default="resnet32", help="reads runs/predict/<model>/ (python -m gvq.predict "
                   "calibrate --model <model> writes it)")
    p.add_argument("--calibration", type=Path, default=None, help="calibrate's output folder, if elsewhere")
    p.add_argument("--validate", action="store_true", help="model vs virtual-time benchmarks, cell by cell")
    p.add_argument("--reps", type=int, default=6, help="--validate: aggregation repetitions per cell")
    p.add_argument("--iters", type=int, default=4, help="--validate: timed iterations per cell")
    p.add_argument("--out", type=Path, default=None, help="--validate: also write the table as CSV here")
    p.add_argument("--validate-overlap", type=Path, nargs="+", default=None, metavar="BENCH_JSON",
                   help="model (calibrate + calibrate-overlap) vs `gvq.bench overlap --out` JSONs, per mode")
    p.add_argument("--overlap-phases", choices=("bench", "calibration"), default="bench",
                   help="--validate-overlap: compute phases from the benchmark's own compute-alone mode "
                        "(measured beside every mode) or from the calibration")
    p.add_argument("--overlap-msg", choices=("host", "calibration"), default="host",
                   help="--validate-overlap: a message posted costs what N ranks sharing this host's cores "
                        "pay (calibrate-overlap --host-ranks N), or the calibration's (a rank a core)")
    codec_costs.add_arguments(p)
    p.add_argument("--comm-core", choices=("shared", "own"), default="shared",
                   help="--validate-overlap: net.comm_core the benchmark ran with (gvq.bench: shared)")
    args = p.parse_args(argv)
    if args.validate_overlap:
        from gvq.predict import validate
        try:
            return validate.report_overlap_validation(args.calibration or ROOT_DIR / args.model,
                                                      args.validate_overlap, args)
        except (ValueError, FileNotFoundError) as e:
            raise SystemExit(f"gvq.predict --validate-overlap: {e}") from None
    m = M.Calibrated.load(args.calibration or ROOT_DIR / args.model)
    if args.validate:
        from gvq.predict import validate
        return validate.report_validation(m, args)
    m, priced = codec_costs.apply(m, args, args.aggregators)
    df = table(m, args.aggregators or m.aggregators, args.world_size, args.bandwidth, args.latency,
               args.codec_scale, args.compute_scale)
    print(f"# predicted, virtual-time terms ({m.cal['model']}, batch {m.cal['batch_size']}, codec "
          f"x{args.codec_scale:g}, alpha {args.latency:g} s; calibrated on {m.cal['host']}; {priced})")
    print(df.to_markdown(index=False, floatfmt=".4g"))
    return df


if __name__ == "__main__":
    main()
