"""Analyses of real gradients: ``python -m gvq.analysis quantizers|correlation|peers|dither|frontier ...``.

* ``quantizers``: quantization error ||Q(G)-G||^2/||G||^2 of every scalar quantizer at s = 3, 5, 9 and
  binary on gradients recorded from a short digits run; checks the ORQ paper's claims (CSV + PNG).
* ``correlation``: GradiVeQ's Fig. 4 (adjacent gradients lie near a plane) and Fig. 5 (compression loss
  against slice size, reusing the first slice's compressor) (PNG + CSV).
* ``peers``: GradiVeQ vs PowerSGD-rank-r at equal bytes per iteration (GradiVeQ fitted on L_t earlier
  gradients, scored on the following ones), plus 4-bit QSGD: relative compression error (CSV + table);
  see :mod:`gvq.analysis.peers`.
* ``gradiveq_trace``: why GradiVeQ's Eq. 7 loss grows once the gradient shrinks: per layer and compressed
  iteration, the codec's error against an independent float64 reference, the fitted mean's size against
  the gradient, the energy captured and d; see :mod:`gvq.analysis.gradiveq_trace`.
* ``frontier``: error against codec time at equal bytes: GradiVeQ over its slice size K at whole-vector
  ratios 4, 8, 16 and PowerSGD over its rank (CSV + PNG + the K recommended at ratio 8); see
  :mod:`gvq.analysis.frontier`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def quantizers(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m gvq.analysis quantizers")
    p.add_argument("--out", default="runs/analysis/quantizers")
    p.add_argument("--model", default="cnn")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--every", type=int, default=10, help="keep every n-th gradient")
    p.add_argument("--bucket", type=int, default=2048)
    args = p.parse_args(argv)
    from gvq.analysis.quantizers import check_claims, plot_errors, quantizer_error_table
    from gvq.analysis.record import record_gradients
    grads, _ = record_gradients(args.model, args.dataset, args.iterations, every=args.every)
    df = quantizer_error_table(grads, bucket=args.bucket)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "quantizer_errors.csv", index=False)
    plot_errors(df, out / "quantizer_errors.png")
    print(f"# mean quantization error, {len(grads)} gradients of {args.model} on {args.dataset}, "
          f"bucket {args.bucket}")
    print(df.to_markdown(index=False, floatfmt=".4g"))
    for claim, held, detail in check_claims(df):
        print(f"{'HELD    ' if held else 'NOT HELD'}  {claim}  ({detail})")
    print(f"-> {out}/quantizer_errors.csv, .png")
    return 0


def correlation(argv) -> int:
    from gvq.analysis.correlation import main as corr_main
    return corr_main(argv) or 0


def parse_peers_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m gvq.analysis peers",
                                description="GradiVeQ vs PowerSGD compression error at equal bytes on "
                                            "real gradients (see gvq/analysis/peers.py)")
    p.add_argument("--out", default="runs/analysis/peers")
    p.add_argument("--model", default="cnn", help="conf/model name (cnn, resnet20, resnet32, ...); the "
                   "ResNets take minutes (resnet32/synthetic, 160 iterations: ~12 min on 2 busy cores)")
    p.add_argument("--dataset", default="digits",
                   help="conf/dataset name; digits = real data (honest default); synthetic = gaussian "
                        "class means (CIFAR-shaped, unrealistic gradient statistics)")
    p.add_argument("--rank", type=int, nargs="+", default=[2, 4], help="PowerSGD ranks")
    p.add_argument("--K", nargs="+", default=["auto", "x1"], help="GradiVeQ slice sizes to try")
    p.add_argument("--match", nargs="+", default=["lambda"], choices=["lambda", "target_ratio"],
                   help="GradiVeQ knob(s) bisected to match PowerSGD's bytes (lambda: Eq. 6 per layer; "
                        "target_ratio: the same K/d in every layer)")
    p.add_argument("--pool", nargs="+", default=["off", "on"], choices=["off", "on"],
                   help="GradiVeQ pool (on: fit on all slices of a layer, d may exceed L_t - 1)")
    # schedule defaults: conf/experiment/digits_gradiveq.yaml (the repo's GradiVeQ run on digits)
    p.add_argument("--L-t", dest="L_t", type=int, default=50, help="fitting gradients per cycle")
    p.add_argument("--L-c", dest="L_c", type=int, default=80, help="evaluation gradients per cycle")
    p.add_argument("--warmup", type=int, default=50, help="first iterations skipped")
    p.add_argument("--iterations", type=int, default=400, help="recorded: cycles of L_t + L_c after warmup")
    p.add_argument("--samples", choices=["exact", "qsgd"], default="exact",
                   help="GradiVeQ's fitting samples: exact, or through one 4-bit QSGD encode (paper)")
    p.add_argument("--batch", type=int, default=128, help="batch (stands for N=4 ranks x 32)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--min-compression-rate", type=float, default=2.0)
    p.add_argument("--tolerance", type=float, default=0.03, help="relative byte gap counted as matched")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def run_peers(args: argparse.Namespace):
    """Record the gradients and build the table: (the DataFrame, the model's number of values)."""
    from gvq.analysis.peers import peers_table
    from gvq.analysis.record import record_gradients
    grads, net = record_gradients(args.model, args.dataset, args.iterations, batch_size=args.batch,
                                  lr=args.lr, seed=args.seed)
    shapes = [p.shape for p in net.parameters()]
    pools = [v == "on" for v in dict.fromkeys(args.pool)]
    df = peers_table(grads, shapes, args.rank, args.K, args.match, pools, args.warmup, args.L_t,
                     args.L_c, args.samples, args.min_compression_rate, args.tolerance, args.seed)
    return df, sum(s.numel() for s in shapes)


def report_peers(args: argparse.Namespace, df, numel: int) -> None:
    """Write ``peers.csv`` under ``--out``; print a header, the table's PRINTED columns and every GradiVeQ
    row whose bytes could not be matched."""
    from gvq.analysis.peers import PRINTED
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "peers.csv", index=False)
    print(f"# {args.model} on {args.dataset}, batch {args.batch}, {numel} values; "
          f"{args.iterations} iterations, warmup {args.warmup}, then cycles of L_t={args.L_t} fitting / "
          f"<= L_c={args.L_c} evaluation gradients ({int(df['n_eval'].iloc[0])} evaluated); "
          f"bytes = payload per iteration")
    print(df[PRINTED].to_markdown(index=False, floatfmt=".4g"))
    bad = df[df["matched"].eq(False)]  # not None: QSGD rows have no match to make
    for _, row in bad.iterrows():
        print(f"NOT MATCHED  r={row['r']} {row['method']}: {row['bytes']} bytes, "
              f"{row['vs_powersgd_%']:+.1f}% vs PowerSGD's (outside GradiVeQ's reachable range, or "
              f"no d step closer)")
    print(f"-> {out}/peers.csv")


def peers(argv) -> int:
    args = parse_peers_args(argv)
    df, numel = run_peers(args)
    report_peers(args, df, numel)
    return 0


def dither(argv) -> int:
    from gvq.analysis.dither import main as dither_main
    return dither_main(argv)


def frontier(argv) -> int:
    from gvq.analysis.frontier import main as frontier_main
    return frontier_main(argv)


def gradiveq_trace(argv) -> int:
    from gvq.analysis.gradiveq_trace import main as trace_main
    return trace_main(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"quantizers": quantizers, "correlation": correlation, "peers": peers, "dither": dither,
                "frontier": frontier, "gradiveq_trace": gradiveq_trace}
    if not argv or argv[0] not in commands:
        print(f"usage: python -m gvq.analysis {{{','.join(commands)}}} [--help]", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
