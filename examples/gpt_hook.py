"""Train a small GPT on bytes of a text with torch DDP and a gvq communication hook, under torchrun (plain
torch, no Hydra): a user's own language-model script with gvq's compressor inside backward.

    torchrun --standalone --nproc-per-node 2 examples/gpt_hook.py powersgd            # any conf/aggregator ring option
    torchrun --standalone --nproc-per-node 2 examples/gpt_hook.py qsgd --text README.md   # another text

The text (default: this file) is cut into windows of 32 bytes, the last tenth held out; each rank trains
on its own windows with AdamW, the averaged gradient clipped to norm 1 (after the hook: what DDP users do).
Prints the mean loss over ranks each iteration, and the held-out loss in bits per byte at the end.
"""
import math
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from gvq.hooks import GvqHookState, gvq_hook
from gvq.models import GPT

CONTEXT, BATCH, ITERATIONS = 32, 8, 40


def windows(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) windows of CONTEXT + 1 bytes (inputs and their next bytes)."""
    raw = torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.uint8).long()
    n = (len(raw) - 1) // CONTEXT
    w = torch.stack([raw[i * CONTEXT: i * CONTEXT + CONTEXT + 1] for i in range(n)])
    cut = n - max(1, n // 10)
    return w[:cut], w[cut:]


def main(option: str, text: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")                  # torchrun: rank, world size and rendezvous from its env
    rank, world = dist.get_rank(), dist.get_world_size()
    train, held_out = windows(text)
    torch.manual_seed(0)                             # the same initial model on every rank
    net = GPT(num_classes=256, layers=2, heads=2, width=32, context=CONTEXT)
    model = DistributedDataParallel(net)
    state = GvqHookState.from_config(option, model)
    model.register_comm_hook(state, gvq_hook)        # each bucket averaged by gvq's ring during backward
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(rank)          # this rank's own windows
    for it in range(ITERATIONS):
        batch = train[torch.randint(len(train), (BATCH,), generator=g)]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)     # the averaged gradient: the same on every rank
        opt.step()
        dist.all_reduce(mean := loss.detach().clone())
        if rank == 0:
            print(f"iteration {it} loss {mean.item() / world:.7f}", flush=True)
    with torch.no_grad():
        nats = F.cross_entropy(net(held_out[:, :-1]).flatten(0, 1), held_out[:, 1:].flatten()).item()
    if rank == 0:
        print(f"held-out bits per byte {nats / math.log(2):.4f}", flush=True)
    state.close()                                    # stops the hook's communication thread
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    args = sys.argv[1:]
    text = args[args.index("--text") + 1] if "--text" in args else __file__
    main(next((a for a in args if not a.startswith("--") and a != text), "powersgd"), text)
