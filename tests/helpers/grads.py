"""Small per-rank gradients with a real network's mix of shapes (conv, bias, fc, a tiny matrix), for
aggregator tests that compare against a reference computed on the summed gradients."""
from __future__ import annotations

import torch

# conv 6x3x3x3 -> 6x27 (rank 2), a bias, conv 8x6x3x3, fc 10x32, and a 3x3 that goes raw (no gain)
SHAPES = [(6, 3, 3, 3), (6,), (8, 6, 3, 3), (8,), (10, 32), (10,), (3, 3)]


def grads_at(rank: int, it: int) -> list[torch.Tensor]:
    """Rank ``rank``'s gradient at iteration ``it`` (seeded: the same on every call)."""
    g = torch.Generator().manual_seed(1000 * it + rank)
    return [torch.randn(s, generator=g) for s in SHAPES]


def set_grads(params, grads) -> None:
    for p, x in zip(params, grads):
        p.grad.copy_(x)


def flat(grads) -> torch.Tensor:
    return torch.cat([x.reshape(-1) for x in grads])


def gaussian(n: int, seed: int = 0) -> torch.Tensor:
    """``n`` standard normal values from a seeded generator."""
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


#: one 8x4x3x3 conv layer (288 values): the layer the held-out-scoring tests use
HELD_OUT_SHAPES = [torch.Size((8, 4, 3, 3))]


def held_out_grads(warmup: int, L_t: int, L_c: int) -> list[torch.Tensor]:
    """Gradients of :data:`HELD_OUT_SHAPES` for one cycle: the L_t fitting ones (after ``warmup``) in a
    3-dimensional subspace A, all others in the orthogonal subspace B, so a fit on the fitting window
    loses ~everything on the evaluation gradients (scored in-sample, it would be near-exact)."""
    g = torch.Generator().manual_seed(1)
    q, _ = torch.linalg.qr(torch.randn(288, 6, generator=g))
    A, B = q[:, :3].T, q[:, 3:].T
    return [torch.randn(3, generator=g) @ (A if warmup <= t < warmup + L_t else B)
            for t in range(warmup + L_t + L_c)]
