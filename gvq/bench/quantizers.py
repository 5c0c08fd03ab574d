"""Quantizer throughput: ``python -m gvq.bench quantizers [aggregators=[qsgd,orq]]``.

Single-thread quantize / dequantize throughput of a compressor on a gradient-sized vector.

``quantizer_throughput(QSGD(bits=4))`` -> GB/s of fp32 input consumed (quantize) and produced
(dequantize), median over ``reps`` timed calls after one untimed warm-up call (which builds lookup tables,
scratch buffers and the dither lanes, one-off costs a training run pays once).  One intra-op thread, as
each rank of a run gets one; the previous thread count is restored.  The input is Laplacian
(scale 1e-3, fixed seed): gradients are heavy-tailed, and BinGrad-b's Lloyd rounds depend on the shape.
"""
from __future__ import annotations

import statistics
import time

import torch

from gvq.bench import Progress
from gvq.bench.common import make_aggregator, median_seconds, one_thread
from gvq.bench.keys import RESNET32_PARAMS
from gvq.compressors.base import Compressor
from gvq.run.logs import write_json_atomic



def laplace_vector(numel: int, seed: int = 0, scale: float = 1e-3) -> torch.Tensor:
    """Laplacian test data from a seeded generator (inverse CDF of a uniform draw)."""
    u = torch.rand(numel, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) - 0.5
    return (-scale * torch.sign(u) * torch.log1p(-2 * u.abs())).float()


def alternated_ms(a: Compressor, b: Compressor, numel: int = RESNET32_PARAMS,
                  reps: int = 20) -> tuple[float, float]:
    """Median compress ms of two variants of a quantizer (the histogram fit vs the sorted one), calls
    alternated so a noisy spell on the host hits both alike (the ratio is the figure)."""
    with one_thread():
        x, seg = laplace_vector(numel), slice(0, numel)
        times: dict[int, list[float]] = {0: [], 1: []}
        for rep in range(2 * reps + 4):
            comp = (a, b)[rep % 2]
            t0 = time.perf_counter()
            comp.compress(x, seg)
            if rep >= 4:                                  # the first two each: buffers, lanes
                times[rep % 2].append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times[0]), 1e3 * statistics.median(times[1])


def quantizer_throughput(compressor: Compressor, numel: int = RESNET32_PARAMS, reps: int = 20) -> dict:
    """dict(quantize_gbps, dequantize_gbps, quantize_ms, dequantize_ms, bytes, ratio, ideal_ratio)."""
    with one_thread():
        x, seg = laplace_vector(numel), slice(0, numel)
        payload = compressor.compress(x, seg)
        t_q = median_seconds(lambda: compressor.compress(x, seg), reps)
        t_d = median_seconds(lambda: compressor.decompress(payload, seg), reps)
    nbytes = 4 * numel
    return {"name": compressor.name,
            "quantize_gbps": nbytes / t_q / 1e9, "dequantize_gbps": nbytes / t_d / 1e9,
            "quantize_ms": 1e3 * t_q, "dequantize_ms": 1e3 * t_d,
            "bytes": compressor.payload_nbytes(seg), "ratio": compressor.ratio(numel),
            "ideal_ratio": compressor.ideal_ratio}


#: the quantizers with a ``fit`` knob (``histogram``, sort-free, or ``sorted``, the exact reference)
FITTED = ("linear", "orq", "bingrad_pb", "bingrad_b")


def bench_quantizers(cfg, paths) -> list[dict]:
    """``python -m gvq.bench quantizers``: quantize / dequantize GB/s of every scalar quantizer, one
    thread, on a ResNet-32-sized gradient, with achieved and ideal compression ratios."""
    from gvq.schema.tool import namespace
    args = namespace(cfg, paths)
    rows, shown = [], Progress("quantizers", len(args.aggregators))
    for name in args.aggregators:
        comp = make_aggregator(name, args.set).compressor
        row = {"aggregator": name, **quantizer_throughput(comp, numel=args.numel, reps=args.reps)}
        if name in FITTED and comp.fit == "histogram":  # the sort-free fit against the sorted reference
            ref = make_aggregator(name, [*args.set, "aggregator.compressor.fit=sorted"]).compressor
            hist_ms, sorted_ms = alternated_ms(comp, ref, numel=args.numel, reps=args.reps)
            row.update(quantize_ms_hist_alt=hist_ms, quantize_ms_sorted=sorted_ms,
                       sorted_over_histogram=sorted_ms / hist_ms)
        rows.append(row)
        shown.done(name)
    import pandas as pd
    print(f"\n# quantizer throughput, {args.numel:,} fp32 values, 1 thread, median of {args.reps}; "
          "fitted ones also against fit=sorted, alternated call by call (quantize_ms_hist_alt, "
          "quantize_ms_sorted, sorted_over_histogram: the sort-free fit's gain)")
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4g"))
    if args.out:
        write_json_atomic(args.out, rows)
    return rows
