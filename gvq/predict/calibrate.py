"""``python -m gvq.predict calibrate``: measure, on this machine, what the cost model needs; one JSON.

* **Compute**: forward + backward + SGD step of the model at the batch size (one thread, CPU time,
  median of ``reps``): the virtual clock's compute phase before its scale.
* **Codecs**: every compress / decompress / payload add each aggregator's ring makes, timed call by call
  (CPU time of one thread, one process, quiet) on the real compressor and the real pieces of its
  segments at several N, then ``seconds = fixed + per_value * values`` by least squares (values: the
  piece's gradient values; payload elements for the add).  GradiVeQ is fitted first (L_t random samples,
  as ``gvq.bench``), tracking its Eq. 7 loss as the compressed phase does.
* **Vector ops** at scale 1 (the uncompressed ring's add, the division by N) and **messages**: the CPU a
  rank spends posting one send or receive, from a 2-rank virtual-time ring of a tiny vector (what the
  virtual clock counts: everything but the blocked waits).
* **Structure** (``structure.json`` beside it): for each aggregator and N, its ring's rounds, kind and
  per-piece values and payload bytes, from the ring code's own segment functions.

No figure here is fitted to a comparison outcome: each is one operation's cost on this host.
"""
from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from gvq.predict.structure import (
    AGGREGATORS,
    SETTINGS,
    build_on_one_rank,
    rounds,
    structure_ns,
)

VEC_SIZES = (4096, 65536, 470000)


def _cpu_seconds(fn) -> float:
    t0 = time.thread_time()
    fn()
    return time.thread_time() - t0


def linear(points: list[tuple[float, float]]) -> list[float]:
    """[fixed, per_value] of ``seconds = fixed + per_value * values`` (least squares, both >= 0)."""
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    if len(set(x)) < 2:
        return [0.0, float(y.mean() / max(x.mean(), 1))]
    per, fixed = np.polyfit(x, y, 1)
    if fixed < 0:
        return [0.0, float((x * y).sum() / (x * x).sum())]
    return [float(fixed), float(max(per, 0.0))]


def vector_ops(reps: int = 20) -> dict:
    """The uncompressed ring's ``flat[inc] += buf``, the final ``div_`` and the runner's non-finite check
    of the gradient: [fixed, per value] each."""
    add, div, finite = [], [], []
    for n in VEC_SIZES:
        a, b = torch.randn(n), torch.randn(n)
        for _ in range(reps):
            add.append((n, _cpu_seconds(lambda: a.__iadd__(b))))
            div.append((n, _cpu_seconds(lambda: a.div_(4))))
            finite.append((n, _cpu_seconds(lambda: bool(torch.isfinite(a).all()))))
    return {"add": linear(add), "div": linear(div), "finite": linear(finite)}


def compute(model: str, batch: int, num_classes: int, reps: int = 8) -> float:
    """Median CPU seconds of one forward + backward + SGD step (what the compute phase times)."""
    from gvq.bench.common import build_model
    shape = (1, 8, 8) if model == "cnn" else (3, 32, 32)
    net = build_model(model, num_classes, shape[0])
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, *shape), torch.randint(0, num_classes, (batch,))

    def step():
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
    step()
    return statistics.median(_cpu_seconds(step) for _ in range(reps))


def codec_costs(name: str, agg, numel: int, reps: int = 3) -> dict:
    """Per codec of the aggregator's rounds: [fixed, per value] of compress, decompress and add, from
    every piece of its segments at N = 2, 8 and 32 run as a one-rank ring (compress all, then decompress
    all: the order the ring calls them in); one untimed pass first (plans and layouts are cached per
    segment, as in a steady-state run), then the median of ``reps`` per piece."""
    points: dict[str, dict[str, list]] = {}
    flat = torch.randn(numel)
    for n in (2, 8, 32):
        for rnd in rounds(name, agg, numel, n):
            if rnd["kind"] == "plain":
                continue
            pieces = [q for seg in rnd["segs"] for q in seg]
            runs = [_one_rank_ring(rnd["codec"], flat, pieces, agg) for _ in range(reps + 1)][1:]
            got = points.setdefault(rnd["key"], {"compress": [], "decompress": [], "add": []})
            for op in got:
                for k in range(len(runs[0][op])):
                    size = runs[0][op][k][0]
                    got[op].append((size, statistics.median(r[op][k][1] for r in runs)))
    return {k: {op: linear(v) for op, v in ops.items()} for k, ops in points.items()}


def _one_rank_ring(comp, flat, pieces, agg) -> dict[str, list]:
    """One rank's codec calls of a ring at N = 1: (values, seconds) per call, per operation."""
    got: dict[str, list] = {"compress": [], "decompress": [], "add": []}
    if hasattr(agg, "lr"):
        agg.lr.begin()                          # PowerSGD: a fresh iteration's P / Q state
    track = getattr(comp, "track", None)
    if track is not None:
        track(flat)                             # GradiVeQ's compressed phase tracks its Eq. 7 loss
    try:
        payloads = []
        for q in pieces:
            t0 = time.thread_time()
            payloads.append(comp.compress(flat[q], q))
            got["compress"].append((q.stop - q.start, time.thread_time() - t0))
            other = payloads[-1].clone()
            got["add"].append((other.numel(), _cpu_seconds(lambda: other.add_(payloads[-1]))))
        for q, pl in zip(pieces, payloads):
            got["decompress"].append((q.stop - q.start, _cpu_seconds(lambda: comp.decompress(pl, q))))
    finally:
        if track is not None:
            track(None)
    return got


def message_cost(reps: int = 200) -> float:
    """CPU seconds the virtual clock counts per posted send or receive (2-rank ring of 64 values)."""
    from gvq.bench.common import spawn_loopback
    return spawn_loopback(_message_rank, 2, reps)["msg_s"]


def _message_rank(rank: int, reps: int, init: str, out: str) -> None:
    import torch.distributed as dist

    from gvq.aggregators.base import equal_segments
    from gvq.comm import clock, ring
    from gvq.comm.p2p import P2P
    torch.set_num_threads(1)
    clock.configure("virtual")
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        p2p, x, segs = P2P(rank, 2, 60.0, 1e15), torch.zeros(64), equal_segments(64, 2)
        ring.allreduce_(x, segs, p2p)
        t0 = clock.sync()
        for _ in range(reps):
            ring.allreduce_(x, segs, p2p)
        per_call = (clock.sync() - t0) / reps
        if rank == 0:                           # 2 steps x (1 receive + 1 send) posted per call
            Path(out).write_text(json.dumps({"msg_s": per_call / 4}))
    finally:
        dist.destroy_process_group()


def calibrate(model: str, batch: int, num_classes: int, out: Path) -> dict:
    """Measure everything; write ``calibration.json`` and ``structure.json`` under ``out``."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cal = {"host": platform.processor() or platform.machine(), "torch": torch.__version__, "model": model,
           "batch_size": batch, "num_classes": num_classes, "settings": SETTINGS,
           "compute_s": compute(model, batch, num_classes), "vector": vector_ops(), "msg_s": message_cost(),
           "codecs": {}}
    struct = {"model": model, "aggregators": {}}
    for name in AGGREGATORS:
        agg, numel = build_on_one_rank(name, model, num_classes)
        cal["codecs"].update(codec_costs(name, agg, numel))
        struct["numel"] = numel
        struct["aggregators"][name] = {str(n): [{k: v for k, v in r.items() if k not in ("codec", "segs")}
                                                for r in rounds(name, agg, numel, n)] for n in structure_ns()}
        print(f"gvq.predict calibrate: {name} measured", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(cal, indent=1))
    (out / "structure.json").write_text(json.dumps(struct))
    return cal


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="python -m gvq.predict calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet32")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-classes", type=int, default=100)
    p.add_argument("--out", type=Path, default=None, help="default: runs/predict/<model>")
    args = p.parse_args(argv)
    args.out = args.out or Path("runs/predict") / args.model
    cal = calibrate(args.model, args.batch_size, args.num_classes, args.out)
    print(f"gvq.predict calibrate: compute {cal['compute_s'] * 1e3:.1f} ms / iteration, message "
          f"{cal['msg_s'] * 1e6:.1f} us -> {args.out}/calibration.json, structure.json")
    return cal
