"""Record real gradients from a short single-process training run (for the analyses, not for timing).

    grads = record_gradients(model="cnn", dataset="digits", iterations=150)   # list of flat tensors

Uses the same Hydra option files as the CLI, so ``model``/``dataset`` are their names in ``conf/``.
"""
from __future__ import annotations

import torch
from hydra.utils import instantiate

from gvq.workloads import of_data


def record_gradients(model: str = "cnn", dataset: str = "digits", iterations: int = 150,
                     batch_size: int = 32, lr: float = 0.05, seed: int = 0, every: int = 1,
                     params: str = "all") -> tuple[list[torch.Tensor], torch.nn.Module]:
    """Train ``iterations`` SGD steps; return every ``every``-th gradient flattened (``params='all'``)
    or only the first conv weight's (``params='conv1'``), and the model."""
    from gvq.bench.common import compose
    from gvq.data import iterate_batches
    cfg = compose([f"model={model}", f"dataset={dataset}", f"seed={seed}"])
    torch.manual_seed(seed)
    data = instantiate(cfg.dataset)
    work = of_data(data)                     # the loss a run of this data trains on
    net = instantiate(cfg.model, num_classes=work.num_classes, in_channels=work.in_channels)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    batches = iterate_batches(data, 0, 1, batch_size, seed)
    chosen = list(net.parameters())
    if params == "conv1":
        chosen = [next(p for p in net.parameters() if p.dim() == 4)]
    grads = []
    for it in range(iterations):
        _, x, y = next(batches)
        opt.zero_grad()
        work.loss(net(x), y).backward()
        if it % every == 0:
            grads.append(torch.cat([p.grad.reshape(-1) for p in chosen]).clone())
        opt.step()
    return grads, net
