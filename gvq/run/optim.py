"""The optimizers a run builds, one builder per ``conf/optim`` option (``_target_``), each taking the model.

The schedule and clipping keys every option shares (:data:`gvq.schema.options.SCHEDULE_KEYS`) are the
training loop's, not the builder's: :func:`build_optimizer` leaves them out.
"""
from __future__ import annotations

import torch
from hydra.utils import instantiate

from gvq.schema.options import SCHEDULE_KEYS


def build_optimizer(optim: dict, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer ``optim`` (a composed ``conf/optim`` node) names, over ``model``'s parameters."""
    return instantiate({k: v for k, v in optim.items() if k not in SCHEDULE_KEYS}, model, _convert_="all")


def sgd(model: torch.nn.Module, lr: float, momentum: float, weight_decay: float,
        nesterov: bool) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay,
                           nesterov=nesterov)


def adamw(model: torch.nn.Module, lr: float, betas: list, eps: float, weight_decay: float) -> torch.optim.AdamW:
    """Weight decay on parameters of two or more dimensions (matrices, embeddings) only: decaying biases
    and LayerNorm gains towards 0 only hurts (nanoGPT, GPT-2)."""
    params = list(model.parameters())          # a tied weight once
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=tuple(betas), eps=eps)
