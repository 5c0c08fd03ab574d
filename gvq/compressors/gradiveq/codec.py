"""GradiVeQ (Yu et al., NeurIPS 2018): a PCA-based linear compressor whose payloads add up (Eq. 1).

See docs/design.md#gvqcompressorsgradiveqcodecpy for how it works and why.
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor

from gvq.compressors import _kernels as kernels_
from gvq.compressors.base import Compressor, check_int
from gvq.compressors.gradiveq.batched import BatchedPlan
from gvq.compressors.gradiveq.layout import (GradLayout, Group, build_groups, check_config, cuts, layer_groups,
                                             parse_K, pieces, resolve_matrices)
from gvq.compressors.gradiveq.pca import principal_subspace
from gvq.compressors.gradiveq.state import PCAState

BASIS_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FOLD_BYTES = 1 << 20    # fp32 bases up to this size: compress/decompress as one addmm (see load_pca)
_UNFITTED = "GradiVeQ: not fitted; call fit(samples) or load_pca(state) first"


def relative_loss(c2: float, p2: float, g2: float) -> float:
    """Eq. 7: ||g_n - (U_d g'_n + mu/N)||^2 / ||g_n||^2 over compressed slices, from the sums
    :meth:`GradiVeQ.tracked_sums` reads (over one vector, or summed over an iteration's buckets)."""
    c2, p2, g2 = float(c2), float(p2), float(g2)
    return max(c2 - p2, 0.0) / g2 if g2 > 0 else 0.0


class GradiVeQ(Compressor):
    additive = True
    name = "gradiveq"

    def __init__(self, lam: float = 0.01, K="auto", s=float("inf"), pool: bool = False,
                 d: int | None = None, target_ratio: float | None = None, world_size: int = 1,
                 mu: str = "slice", basis_dtype: str = "float32", matrices: str = "auto", kernels: str = "auto",
                 **kw):
        if "lambda" in kw:                      # the YAML key; `lambda` cannot be a Python parameter
            lam = kw.pop("lambda")
        if kw:
            raise ValueError(f"{next(iter(kw))}: unknown GradiVeQ option")
        # lambda: energy Eq. 6 may drop; larger => smaller d => more compression, more loss
        # K: slice size; larger => more correlation per basis but d <= L_t - 1, so a higher ratio and
        #    usually more loss on fresh gradients (Fig. 5: keep it a multiple of F*D)
        # s: slices per basis; larger => fewer SVDs, same ratio, possibly more loss (inf: one per layer)
        # pool: fit on all slices of a group => rank up to n*(L_t-1): d may grow (less compression),
        #    loss on the non-first slices usually drops
        # d / target_ratio: override Eq. 6 (larger d / smaller ratio => less compression, less loss)
        # mu: 'slice' (each slice's own mean, Eq. 3-5's mu_m) or 'group' (one mean per group); no effect
        #    on the wire ratio, 'slice' usually loses less on the non-first slices
        # matrices: which layers are sliced (gvq.compressors.gradiveq.layout.MATRICES): conv kernels
        #    (the paper), or 2-D weights' rows too; more layers => fewer raw bytes, more PCA and loss
        # basis_dtype: precision the bases are *applied* in (fitting, mu and the wire stay float32);
        #    bfloat16 halves the bytes streamed per compress/decompress (much faster with AVX-512
        #    bf16 GEMMs, slower without) and rounds payloads and reconstructions to bf16 (2**-9 relative);
        #    no effect on the ratio
        if basis_dtype not in BASIS_DTYPES:
            raise ValueError(f"basis_dtype={basis_dtype!r}: must be one of {', '.join(BASIS_DTYPES)}")
        self.basis_dtype, self._dt = basis_dtype, BASIS_DTYPES[basis_dtype]
        self.s = check_config(lam, s, pool, d, target_ratio, mu, matrices)
        self.lam, self.K, self.pool, self.d, self.target_ratio, self.mu = lam, K, pool, d, target_ratio, mu
        self.matrices = matrices
        # kernels: auto | triton | torch: the device path's steps between its GEMMs as one Triton kernel each
        #    way (fewer launches a call; auto: on CUDA where Triton is installed) or as torch ops; on the host
        #    auto and triton keep its per-piece GEMMs, torch takes the device path (gvq/compressors/_kernels.py)
        self.kernels, self._paths = kernels_.check_kernels(kernels), {}
        self._K_spec = parse_K(K)
        self.world_size = world_size
        self.layout: GradLayout | None = None
        self.groups: list[Group] = []
        self.pca: PCAState | None = None        # the fitted state (set by fit / load_pca only)

    @property
    def world_size(self) -> int:
        return self._world_size

    @world_size.setter
    def world_size(self, n: int) -> None:
        self._world_size = check_int("world_size", n, 1)

    # -- layout ------------------------------------------------------------------------------------
    def bind(self, shapes) -> "GradiVeQ":
        """Build the layout and groups for these parameter shapes (model order); drops any fit."""
        self.layout = GradLayout(shapes)
        self.groups = build_groups(self.layout, self._K_spec, self.K, self.s, self.matrices)
        self._starts = [g.start for g in self.groups]
        self._cuts: list[int] | None = None
        self.pca, self._plans, self._batched = None, {}, {}
        return self

    def _need_layout(self) -> GradLayout:
        if self.layout is None:
            raise RuntimeError("GradiVeQ: call bind([p.shape for p in params]) first")
        return self.layout

    def flatten(self, grads: list[Tensor], out: Tensor | None = None) -> Tensor:
        return self._need_layout().flatten(grads, out)

    def unflatten(self, flat: Tensor, out: list[Tensor]) -> None:
        self._need_layout().unflatten(flat, out)

    def cuts(self, numel: int) -> list[int]:
        if numel != self._need_layout().numel:
            raise ValueError(f"GradiVeQ: numel={numel} but the bound layout has {self.layout.numel}")
        if self._cuts is None:
            self._cuts = cuts(self.groups, numel)
        return self._cuts

    # -- fit -----------------------------------------------------------------------------------------
    def fit(self, samples: Tensor) -> "GradiVeQ":
        """PCA of every group from ``samples``: (L_t, numel) aggregated flat gradients in this layout's
        order, as SUMS over ranks (Eq. 2; multiply means by N), since Eq. 4 subtracts mu from the sum."""
        numel = self._need_layout().numel
        if samples.dim() != 2 or samples.shape[1] != numel:
            raise ValueError(f"GradiVeQ.fit: samples must be (L_t, {numel}), got {tuple(samples.shape)}")
        U, mu, energy = [], [], []
        for g in self.groups:
            u, m, e = self._fit_group(g, samples)
            U.append(u), mu.append(m), energy.append(e)
        return self.load_pca(PCAState.of(U, mu, energy, samples.device))

    def _fit_group(self, g: Group, samples: Tensor) -> tuple[Tensor, Tensor, float]:
        L = samples.shape[0]
        blk = samples[:, g.start: g.stop].reshape(L, g.n, g.K)      # a view: only the rows the PCA reads
        # become float64; mu summed in their dtype (cheaper than in float64): its round-off delta shifts
        # all centred rows alike, so the Gram matrix moves by L delta delta^T only (second order, ~1e-12 of it)
        mean = blk.sum(0).div_(L).to(torch.float64)                 # (n, K): every slice's own mu_m
        if self.pool and self.mu == "slice":
            rows, dof = (blk.to(torch.float64) - mean).reshape(L * g.n, g.K), g.n * (L - 1)
        elif self.pool:                                             # equal counts: the mean of all rows
            mean = mean.mean(0).expand(g.n, g.K)                    # is the mean of the slices' means
            rows, dof = blk.to(torch.float64).reshape(L * g.n, g.K) - mean[0], L * g.n - 1
        else:                                                  # the paper: the first slice only
            rows, dof = blk[:, 0].to(torch.float64) - mean[0], L - 1
            if self.mu == "group":
                mean = mean[0].expand(g.n, g.K)
        fit = principal_subspace(rows, dof, self.lam, mean[0], self.d, self.target_ratio,
                                 eps=torch.finfo(samples.dtype).eps)
        return fit.U, mean.float().contiguous(), fit.energy

    def load_pca(self, pca: PCAState) -> "GradiVeQ":
        """Adopt ``pca`` (a fit of this layout's groups, e.g. relayed from rank 0 or from a checkpoint)
        and derive the forms compress / decompress apply."""
        self._need_layout()
        if len(pca.U) != len(self.groups) or any(u.shape[0] != g.K for u, g in zip(pca.U, self.groups)):
            raise ValueError("GradiVeQ.load_pca: the state does not match the bound layout's groups")
        U = pca.U
        # mu_m^T U_d per slice, so that compress is X U - (mu U) / N  (Eq. 3) with no centred copy of X
        muU = [m @ u for m, u in zip(pca.mu, U)]
        # The bases (many times the gradient) are streamed from memory on every call, so each GEMM reads
        # the copy it streams fastest: compress X U from a contiguous U (K x d), decompress P U^T from a
        # contiguous U^T (d x K), each row of the basis read once in order.
        Uc = [u.T.contiguous().to(self._dt) for u in U]
        Ud = [u.contiguous().to(self._dt) for u in U]
        # Bases that stay in cache (fp32, <= FOLD_BYTES) take one addmm: mu folded in, the result written
        # in place, no transpose copy (their layout: the transposed views).  A rule on shapes, so every
        # rank decodes the same way.
        fold = [self._dt == torch.float32 and u.numel() * 4 <= FOLD_BYTES for u in U]
        return self._adopt(pca, muU, Uc, Ud, fold)

    def _adopt(self, pca: PCAState, muU: list, Uc: list, Ud: list, fold: list) -> "GradiVeQ":
        """Take ``pca`` and the forms compress / decompress apply, derived from it (one per group)."""
        self._muU, self._Uc, self._Ud, self._fold = muU, Uc, Ud, fold
        # mu where compressed, 0 on raw values; on the device the fit ran on (the gradient's)
        self._mu_flat = torch.zeros(self.layout.numel, device=pca.device)
        self._grouped = torch.zeros(self.layout.numel, device=pca.device)    # 1 on compressed slices
        for g, m in zip(self.groups, pca.mu):
            self._mu_flat[g.start: g.stop] = m.reshape(-1)
            self._grouped[g.start: g.stop] = 1.0
        self.pca, self._plans, self._batched = pca, {}, {}
        return self

    def restricted_to(self, layers: list[int]) -> "GradiVeQ":
        """This codec on ``layers`` only (positions in its shapes, in a DDP bucket's order): the codec a
        bucket is averaged with.  A group is one conv layer's slices, so its basis belongs to the layer,
        whatever bucket the layer lands in: the new codec shares this one's fitted state for their groups
        (the same tensors, not copies: bases are large; none if not fitted), every bucketing compresses
        each layer with the same basis, and Eq. (1) holds on each bucket as on the whole gradient."""
        sub = copy.copy(self)                   # the configuration; bind() below replaces all layout state
        sub._track = None
        sub.matrices = resolve_matrices(self._need_layout().shapes, self.matrices)   # the whole model's choice
        sub.bind([self._need_layout().shapes[i] for i in layers])
        if not self.fitted:
            return sub
        gids = layer_groups(self.groups, layers)                 # sub's groups, in sub's order
        if len(gids) != len(sub.groups):
            raise ValueError("gradiveq: a bucket's groups differ from the whole codec's")
        forms = ([form[j] for j in gids] for form in (self._muU, self._Uc, self._Ud, self._fold))
        return sub._adopt(self.pca.subset(gids), *forms)

    def follow(self, t: Tensor) -> None:
        """Move the fitted state and every form derived from it to ``t``'s device if it lives elsewhere
        (a fit relayed through the host, a checkpoint loaded on the CPU, a bench that fits on the host):
        a Python comparison per call, a copy only when the device changes."""
        if self.pca is not None and self._mu_flat.device != t.device:
            self.load_pca(self.pca.to(t.device))

    def devices(self) -> set[torch.device]:
        """The devices of every tensor this codec holds (the fitted state and its derived forms)."""
        if self.pca is None:
            return set()
        held = [*self.pca.U, *self.pca.mu, *self._muU, *self._Uc, *self._Ud, self._mu_flat, self._grouped]
        return {t.device for t in held}

    @property
    def fitted(self) -> bool:
        return self.pca is not None

    def basis(self, gid: int) -> tuple[Tensor, Tensor]:
        """(U_d (K x d), mu (n x K)) of group ``gid``, read-only views of the live state."""
        return self._need_fit().U[gid], self.pca.mu[gid]

    def _need_fit(self) -> PCAState:
        if self.pca is None:
            raise RuntimeError(_UNFITTED)
        return self.pca

    # -- checkpoint ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain tensors / ints / strings: the layout's shapes, K and s, and the fitted state if any."""
        layout = self._need_layout()
        pca = self.pca.state_dict() if self.fitted else {"ds": None, "values": None}
        return {"shapes": [list(s) for s in layout.shapes], "K": self.K, "s": self.s, **pca}

    def load_state_dict(self, sd: dict) -> None:
        if str(sd["K"]) != str(self.K) or float(sd["s"]) != self.s:
            raise ValueError(f"GradiVeQ.load_state_dict: checkpoint has K={sd['K']}, s={sd['s']}, "
                             f"this run K={self.K}, s={self.s}")
        shapes = [tuple(s) for s in sd["shapes"]]
        if self.layout is None or self.layout.shapes != shapes:
            self.bind(shapes)
        if sd["ds"] is not None:
            self.load_pca(PCAState.from_state_dict(sd, self.groups))

    # -- wire format ---------------------------------------------------------------------------------
    def _plan(self, seg: slice) -> tuple[list[tuple], int]:
        """[(piece, payload offset)] and payload length of ``seg``, cached per segment until refit."""
        self._need_fit()
        key = (seg.start, seg.stop)
        if key not in self._plans:
            if not 0 <= seg.start <= seg.stop <= self.layout.numel or seg.step not in (None, 1):
                raise ValueError(f"segment {seg}: not within [0, {self.layout.numel}]")
            plan, off = [], 0
            for p in pieces(self.groups, self._starts, seg):
                plan.append((p, off))
                off += (p.stop - p.start) if p.gid < 0 else (p.i1 - p.i0) * self.pca.U[p.gid].shape[1]
            if len(self._plans) > 1024:                       # segments repeat; never grow unbounded
                self._plans.clear()
            self._plans[key] = (plan, off)
        return self._plans[key]

    def payload_spec(self, seg: slice) -> tuple[torch.dtype, int]:
        return torch.float32, self._plan(seg)[1]

    def _batched_plan(self, seg: slice, device) -> BatchedPlan:
        """The device path's plan of ``seg`` (``batched``), built once per segment and fit."""
        key = (seg.start, seg.stop, device)
        if key not in self._batched:
            plan, total = self._plan(seg)
            if len(self._batched) > 64:                        # plans hold buffers: keep few
                self._batched.clear()
            self._batched[key] = BatchedPlan(plan, total, seg, self.pca.U, self.pca.mu, self._muU,
                                             self.world_size, self._dt, device, self.path(device))
        return self._batched[key]

    def path(self, device: torch.device) -> str:
        """The path on ``device``, chosen once (``_kernels.choose_path``): the host's per-piece GEMMs before the
        interpreted Triton kernels, which are the device path's (``batched``)."""
        return kernels_.path_for(self._paths, self.kernels, device, host_first=True)

    def compress(self, x: Tensor, seg: slice) -> Tensor:
        self.follow(x)
        plan, total = self._plan(seg)
        x = x.reshape(-1).to(torch.float32)
        if x.numel() != seg.stop - seg.start:
            raise ValueError(f"GradiVeQ.compress: {x.numel()} values for segment {seg}")
        if self.path(x.device) != kernels_.HOST:        # the device path: a fixed few ops (batched.py)
            out = self._batched_plan(seg, x.device).compress(x)
            if self._track is not None:
                self._track[1].add_(out.dot(out))
            return out
        out, beta = torch.empty(total, dtype=torch.float32, device=x.device), -1.0 / self.world_size
        for p, off in plan:
            a, b = p.start - seg.start, p.stop - seg.start
            if p.gid < 0:
                out[off: off + b - a].copy_(x[a:b])
                continue
            Uc, n = self._Uc[p.gid], p.i1 - p.i0
            X = x[a:b].view(n, Uc.shape[1])              # all slices of the run: one matmul
            o = out[off: off + n * Uc.shape[0]].view(n, Uc.shape[0])
            muU = self._muU[p.gid][p.i0:p.i1]
            if self._dt == torch.float32:   # one GEMM, mu folded in, straight into the payload
                torch.addmm(muU, X, Uc.T if self._fold[p.gid] else self._Ud[p.gid], beta=beta, out=o)
            else:                           # bf16 GEMM (linear's layout suits bf16 kernels better), mu in fp32
                o.copy_(torch.nn.functional.linear(X.to(self._dt), Uc)).add_(muU, alpha=beta)
        if self._track is not None:                     # whole payload, raw values included (see track)
            self._track[1].add_(out.dot(out))
        return out

    def decompress(self, payload: Tensor, seg: slice) -> Tensor:
        self.follow(payload)
        plan, total = self._plan(seg)
        if payload.numel() != total:
            raise ValueError(f"GradiVeQ.decompress: payload of {payload.numel()} for {total} expected")
        payload = payload.reshape(-1).to(torch.float32)
        if self.path(payload.device) != kernels_.HOST:
            return self._batched_plan(seg, payload.device).decompress(payload)
        out = torch.empty(seg.stop - seg.start, dtype=torch.float32, device=payload.device)
        for p, off in plan:
            a, b = p.start - seg.start, p.stop - seg.start
            if p.gid < 0:
                out[a:b].copy_(payload[off: off + b - a])
                continue
            Ud, n = self._Ud[p.gid], p.i1 - p.i0
            P = payload[off: off + n * Ud.shape[1]].view(n, Ud.shape[1])
            mu, o = self.pca.mu[p.gid][p.i0:p.i1], out[a:b].view(n, Ud.shape[0])
            if self._dt == torch.float32:   # one GEMM, mu folded in, straight into the flat gradient
                torch.addmm(mu, P, Ud.T if self._fold[p.gid] else self._Uc[p.gid], out=o)
            else:
                torch.add(mu, torch.nn.functional.linear(P.to(self._dt), Ud), out=o)
        return out

    # -- monitors ------------------------------------------------------------------------------------
    # U_d has orthonormal columns, so the Eq. 7 residual of c = g - mu/N is ||c||^2 - ||U_d^T c||^2, and
    # U_d^T c is exactly the payload Eq. 3 sends: the loss costs a few dot products instead of a
    # projection and a reconstruction (each of which streams all the bases again).  Over the whole
    # vector, raw values appear in both terms (mu is 0 there, the payload is the value) and cancel.
    # With basis_dtype=bfloat16 the payload is rounded, so the loss is good to ~1e-3 absolute.
    def track(self, g_flat: Tensor | None, seg: slice | None = None) -> None:
        """Start measuring Eq. 7 on ``g_flat`` (this rank's gradient, or its part ``seg`` of the layout: a
        hierarchical ring's shard, which the following :meth:`compress` calls must cover exactly once, as
        the ring does); ``None`` stops.  The sums stay on the gradient's device until :meth:`tracked_sums`
        reads them: no host sync inside a codec call."""
        if g_flat is None:
            self._track = None
            return
        self._need_fit()
        self.follow(g_flat)
        g_flat = g_flat.reshape(-1).to(torch.float32)
        seg = slice(0, self.layout.numel) if seg is None else seg
        c = torch.add(g_flat, self._mu_flat[seg], alpha=-1.0 / self.world_size)
        # ||g||^2 over compressed slices: the squared gradient weighted by the mask of grouped positions
        compressed2 = torch.dot(g_flat * g_flat, self._grouped[seg])
        self._track = torch.stack([c.dot(c), torch.zeros_like(compressed2), compressed2])

    _track: Tensor | None = None

    def tracked_sums(self) -> Tensor:
        """The three sums :func:`relative_loss` divides, on the gradient's device (no host sync: summed
        over an iteration's buckets, they are read once, for the loss of their union)."""
        if self._track is None:
            raise RuntimeError("GradiVeQ.tracked_sums: call track(g) and compress g first")
        return self._track.clone()

    def own_residual(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        """``x - (U_d U_d^T (x - mu/N) + mu/N)``: what this rank's own payload of ``x`` (a whole vector in
        this codec's layout) leaves out, 0 on raw slices; error feedback's memory.  One compress and one
        decompress of ``x`` (a sum's decoding adds all of mu, one rank's share is mu/N), then two ops, written
        into ``out`` where given (the memory itself: no copy)."""
        self._need_fit()
        self.follow(x)
        whole = slice(0, x.numel())
        rebuilt = self.decompress(self.compress(x, whole), whole)
        return torch.sub(x, rebuilt, out=out).add_(self._mu_flat, alpha=1.0 - 1.0 / self.world_size)

    def _relative(self, g_flat: Tensor, aggregate: bool) -> float:
        self._need_fit()
        self.follow(g_flat)
        pca = self.pca
        g_flat = g_flat.reshape(-1).to(torch.float32)
        scale = 1.0 if aggregate else 1.0 / self.world_size
        err = den = 0.0
        for g, U, mu in zip(self.groups, pca.U, pca.mu):
            c = g_flat[g.start: g.stop].view(g.n, g.K) - mu * scale
            p = c @ U                                    # float32 bases: exact up to float round-off
            err += float(c.reshape(-1).dot(c.reshape(-1))) - float(p.reshape(-1).dot(p.reshape(-1)))
            x = g_flat[g.start: g.stop]
            den += float(x.dot(x))
        return max(err, 0.0) / den if den > 0 else 0.0

    def local_loss(self, g_flat: Tensor) -> float:
        """Eq. 7 on this rank's gradient over compressed slices: ||g_n - (U_d g'_n + mu/N)||^2 / ||g_n||^2."""
        return self._relative(g_flat, aggregate=False)

    def compression_error(self, g_flat: Tensor) -> float:
        """||U_d U_d^T (g - mu) + mu - g||^2 / ||g||^2 over compressed slices, g an aggregate (sum)."""
        return self._relative(g_flat, aggregate=True)

    def layer_stats(self) -> list[dict]:
        """Per group: layer (parameter index), shape, group, slices, K, d, ratio K/d, energy, tail."""
        pca = self._need_fit()
        return [{"layer": g.layer, "shape": g.shape, "group": g.gid, "slices": g.n, "K": g.K,
                 "d": int(U.shape[1]), "ratio": g.K / U.shape[1], "energy": e, "tail": g.tail}
                for g, U, e in zip(self.groups, pca.U, pca.energy)]

    @property
    def mean_ratio(self) -> float:
        """Mean of K/d over all compressed slices (nan before fit or without compressed slices)."""
        if not self.fitted or not self.groups:
            return float("nan")
        return sum(g.n * g.K / U.shape[1] for g, U in zip(self.groups, self.pca.U)) / sum(g.n for g in self.groups)

    def wire_ratio(self, numel: int) -> float:
        """Whole-vector fp32 bytes in / payload bytes out, raw parameters and tails included."""
        return self.ratio(numel)
