"""GradiVeQ's fitted state as plain tensors: what rank 0 relays to the other ranks (SVD signs and
round-off differ between processes, so every rank must load the *same* U_d and mu) and what a checkpoint
keeps.  A mixin of :class:`gvq.compressors.gradiveq.codec.GradiVeQ`, kept apart so that the compressor's
module holds only the math and the wire format."""
from __future__ import annotations

import torch
from torch import Tensor


class GradiVeQState:
    """state_tensors / load_state_tensors (the relay) and state_dict / load_state_dict (checkpoints)."""

    def state_tensors(self) -> list[Tensor]:
        """[d per group (int64, n_groups), floats (all U_d, then all mu, then energies; float32)], on the
        device the fit ran on."""
        self._need_fit()
        dev = self._mu_flat.device
        ds = torch.tensor([U.shape[1] for U in self._U], dtype=torch.int64, device=dev)
        vals = torch.cat([U.reshape(-1) for U in self._U] + [m.reshape(-1) for m in self._mu]
                         + [torch.tensor(self._energy, dtype=torch.float32, device=dev)])
        return [ds, vals]

    def state_d_buffer(self, device) -> Tensor:
        """Receive buffer for ``state_tensors()[0]`` on ``device`` (the transport's): its size is fixed
        by bind (number of groups)."""
        self._need_layout()
        return torch.empty(len(self.groups), dtype=torch.int64, device=device)

    def state_value_buffer(self, ds: Tensor) -> Tensor:
        """Receive buffer for ``state_tensors()[1]`` once the d's (``ds``) have arrived, on their device."""
        return torch.empty(self._state_value_count(ds), dtype=torch.float32, device=ds.device)

    def _state_value_count(self, ds: Tensor) -> int:
        self._need_layout()
        return sum(g.K * int(k) + g.n * g.K + 1 for g, k in zip(self.groups, ds.tolist()))

    def load_state_tensors(self, tensors: list[Tensor]) -> None:
        ds, vals = tensors
        self._need_layout()
        bad_d = any(not 1 <= k <= g.K for g, k in zip(self.groups, ds.tolist()))
        if ds.numel() != len(self.groups) or bad_d or vals.numel() != self._state_value_count(ds):
            raise ValueError("GradiVeQ.load_state_tensors: sizes do not match the bound layout")
        U, mu, off = [], [], 0
        for g, k in zip(self.groups, ds.tolist()):
            U.append(vals[off: off + g.K * k].reshape(g.K, k).float().clone())
            off += g.K * k
        for g in self.groups:
            mu.append(vals[off: off + g.n * g.K].reshape(g.n, g.K).float().clone())
            off += g.n * g.K
        self._set_state(U, mu, vals[off:].tolist(), vals.device)

    def state_dict(self) -> dict:
        """Plain tensors / ints / strings: the layout's shapes, K and s, and the fitted state if any."""
        layout = self._need_layout()
        ds, vals = self.state_tensors() if self._fitted else (None, None)
        return {"shapes": [list(s) for s in layout.shapes], "K": self.K, "s": self.s, "ds": ds, "values": vals}

    def load_state_dict(self, sd: dict) -> None:
        if str(sd["K"]) != str(self.K) or float(sd["s"]) != self.s:
            raise ValueError(f"GradiVeQ.load_state_dict: checkpoint has K={sd['K']}, s={sd['s']}, "
                             f"this run K={self.K}, s={self.s}")
        shapes = [tuple(s) for s in sd["shapes"]]
        if self.layout is None or self.layout.shapes != shapes:
            self.bind(shapes)
        if sd["ds"] is not None:
            self.load_state_tensors([sd["ds"], sd["values"]])
