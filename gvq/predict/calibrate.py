"""``python -m gvq.predict calibrate``: measure, on this machine, what the cost model needs; one JSON.

See docs/design.md#gvqpredictcalibratepy for how it works and why.
"""
from __future__ import annotations

import json
import math
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from gvq.predict.cost_model import PredictError
from gvq.predict.curves import cpu_seconds, linear
from gvq.predict.messages import message_cost
from gvq.predict.structure import (
    AGGREGATORS,
    CALIBRATION_VERSION,
    SETTINGS,
    build_on_one_rank,
    entries,
    rounds,
    stored,
    structure_ns,
)

VEC_SIZES = (4096, 65536, 470000)


def vector_ops(reps: int = 20) -> dict:
    """The uncompressed ring's ``flat[inc] += buf``, the final ``div_`` and the runner's non-finite check
    of the gradient (one sum: :func:`gvq.run.guards.nonfinite`'s fast path): [fixed, per value] each."""
    add, div, finite = [], [], []
    for n in VEC_SIZES:
        a, b = torch.randn(n), torch.randn(n)
        for _ in range(reps):
            add.append((n, cpu_seconds(lambda: a.__iadd__(b))))
            div.append((n, cpu_seconds(lambda: a.div_(4))))
            finite.append((n, cpu_seconds(lambda: math.isfinite(float(a.sum())))))
    return {"add": linear(add), "div": linear(div), "finite": linear(finite)}


COMPUTE_REPS = 40    # enough samples for the median of the slowest of 16 ranks (the 0.958 quantile)


def compute(model: str, batch: int, num_classes: int, reps: int = COMPUTE_REPS, shape=None) -> list[float]:
    """CPU seconds of one forward + backward + SGD step (what the compute phase times) on inputs of
    ``shape`` (default: the model's default data's), ``reps`` samples sorted: their spread on one quiet
    rank is the spread between ranks of one iteration."""
    from gvq.bench.common import build_model, model_workload
    work = model_workload(model, num_classes, shape)
    net = build_model(model, work.num_classes, work.in_channels)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x, y = work.synthetic_batch(batch)

    def step():
        loss = work.loss(net(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
    step()
    return sorted(cpu_seconds(step) for _ in range(reps))


CAL_NS = (2, 4, 8, 16, 32, 128, 1024)   # world sizes whose pieces are timed (sizes in between interpolate)
PIECES_PER_N = 6                         # pieces sampled per N (evenly over its segments) ...
EXACT_MAX = 96                           # ... unless it has at most this many: then all, each kept


def curve(points: list[tuple[float, float]], width: float = 1.1) -> dict:
    """Seconds as a function of values, piecewise linear through medians of sizes within ``width`` x
    of each other (one point per N, in effect): codec costs are not one line -- a piece that fits in
    cache costs less per value than one that does not -- and the model must be right at every N's
    piece size, not on average.  Binning keeps the noise of two near-equal sizes out of the slopes."""
    pts = sorted((float(x), y) for x, y in points)
    xs, ys, k = [], [], 0
    while k < len(pts):
        group = [p for p in pts[k:] if p[0] <= pts[k][0] * width]
        xs.append(statistics.median(p[0] for p in group))
        ys.append(statistics.median(p[1] for p in group))
        k += len(group)
    return {"values": xs, "seconds": ys}


def codec_costs(name: str, agg, numel: int, reps: int = 3, cold: bool = True) -> dict:
    """Per codec of the aggregator's rounds: a cost curve for each call the ring makes, timed on the
    real compressor and the real pieces of its segments at the world sizes ``CAL_NS``: ``compress``,
    ``add`` (payload into a received one), ``decompress`` (into the gradient) and, for re-encode rings,
    ``hop`` (decode, add the own segment, re-encode).  One untimed pass first (plans and layouts are
    cached per segment, as in a steady-state run), then the median of ``reps`` per piece.  ``cold``:
    the caches are flushed before every timed call, as the ring's waits do (the payload arrives from
    the wire, other ranks and the transport run in between).  Where an N has at most ``EXACT_MAX``
    pieces, every one is timed and kept under ``pieces[N]`` (seg-major order): a piece's cost depends
    on which layers it cuts (a slice count, a K), not only on its size, so at those N the model uses
    each piece's own figure and the curve only in between."""
    points: dict[str, dict[str, list]] = {}
    exact: dict[str, dict[str, dict]] = {}
    flat, evict = torch.randn(numel), Evict(cold)
    for n in CAL_NS:
        for rnd in rounds(name, agg, n):
            if rnd["kind"] == "plain":
                continue
            every = [q for seg in rnd["segs"] for q in seg]
            pieces = every if len(every) <= EXACT_MAX else _sample(every)
            hop = rnd["kind"] == "reencode"
            runs = [one_rank_ring(rnd["codec"], flat, pieces, agg.codec_session, hop, evict)
                    for _ in range(reps + 1)][1:]
            meds = {op: [statistics.median(r[op][k][1] for r in runs) for k in range(len(pieces))] for op in runs[0]}
            got = points.setdefault(rnd["key"], {op: [] for op in runs[0]})
            for op in got:
                got[op].extend((size, meds[op][k]) for k, (size, _) in enumerate(runs[0][op]))
            if pieces is every:
                exact.setdefault(rnd["key"], {})[str(n)] = meds
    return {k: {**{op: curve(v) for op, v in ops.items()}, "pieces": exact.get(k, {})} for k, ops in points.items()}


def _sample(pieces: list) -> list:
    if len(pieces) <= PIECES_PER_N:
        return pieces
    idx = np.linspace(0, len(pieces) - 1, PIECES_PER_N).round().astype(int)
    return [pieces[i] for i in sorted(set(idx))]


class Evict:
    """Touches a buffer twice the last-level cache: what a cache looks like after a wait."""

    def __init__(self, on: bool):
        self.buf = torch.zeros(2 * _llc_bytes() // 4) if on else None

    def __call__(self):
        if self.buf is not None:
            self.buf.add_(1.0)


def _llc_bytes() -> int:
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        txt = f.read_text().strip()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(txt[-1:], 1)
        sizes.append(int(txt.rstrip("KMG")) * mult)
    return max(sizes, default=64 << 20)


def one_rank_ring(comp, flat, pieces, session, hop: bool, evict: Evict) -> dict[str, list]:
    """One rank's codec calls, each the ring's own statement: (values, seconds) per call, per op.
    ``session(flat)``: the context the codec runs in (an aggregator's ``codec_session``)."""
    ops = ("compress", "decompress") + (("hop",) if hop else ("add",))   # payloads add only if additive
    got: dict[str, list] = {op: [] for op in ops}
    # as the aggregator's own rings: PowerSGD starts a P / Q iteration, GradiVeQ tracks its Eq. 7 loss
    with session(flat):
        payloads = [_time_call(got["compress"], q, evict, lambda: comp.compress(flat[q], q)) for q in pieces]
        for q, pl in zip(pieces, payloads):
            inbox = comp.empty_payload(q, flat.device)
            inbox.copy_(pl)                     # what the receive wrote
            if hop:
                # the ring's own hop (ring.reencode_allreduce_'s reduce-scatter step): decode + add + encode,
                # or the codec's fused kernels where it has them, so the price is the path a run takes
                _time_call(got["hop"], q, evict, lambda: comp.reencode_sum(inbox, flat[q], q))
            else:
                _time_call(got["add"], q, evict, lambda: inbox.add_(pl), inbox.numel())
        for q, pl in zip(pieces, payloads):
            _time_call(got["decompress"], q, evict, lambda: flat.__setitem__(q, comp.decompress(pl, q)))
    return got


def _time_call(into: list, q: slice, evict, fn, size: int | None = None):
    evict()
    t0 = time.thread_time()
    out = fn()
    into.append((q.stop - q.start if size is None else size, time.thread_time() - t0))
    return out


def measure_cost(agg, numel: int, reps: int = 5) -> float:
    """Median CPU seconds of the aggregator's per-iteration measurements (e.g. the compression error:
    a whole-gradient compress + decompress before the ring; PowerSGD's: a norm before, its payloads'
    after), which every rank runs untimed as aggregation but inside the iteration (``agg`` is in its
    benchmark state: ``prepare_benchmark`` pinned the compressed phase)."""
    bucket = agg.bucket_of(torch.randn(numel) * 1e-2, agg.everything, 0)

    def run():
        agg.measure(bucket)
        agg.measure_after(bucket)
    run()
    return statistics.median(cpu_seconds(run) for _ in range(reps))


def calibrate(model: str, batch: int, num_classes: int, out: Path, cold: bool = True,
              aggregators=AGGREGATORS, shape=None) -> dict:
    """Measure everything for each of ``aggregators`` (options, or settings ``OPTION:KEY=VALUE[,...]``,
    each with the calibration grid's ``set`` applied and keyed by the name of what it runs:
    :func:`gvq.predict.structure.entries`, ``powersgd rank=6``) on inputs of ``shape`` (default: the
    model's default data's); write ``calibration.json`` and ``structure.json`` under ``out``."""
    from gvq.bench.common import model_workload
    work = model_workload(model, num_classes, shape)
    named, shape = entries(aggregators), list(work.sample_shape)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cal = {"version": CALIBRATION_VERSION, "host": platform.processor() or platform.machine(),
           "torch": torch.__version__, "model": model,
           "batch_size": batch, "num_classes": num_classes, "settings": SETTINGS, "entries": named,
           "input_shape": shape, "compute_samples": compute(model, batch, num_classes, shape=shape),
           "vector": vector_ops(), "msg": message_cost(),
           "cache": "cold" if cold else "warm", "codecs": {}, "measure": {}}
    cal["compute_s"] = statistics.median(cal["compute_samples"])
    struct = {"model": model, "aggregators": {}, "passes": {}}
    for name, entry in named.items():
        agg, numel = build_on_one_rank(entry, model, num_classes, in_channels=work.in_channels)
        cal["codecs"].update(codec_costs(name, agg, numel, cold=cold))
        cal["measure"][name] = measure_cost(agg, numel)
        struct["numel"] = numel
        struct["aggregators"][name] = {str(n): stored(rounds(name, agg, n)) for n in structure_ns()}
        struct["passes"][name] = agg.extra_passes()           # beside the rings (the cost model adds them)
        print(f"gvq.predict calibrate: {name} measured", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(cal, indent=1))
    (out / "structure.json").write_text(json.dumps(struct))
    return cal


def predict_calibrate(cfg, paths) -> dict:
    """``python -m gvq.predict calibrate``: :func:`calibrate` on the keys' model and settings."""
    from gvq.schema.tool import namespace
    args = namespace(cfg, paths)
    try:
        entries(args.aggregators)
    except ValueError as e:
        raise PredictError(f"aggregators: {e}") from None
    if args.input_shape is not None and len(args.input_shape) != 3:
        raise PredictError(f"input_shape={args.input_shape}: expected [C,H,W]")
    args.out = args.out or Path("runs/predict") / args.model
    cal = calibrate(args.model, args.batch_size, args.num_classes, args.out, args.cache == "cold",
                    args.aggregators, args.input_shape)
    print(f"gvq.predict calibrate: compute {cal['compute_s'] * 1e3:.1f} ms / iteration, message "
          f"{cal['msg'][0] * 1e6:.1f} us + {cal['msg'][1] * 1e9:.2f} ns/byte -> {args.out}/calibration.json, "
          "structure.json")
    return cal
