"""Top-k's selection against its floors: ``python -m gvq.bench topk [models=[resnet32,gpt_tiny]]
[num_classes=[100,256]] [ratios=[0.01,0.001]] [reps=30]``, one intra-op thread.

On each model's gradient (one backward of a synthetic batch: real magnitudes, real layer sizes; ResNet-32
at 100 classes, gpt_tiny at 256 tokens) and each ratio r, the selection of the
k = max(1, floor(r * n)) largest |v| of the whole vector by four floors, each from |v| to the kept
positions:

* ``torch.topk``: ``torch.topk(|v|, k, sorted=False)`` (GRACE's top-k);
* ``sort``: a full descending sort of |v|, its first k;
* ``kthvalue``: the (n - k + 1)-th smallest |v| by ``torch.kthvalue``, then the positions at or above it
  (a mask and ``nonzero``: ties may keep a few more than k);
* ``sampled``: DGC's threshold (synxlin's): a strided 1% sample (random start), its top ceil(r * samples)
  gives the threshold, lowered x0.8 while fewer than k pass, then the exact top-k among the candidates --
  exactly top-k's set, since every value above the threshold is a candidate;

and gvq's topk codec (``gvq.compressors.topk``, its whole ``compress``: selection, the values' gather and
the packed payload) at each scope: ``tensor`` (per parameter, told the layout by ``Compressor.grouped``,
as the aggregator tells it), ``bucket`` (its option's default) and ``global``.  The floors select over the whole
vector; the codec at scope tensor or bucket selects per scope (k summed over scopes, a few more values).

Every repetition times each method once, the order rotated each repetition, so a noisy spell on the host
hits all of them alike; a method's figure is its median per-repetition ratio to the best floor (the floor
with the lowest median time), paired by repetition, with its bootstrap interval
(:func:`gvq.report.intervals.median_interval`).  ``within_2x``: the interval's top (its median where there
is none) at or below 2, the target for a codec against its floor.
"""
from __future__ import annotations

import math
import time
from typing import Callable

import torch

from gvq.bench import BenchError, Progress
from gvq.bench.common import build_model, collections_untimed, make_aggregator, model_workload, one_thread
from gvq.bench.common import print_markdown
from gvq.report.intervals import median_interval
from gvq.run.logs import write_json_atomic

SCOPES = ("tensor", "bucket", "global")
TARGET = 2.0            # the bound a codec is held to: within 2x its floor


def model_gradient(model: str, num_classes: int, batch: int = 8) -> tuple[torch.Tensor, list[tuple[int, ...]]]:
    """One backward of a synthetic batch through ``conf/model/<model>.yaml`` (seeded): the flat gradient,
    in parameter order (an unused parameter's block zero), and the parameters' shapes."""
    work = model_workload(model, num_classes)
    net = build_model(model, num_classes, work.in_channels)
    x, y = work.synthetic_batch(batch, torch.Generator().manual_seed(0))
    work.loss(net(x), y).backward()
    params = list(net.parameters())
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    return flat.detach(), [tuple(p.shape) for p in params]


def by_topk(v: torch.Tensor, k: int) -> torch.Tensor:
    return torch.topk(v.abs(), k, sorted=False).indices


def by_sort(v: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sort(v.abs(), descending=True).indices[:k]


def by_kthvalue(v: torch.Tensor, k: int) -> torch.Tensor:
    a = v.abs()
    return torch.nonzero(a >= torch.kthvalue(a, a.numel() - k + 1).values).squeeze(1)


def by_sampled(v: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """DGC's sampled threshold with exact re-selection (synxlin's ``_sparsify``): host reads allowed, it is
    a floor on the CPU, not a device path."""
    a, n = v.abs(), v.numel()
    stride = max(1, n // max(1, math.ceil(0.01 * n)))
    start = int(torch.randint(stride, (1,), generator=gen))
    sample = a[start::stride]
    thr = torch.topk(sample, min(sample.numel(), math.ceil(sample.numel() * k / n)), sorted=False).values.min()
    cand = torch.nonzero(a >= thr).squeeze(1)
    while cand.numel() < k:             # too few above it: lower the threshold (DGC's x0.8)
        thr = thr * 0.8
        cand = torch.nonzero(a >= thr).squeeze(1)
    return cand[torch.topk(a[cand], k, sorted=False).indices]


def timed_calls(v: torch.Tensor, shapes, ratio: float) -> dict[str, tuple[str, Callable]]:
    """label -> (kind: floor | codec, one call): the floors and the codec at each scope."""
    k, gen = max(1, math.floor(ratio * v.numel())), torch.Generator().manual_seed(0)
    out = {"torch.topk": ("floor", lambda: by_topk(v, k)), "sort": ("floor", lambda: by_sort(v, k)),
           "kthvalue": ("floor", lambda: by_kthvalue(v, k)), "sampled": ("floor", lambda: by_sampled(v, k, gen))}
    seg = slice(0, v.numel())
    for scope in SCOPES:
        comp = make_aggregator("topk", [f"aggregator.compressor.ratio={ratio}",
                                        f"aggregator.compressor.scope={scope}"]).compressor.grouped(shapes)
        out[f"codec scope={scope}"] = ("codec", lambda comp=comp: comp.compress(v, seg))
    return out


def payload_bytes(v: torch.Tensor, shapes, ratio: float) -> dict[str, int]:
    """The codec's payload bytes at each scope (what its all-gather forwards N - 1 times)."""
    seg = slice(0, v.numel())
    return {f"codec scope={scope}": make_aggregator("topk", [f"aggregator.compressor.ratio={ratio}",
                                                             f"aggregator.compressor.scope={scope}"]
                                                    ).compressor.grouped(shapes).payload_spec(seg)[1]
            for scope in SCOPES}


def with_breakeven(rows: list[dict], payloads: dict[str, int], world_sizes: list[int]) -> list[dict]:
    """The codec rows gain their payload bytes and a ``gbps_at_N`` column per world size."""
    for row in rows:
        if row["method"] in payloads:
            row["payload_bytes"] = payloads[row["method"]]
            for n in world_sizes:
                row[f"gbps_at_{n}"] = breakeven_gbps(row["numel"], row["payload_bytes"], row["ms"] / 1e3, n)
    return rows


def paired_seconds(calls: dict, reps: int, warmup: int = 1) -> dict[str, list[float]]:
    """Each call timed once per repetition, the order rotated by one each repetition, garbage collected
    between calls, never inside one; ``warmup`` untimed rounds first (plans, buffers)."""
    names, times = list(calls), {name: [] for name in calls}
    with collections_untimed() as collect:
        for rep in range(warmup + reps):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                t0 = time.perf_counter()
                calls[name]()
                took = time.perf_counter() - t0
                collect()
                if rep >= warmup:
                    times[name].append(took)
    return times


def breakeven_gbps(numel: int, payload: int, seconds: float, world_size: int) -> float:
    """Gbit/s at which ``seconds`` of selection equals the wire time an all-gather of ``payload`` bytes saves
    against rar's fp32 ring at ``world_size`` (the module docstring); 0 where it saves none."""
    saved = 2 * (world_size - 1) / world_size * 4 * numel - (world_size - 1) * payload
    return max(0.0, 8 * saved / seconds / 1e9)


def cell_rows(model: str, numel: int, ratio: float, kinds: dict, times: dict) -> list[dict]:
    """One row per method: its median ms and its paired ratio to the best floor, with intervals."""
    floors = [m for m, kind in kinds.items() if kind == "floor"]
    best = min(floors, key=lambda m: median_interval(times[m]).median)
    rows = []
    for name, kind in kinds.items():
        ms = median_interval([1e3 * t for t in times[name]])
        x = median_interval([a / b for a, b in zip(times[name], times[best])])
        top = x.hi if x.hi is not None else x.median
        rows.append({"model": model, "numel": numel, "ratio": ratio, "k": max(1, math.floor(ratio * numel)),
                     "method": name, "kind": kind, "best_floor": best, "ms": ms.median, "ms_lo": ms.lo,
                     "ms_hi": ms.hi, "x_best_floor": x.median, "x_lo": x.lo, "x_hi": x.hi,
                     "within_2x": bool(top <= TARGET), "reps": len(times[name])})
    return rows


def bench_topk(cfg, paths) -> list[dict]:
    """``python -m gvq.bench topk``: per model and ratio, each floor and each scope of the codec, timed
    paired; the records (one per method and cell) go to ``--out`` as JSON."""
    from gvq.schema.tool import namespace
    args = namespace(cfg, paths)
    if len(args.models) != len(args.num_classes) or args.reps < 2 or not args.ratios or \
            any(n < 2 for n in args.world_sizes):
        raise BenchError("topk: one num_classes per model (models and num_classes pair up), reps >= 2, "
                         "at least one ratio, world_sizes >= 2")
    rows, shown = [], Progress("topk", len(args.models) * len(args.ratios))
    with one_thread(), torch.no_grad():
        for model, classes in zip(args.models, args.num_classes):
            with torch.enable_grad():
                v, shapes = model_gradient(model, classes)
            for ratio in args.ratios:
                calls = timed_calls(v, shapes, ratio)
                times = paired_seconds({m: call for m, (_, call) in calls.items()}, args.reps)
                cell = cell_rows(model, v.numel(), ratio, {m: kind for m, (kind, _) in calls.items()}, times)
                rows += with_breakeven(cell, payload_bytes(v, shapes, ratio), args.world_sizes)
                shown.done(f"{model} r={ratio:g}")
    print_markdown(rows, ["model", "numel", "ratio", "k", "method", "ms", "x_best_floor", "x_lo", "x_hi",
                          "within_2x"] + [f"gbps_at_{n}" for n in args.world_sizes],
                   f"top-k selection against its floors, 1 thread, {args.reps} paired repetitions (order rotated); "
                   "x_best_floor: median per-repetition ratio to the fastest floor, [x_lo, x_hi] its 95% bootstrap "
                   "interval")
    if args.out:
        write_json_atomic(args.out, {"rows": rows, "reps": args.reps, "threads": 1}, indent=1)
    return rows
