"""Train a small CNN with accelerate and a gvq communication hook, checkpointing every rank's hook state:

    torchrun --standalone --nproc-per-node 2 examples/accelerate_hook.py qsgd
    accelerate launch --multi_gpu --num_processes 2 --main_process_port 0 examples/accelerate_hook.py qsgd
    torchrun --standalone --nproc-per-node 2 examples/accelerate_hook.py qsgd --stop-at 15 --save ckpt
    torchrun --standalone --nproc-per-node 2 examples/accelerate_hook.py qsgd --resume ckpt
    accelerate launch --multi_gpu --num_processes 2 --main_process_port 0 examples/accelerate_hook.py --method local_sgd

The second line is the first through accelerate's launcher: ``--multi_gpu`` starts the processes through
torchrun on any machine (``Accelerator(cpu=True)`` keeps them on the CPU), ``--main_process_port 0`` takes
a free port.  (``accelerate launch --cpu --num_processes 2`` starts ONE process: accelerate's simple
launcher ignores ``--num_processes`` on the CPU.)  Lines three and four save after 15 steps and
resume: the resumed run ends where the uninterrupted one ends.

``accelerator.prepare`` wraps the model in DDP (on more than one process); the hook is registered on that
wrapper.  accelerate writes one checkpoint from rank 0, so the hook's per-rank state (error memory, dither,
samples) is handed to it as ``AllRanks(state)``: saving gathers every rank's, loading takes its own.
The fifth line syncs less often instead of compressing: local SGD (any conf/method option), the
parameters averaged every 4 steps by rar (or the option given) through ``gvq.hooks.MethodSync`` around the
optimizer step, the forward and backward of the steps between in ``sync.no_sync()`` (DDP's ``no_sync`` on
the prepared model); it trains as examples/method_hook.py does.  It does not checkpoint through
``save_state``: between syncs every rank's parameters and optimizer state are its own, and accelerate
writes rank 0's (save each rank's own, as examples/method_hook.py does).

Prints the mean loss over ranks each step, and the parameters' checksum at the end.
"""
import argparse
import contextlib

import torch
import torch.nn.functional as F
from accelerate import Accelerator

from gvq.hooks import GvqHookState, MethodSync, gvq_hook
from gvq.hooks.checkpoint import AllRanks

STEPS = 30


def batch(rank: int, it: int):
    """8x8 random images (this rank's own), labelled by a fixed rule so there is something to learn."""
    x = torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(1000 * it + rank))
    return x, (x[:, 0, :4].mean((1, 2)) > 0).long() + 2 * (x[:, 0, 4:].mean((1, 2)) > 0).long()


def main(args) -> None:
    torch.set_num_threads(1)
    acc = Accelerator(cpu=True)
    torch.manual_seed(0)                           # the same initial model on every rank
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 6 * 6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9))
    if args.method:                                # after prepare the model is DDP: the method wraps its step
        state = MethodSync.from_config(args.method, model, {"method.every": args.every}, aggregator=args.option)
    else:           # the hook, on the DDP wrapper: its process group is averaged over
        state = GvqHookState.from_config(args.option, model)
        model.register_comm_hook(state, gvq_hook)
        acc.register_for_checkpointing(AllRanks(state))
    start = 0
    if args.resume:
        acc.load_state(args.resume)
        start = state.iteration                    # the hook counts the steps it averaged
    for it in range(start, args.stop_at or STEPS):
        x, y = batch(acc.process_index, it)
        opt.zero_grad()
        with state.no_sync() if args.method else contextlib.nullcontext():
            loss = F.cross_entropy(model(x), y)
            acc.backward(loss)
        opt.step()
        if args.method:
            state.after_step()                     # at a sync: the parameters averaged by the aggregator
        mean = acc.reduce(loss.detach(), reduction="mean")
        acc.print(f"iteration {it} loss {mean.item():.7f}")
    if args.save:
        acc.save_state(args.save)
    acc.print(f"checksum {sum(p.double().sum().item() for p in net.parameters()):.12f}")
    state.close()
    acc.end_training()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("option", nargs="?", help="a conf/aggregator ring option (qsgd; rar with --method)")
    ap.add_argument("--save", help="save_state to this folder at the end")
    ap.add_argument("--stop-at", type=int, help="stop before this step")
    ap.add_argument("--resume", help="load_state from this folder first")
    ap.add_argument("--method", help="a conf/method option (local_sgd, diloco) instead of the hook")
    ap.add_argument("--every", type=int, default=4, help="the method's steps between syncs")
    args = ap.parse_args()
    args.option = args.option or ("rar" if args.method else "qsgd")
    if args.method and (args.save or args.resume):
        ap.error("--method: save each rank's own checkpoint (examples/method_hook.py), not save_state")
    main(args)
