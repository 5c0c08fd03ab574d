"""Train a small CNN on 2 gloo ranks with torch DDP and a gvq communication hook (plain torch, no Hydra):

    python examples/ddp_hook.py gradiveq                  # any conf/aggregator ring option: rar, qsgd, gradiveq, ...
    python examples/ddp_hook.py gradiveq --post-backward  # the same aggregator after backward, to compare
    python examples/ddp_hook.py --no-hook                 # torch DDP's own all-reduce (rar's hook: the same bits)
    torchrun --standalone --nproc-per-node 2 examples/ddp_hook.py gradiveq     # the same, launched by torchrun

Each bucket DDP hands the hook is averaged by gvq's ring on a communication thread while backward goes on.
Prints the mean loss over ranks each iteration, and the parameters' checksum at the end.
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from gvq.aggregators.base import RunContext
from gvq.hooks import GvqHookState, gvq_hook
from gvq.hooks.config import build_aggregator

WORLD, ITERATIONS = 2, 30


def batch(rank: int, it: int):
    """8x8 random images (this rank's own), labelled by a fixed rule so there is something to learn."""
    x = torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(1000 * it + rank))
    return x, (x[:, 0, :4].mean((1, 2)) > 0).long() + 2 * (x[:, 0, 4:].mean((1, 2)) > 0).long()


def run(rank: int, option: str, mode: str, init: str | None) -> None:
    """``mode``: "hook" (gvq inside backward), "post-backward" or "no-hook" (DDP's all-reduce)."""
    torch.set_num_threads(1)
    if init is None:                               # torchrun: rank, world size and rendezvous from its env
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    torch.manual_seed(0)                           # the same initial model on every rank
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 6 * 6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    post_backward, agg = mode == "post-backward", None
    if post_backward:                              # gvq's usual way: one aggregate() after backward
        agg = build_aggregator(option)
        agg.setup(list(net.parameters()), RunContext(rank, dist.get_world_size()))
        model = net
    else:
        model = DistributedDataParallel(net)       # bucket_cap_mb=... for smaller buckets
    if mode == "hook":                             # the hook: averaged inside backward
        agg = GvqHookState.from_config(option, model)   # the DDP wrapper: its process group is averaged over
        model.register_comm_hook(agg, gvq_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for it in range(ITERATIONS):
        x, y = batch(rank, it)
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if post_backward:
            agg.aggregate(it)
        opt.step()
        dist.all_reduce(mean := loss.detach().clone())
        if rank == 0:
            print(f"iteration {it} loss {mean.item() / dist.get_world_size():.7f}", flush=True)
    if rank == 0:
        print(f"checksum {sum(p.double().sum().item() for p in net.parameters()):.12f}", flush=True)
    if agg is not None:
        agg.close()                                # stops the hook's communication thread
    dist.barrier()      # every rank done before any tears the group down under a peer's last messages
    dist.destroy_process_group()


if __name__ == "__main__":
    option = next((a for a in sys.argv[1:] if not a.startswith("--")), "qsgd")
    mode = next((a[2:] for a in sys.argv[1:] if a in ("--post-backward", "--no-hook")), "hook")
    if "RANK" in os.environ:                       # started by torchrun (one process per rank)
        run(int(os.environ["RANK"]), option, mode, None)
    else:
        with tempfile.TemporaryDirectory() as tmp:     # file rendezvous: no port to collide with
            mp.spawn(run, args=(option, mode, f"file://{tmp}/rendezvous"), nprocs=WORLD)
