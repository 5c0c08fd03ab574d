"""Analyses of real gradients: ``python -m gvq.analyze quantizers|correlation [--out DIR] ...``.

* ``quantizers``: quantization error ||Q(G)-G||^2/||G||^2 of every scalar quantizer at s = 3, 5, 9 and
  binary on gradients recorded from a short digits run; checks the ORQ paper's claims (CSV + PNG).
* ``correlation``: GradiVeQ's Fig. 4 (adjacent gradients lie near a plane) and Fig. 5 (compression loss
  against slice size, reusing the first slice's compressor) (PNG + CSV).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def quantizers(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m gvq.analyze quantizers")
    p.add_argument("--out", default="runs/analysis/quantizers")
    p.add_argument("--model", default="cnn")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--every", type=int, default=10, help="keep every n-th gradient")
    p.add_argument("--bucket", type=int, default=2048)
    args = p.parse_args(argv)
    from .analysis.quantizers import check_claims, plot_errors, quantizer_error_table
    from .analysis.record import record_gradients
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
    from .analysis.correlation import main as corr_main
    return corr_main(argv) or 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"quantizers": quantizers, "correlation": correlation}
    if not argv or argv[0] not in commands:
        print(f"usage: python -m gvq.analyze {{{','.join(commands)}}} [--help]", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
