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

import sys
from pathlib import Path

from gvq.analysis.keys import CorrelationKeys, DitherKeys, FrontierKeys, PeersKeys, QuantizersKeys, TraceKeys, out
from gvq.schema.tool import Command, choose, exit_status, namespace


def analysis_quantizers(cfg, paths) -> int:
    args = namespace(cfg, paths)
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




def analysis_peers(cfg, paths) -> int:
    args = namespace(cfg, paths)
    choose("match", args.match, ("lambda", "target_ratio"))
    choose("samples", args.samples, ("exact", "qsgd"))
    df, numel = run_peers(args)
    report_peers(args, df, numel)
    return 0


def run_peers(args):
    """Record the gradients and build the table: (the DataFrame, the model's number of values)."""
    from gvq.analysis.peers import peers_table
    from gvq.analysis.record import record_gradients
    grads, net = record_gradients(args.model, args.dataset, args.iterations, batch_size=args.batch,
                                  lr=args.lr, seed=args.seed)
    shapes = [p.shape for p in net.parameters()]
    pools = list(dict.fromkeys(args.pool))
    df = peers_table(grads, shapes, args.rank, args.K, args.match, pools, args.warmup, args.L_t,
                     args.L_c, args.samples, args.min_compression_rate, args.tolerance, args.seed)
    return df, sum(s.numel() for s in shapes)


def report_peers(args, df, numel: int) -> None:
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


COMMANDS = {
    "quantizers": Command(QuantizersKeys, "gvq.analysis.__main__:analysis_quantizers", "quantization error of every "
                          "scalar quantizer on recorded gradients; the ORQ paper's claims",
                          out("runs/analysis/quantizers")),
    "correlation": Command(CorrelationKeys, "gvq.analysis.correlation:analysis_correlation", "GradiVeQ's Fig. 4 "
                           "and Fig. 5 on recorded gradients", out("runs/correlation")),
    "peers": Command(PeersKeys, "gvq.analysis.__main__:analysis_peers", "GradiVeQ vs PowerSGD compression error "
                     "at equal bytes on recorded gradients", out("runs/analysis/peers")),
    "dither": Command(DitherKeys, "gvq.analysis.dither:analysis_dither", "are consecutive dither draws "
                      "independent? (exit 1 where not)", out(None, "also write the table as CSV here")),
    "frontier": Command(FrontierKeys, "gvq.analysis.frontier:analysis_frontier", "error against codec time at "
                        "equal bytes: GradiVeQ over K, PowerSGD over rank", out("runs/analysis/frontier")),
    "gradiveq_trace": Command(TraceKeys, "gvq.analysis.gradiveq_trace:analysis_gradiveq_trace", "GradiVeQ's "
                              "error per layer and compressed iteration against a float64 reference",
                              out("runs/analysis/gradiveq_trace")),
}


def main(argv=None) -> int:
    """``python -m gvq.analysis <command> [KEY=VALUE ...] [--out DIR]``; its exit status."""
    return exit_status("python -m gvq.analysis", COMMANDS, argv, errors=(ValueError,))


if __name__ == "__main__":
    sys.exit(main())
