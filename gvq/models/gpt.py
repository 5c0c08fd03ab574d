"""A small decoder-only transformer language model, nanoGPT's shape (Karpathy, 2022).

Pre-norm blocks (LayerNorm, causal self-attention through ``scaled_dot_product_attention``, LayerNorm, a
4x GELU MLP), learned positions, the token embedding tied to the output layer, GPT-2's initialisation
(residual projections scaled by 1/sqrt(2 x layers)).  It maps ``(B, T)`` token ids to ``(B, T, V)`` logits;
the training loop's loss and accuracy flatten the leading dimensions, so a CNN's ``(B, C)`` and a language
model's ``(B, T, V)`` are scored by the same code.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # no token sees a later one
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(width), CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """``layers`` blocks of ``width`` channels in ``heads`` heads, over at most ``context`` positions;
    ``num_classes`` is the vocabulary (the data set's)."""

    def __init__(self, num_classes: int = 256, in_channels: int = 1, layers: int = 4, heads: int = 4,
                 width: int = 128, context: int = 64):
        super().__init__()
        if in_channels != 1:
            raise ValueError(f"model=gpt: takes token ids (in_channels=1), not {in_channels}-channel images; "
                             "use a text data set (dataset=austen or dataset=text)")
        if width % heads:
            raise ValueError(f"model.width={width}: must be a multiple of model.heads={heads}")
        self.context = context
        self.tok = nn.Embedding(num_classes, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes, bias=False)
        self.head.weight = self.tok.weight                  # tied: one (V, width) matrix, one gradient
        self._init(layers)

    def _init(self, layers: int) -> None:
        for name, p in self.named_parameters():
            if p.dim() == 2:                                # weights and embeddings; biases stay 0
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    @staticmethod
    def default_input(cfg) -> tuple[int, ...]:
        """One input it is built for when a tool names no data set: a window of its ``context`` tokens."""
        return (int(cfg["context"]),)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.context:
            raise ValueError(f"a window of {t} tokens: longer than model.context={self.context}")
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))
