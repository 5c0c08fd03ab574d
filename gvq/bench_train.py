"""Iteration-time benchmark: our runner's ``rar`` against torch ``DistributedDataParallel`` (gloo) on the
same model, batch and ranks: ``python -m gvq.bench train --world-size 2 4``.

Each mode runs ``--warmup`` + ``--iters`` full iterations (forward, backward, gradient averaging, SGD
step) on fixed random batches; an iteration's time is the max over ranks.  Loopback only: DDP's
collectives cannot be slowed by the in-process link emulator.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from .aggregate import RingAllReduce, RunContext


def _build(model: str, classes: int, channels: int):
    from hydra.utils import instantiate
    from .bench import compose
    torch.manual_seed(0)
    return instantiate(compose([f"model={model}"]).model, num_classes=classes, in_channels=channels)


def _iterate(net, opt, x, y, agg):
    t0 = time.perf_counter()
    loss = F.cross_entropy(net(x), y)
    opt.zero_grad(set_to_none=False)
    loss.backward()
    if agg is not None:
        agg.aggregate(0)
    opt.step()
    return time.perf_counter() - t0


def _mode(mode, rank, world, args):
    shape = (1, 8, 8) if args.model == "cnn" else (3, 32, 32)
    net = _build(args.model, args.num_classes, shape[0])
    agg = None
    if mode == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(net)
    else:
        agg = RingAllReduce()
        agg.setup(list(net.parameters()), RunContext(rank, world))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch_size, *shape, generator=g)
    y = torch.randint(0, args.num_classes, (args.batch_size,), generator=g)
    times = []
    for i in range(args.warmup + args.iters):
        dist.barrier()
        t = torch.tensor([_iterate(net, opt, x, y, agg)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if i >= args.warmup:
            times.append(float(t))
    return statistics.median(times)


def _rank(rank, world, args, init, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        # interleave the modes so both see the same machine load
        res = {"rar": [], "ddp": []}
        for _ in range(args.rounds):
            for mode in res:
                res[mode].append(_mode(mode, rank, world, args))
        if rank == 0:
            Path(out).write_text(json.dumps({m: statistics.median(v) for m, v in res.items()}))
    finally:
        dist.destroy_process_group()


def main(argv) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m gvq.bench train", description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, nargs="+", default=[2, 4])
    p.add_argument("--model", default="cnn")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rows = []
    for world in args.world_size:
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_rank, args=(world, args, f"file://{tmp}/rendezvous", f"{tmp}/o.json"), nprocs=world)
            r = json.loads(Path(f"{tmp}/o.json").read_text())
        rows.append({"model": args.model, "batch_per_rank": args.batch_size, "world_size": world,
                     "rar_iter_s": r["rar"], "ddp_iter_s": r["ddp"], "rar_over_ddp": r["rar"] / r["ddp"]})
    import pandas as pd
    print("\n# iteration time, runner rar vs torch DDP (gloo), loopback, 1 thread/rank")
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4g"))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return rows
