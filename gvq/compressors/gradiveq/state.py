"""GradiVeQ's fitted PCA state as a value: the bases U_d and means mu of every group, their Eq. 6
energies, and the state's digest.  The codec (:class:`gvq.compressors.gradiveq.codec.GradiVeQ`) holds one
(``codec.pca``) and derives the forms it applies from it.

Every rank must hold the *same* U_d and mu (SVD signs and round-off may differ between processes), so
the state also exists as two plain tensors (:meth:`PCAState.tensors`): what rank 0 relays to the other
ranks, what the digest hashes and what a checkpoint keeps.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor


@dataclass(frozen=True, eq=False)
class PCAState:
    """One fit of every group, in the layout's group order (never modified once made)."""

    U: tuple[Tensor, ...]         # per group: (K, d) float32, orthonormal columns
    mu: tuple[Tensor, ...]        # per group: (n, K) float32, each slice's mean (or the group's, repeated)
    energy: tuple[float, ...]     # per group: Eq. 6 energy kept, rounded to float32 as the relay carries it
    device: torch.device          # where the fit ran (the gradient's; also for a model with no group)

    @classmethod
    def of(cls, U: list[Tensor], mu: list[Tensor], energy: list[float], device) -> "PCAState":
        # energies rounded to float32, as they travel in tensors(): every rank logs the same stats
        rounded = torch.tensor(list(energy), dtype=torch.float32, device="cpu").tolist()
        return cls(tuple(U), tuple(mu), tuple(rounded), torch.device(device))

    def subset(self, gids: list[int]) -> "PCAState":
        """The state of groups ``gids`` only, in that order: the same tensors, not copies."""
        return PCAState(tuple(self.U[j] for j in gids), tuple(self.mu[j] for j in gids),
                        tuple(self.energy[j] for j in gids), self.device)

    def to(self, device) -> "PCAState":
        """This state on ``device`` (itself if already there): the codec follows its gradient's device,
        whichever device the fit ran on or a checkpoint was loaded to."""
        device = torch.device(device)
        if all(t.device == device for t in (*self.U, *self.mu)):
            return self
        return PCAState(tuple(u.to(device) for u in self.U), tuple(m.to(device) for m in self.mu),
                        self.energy, device)

    @property
    def ds(self) -> list[int]:
        """d of every group."""
        return [u.shape[1] for u in self.U]

    def tensors(self) -> list[Tensor]:
        """[d per group (int64, n_groups), floats (all U_d, then all mu, then energies; float32)], on the
        device the fit ran on."""
        ds = torch.tensor(self.ds, dtype=torch.int64, device=self.device)
        vals = torch.cat([u.reshape(-1) for u in self.U] + [m.reshape(-1) for m in self.mu]
                         + [torch.tensor(self.energy, dtype=torch.float32, device=self.device)])
        return [ds, vals]

    @cached_property
    def digest(self) -> int:
        """sha256 of :meth:`tensors`, cut to 7 bytes (< 2**56: exact in an int64 all-reduce)."""
        h = hashlib.sha256()
        for t in self.tensors():
            h.update(t.contiguous().cpu().numpy().tobytes())    # one host copy per refresh on a GPU
        return int.from_bytes(h.digest()[:7], "little")

    @classmethod
    def from_tensors(cls, ds: Tensor, vals: Tensor, groups) -> "PCAState":
        """The state :meth:`tensors` gave, for the layout's ``groups`` (each with ``K`` and ``n``)."""
        dl = ds.tolist()                      # one read of the relayed sizes (once per refit)
        bad_d = any(not 1 <= k <= g.K for g, k in zip(groups, dl))
        if ds.numel() != len(groups) or bad_d or vals.numel() != _value_count(groups, dl):
            raise ValueError("PCAState.from_tensors: sizes do not match the bound layout")
        U, mu, off = [], [], 0
        for g, k in zip(groups, dl):
            U.append(vals[off: off + g.K * k].reshape(g.K, k).float().clone())
            off += g.K * k
        for g in groups:
            mu.append(vals[off: off + g.n * g.K].reshape(g.n, g.K).float().clone())
            off += g.n * g.K
        return cls.of(U, mu, vals[off:].tolist(), vals.device)

    def state_dict(self) -> dict:
        """Tensors only: ``ds`` and ``values`` as :meth:`tensors` gives them."""
        ds, vals = self.tensors()
        return {"ds": ds, "values": vals}

    @classmethod
    def from_state_dict(cls, sd: dict, groups) -> "PCAState":
        return cls.from_tensors(sd["ds"], sd["values"], groups)


def value_count(groups, ds: Tensor) -> int:
    """Length of the float tensor of a state with these d's (``ds``) over ``groups``: the size of the
    relay's second receive buffer, known once the d's have arrived."""
    return _value_count(groups, ds.tolist())


def _value_count(groups, ds: list[int]) -> int:
    return sum(g.K * k + g.n * g.K + 1 for g, k in zip(groups, ds))
