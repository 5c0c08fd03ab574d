"""Train a small CNN on 2 gloo ranks under torchrun with torch DDP, syncing less often: a gvq method (local SGD, DiLoCo)
around the optimizer step, what it sends averaged by a gvq aggregator (plain torch, no Hydra):

    torchrun --standalone --nproc-per-node 2 examples/method_hook.py local_sgd method.every=4   # averaged every 4 steps
    torchrun --standalone --nproc-per-node 2 examples/method_hook.py --torch-averager 4   # torch's own
    torchrun --standalone --nproc-per-node 2 examples/method_hook.py diloco method.every=5 --save ckpt --save-at 12
    torchrun --standalone --nproc-per-node 2 examples/method_hook.py diloco method.every=5 --resume ckpt

Any conf/method option with its keys (``method.every=30``, ``method.outer_lr=0.7``) and ``--aggregator`` any
ring option with its keys (``--aggregator qsgd compressor.bits=4``).  Between syncs the forward and
backward run in ``sync.no_sync()`` (DDP's ``no_sync``: no gradient is communicated); ``sync.after_step()``
after ``opt.step()`` averages at a sync.  The second line is torch's own local SGD on the same batches (the
first equals it).  The third line trains its 30 steps saving every rank's own checkpoint after step
11, mid-period (model, optimizer and the method's state: between syncs each rank's differ); the fourth
resumes from it, and ends where the third ended.  Prints the mean loss over ranks each iteration, then the syncs, the
bytes rank 0 sent and its parameters' checksum.
"""
import argparse
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from gvq.hooks import MethodSync

ITERATIONS = 30


def batch(rank: int, it: int):
    """8x8 random images (this rank's own), labelled by a fixed rule so there is something to learn."""
    x = torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(1000 * it + rank))
    return x, (x[:, 0, :4].mean((1, 2)) > 0).long() + 2 * (x[:, 0, 4:].mean((1, 2)) > 0).long()


class TorchAverager:
    """torch's local SGD in the shape of MethodSync: DDP's no_sync every step, then
    ``PeriodicModelAverager(period)`` after the optimizer's step (all-reduce of the parameters)."""

    def __init__(self, ddp, period: int):
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")                # its warm-up advice
            self.averager = PeriodicModelAverager(period=period, warmup_steps=0)
        self.ddp, self.period, self.iteration = ddp, period, 0

    def no_sync(self):
        return self.ddp.no_sync()

    def after_step(self) -> dict:
        self.averager.average_parameters(self.ddp.module.parameters())
        self.iteration += 1
        return {"synced": int((self.iteration - 1) % self.period == 0)}

    def close(self):
        pass


def run(args) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")                # torchrun: rank, world size and rendezvous from its env
    rank = dist.get_rank()
    torch.manual_seed(0)                           # the same initial model on every rank
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 6 * 6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    if args.torch_averager:
        sync = TorchAverager(model, args.torch_averager)
    else:
        sync = MethodSync.from_config(args.method, model, overrides(args.overrides), aggregator=args.aggregator)
    if args.resume:                                # every rank its own file: between syncs they differ
        ckpt = torch.load(f"{args.resume}.rank{rank}.pt", weights_only=False)
        net.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        sync.load_state_dict(ckpt["gvq"])
    syncs = sent = 0
    for it in range(sync.iteration, ITERATIONS):
        if args.save and it == args.save_at:       # each rank its own: the script's checkpoint, as it saves it
            torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "gvq": sync.state_dict()},
                       f"{args.save}.rank{rank}.pt")
        x, y = batch(rank, it)
        opt.zero_grad()
        with sync.no_sync():                       # DDP's no_sync on a step whose gradients stay local
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        opt.step()
        stats = sync.after_step()                  # at a sync: the parameters (Δ) averaged by gvq's ring
        syncs, sent = syncs + stats["synced"], sent + stats.get("bytes_sent", 0)
        dist.all_reduce(mean := loss.detach().clone())
        if rank == 0:
            print(f"iteration {it} loss {mean.item() / dist.get_world_size():.7f}", flush=True)
    if rank == 0:
        print(f"syncs {syncs} bytes sent {sent}", flush=True)
        print(f"checksum {sum(p.double().sum().item() for p in net.parameters()):.12f}", flush=True)
    sync.close()
    dist.barrier()      # every rank done before any tears the group down under a peer's last messages
    dist.destroy_process_group()


def overrides(pairs: list[str]) -> dict:
    """``key=value`` pairs as the hook's overrides: a number where the value reads as one."""
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        for kind in (int, float):
            try:
                value = kind(value)
                break
            except ValueError:
                pass
        out[key] = value
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("method", nargs="?", default="local_sgd", help="a conf/method option")
    ap.add_argument("overrides", nargs="*", help="method.every=4, compressor.bits=4, ...")
    ap.add_argument("--aggregator", default="rar", help="a conf/aggregator ring option")
    ap.add_argument("--torch-averager", type=int, metavar="H", help="torch's PeriodicModelAverager(period=H)")
    ap.add_argument("--save", help="save each rank's checkpoint to SAVE.rank<r>.pt (before step --save-at)")
    ap.add_argument("--save-at", type=int, default=12, help="the step --save saves before")
    ap.add_argument("--resume", help="load each rank's checkpoint RESUME.rank<r>.pt first")
    run(ap.parse_intermixed_args())
