"""GradiVeQ's device path: one segment's compress or decompress as a fixed few whole-tensor ops, whatever
the number of layers, groups or pieces (``GradiVeQ.compress`` takes it wherever the fused host path does
not serve: CUDA, meta, ``kernels=torch``), its last step on the path the codec chose (``LAY_OUT``).

A segment is raw runs and runs of slices of PCA groups (``layout.pieces``).  The groups of one slice size
K form a *class*; ResNets have a handful of classes whatever their depth.  Per class the pieces are one
batch: slices padded to the class's most (``n``) and bases padded with zero columns to its largest ``d``,
so a class is one batched GEMM.  Everything that depends only on the segment and the fit is built once
per plan (gather indices, padded bases, each piece's mu and mu U_d, the work buffers and their views); a
call is then: gather the slices (one ``index_select``), one GEMM per class (mu folded in), and one
``index_select`` that lays the payload (or the gradient) out from the GEMMs' results and the raw values.
Padding rows produce values no index reads; padding columns multiply zero rows of the bases.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gvq.compressors._graphs import Graphed
from gvq.compressors._kernels import TORCH, Op, launch_kernel

#: where a plan's index bookkeeping is built (once per segment and fit, element by element), before its
#: finished indices move to the gradient's device in one copy each
HOST = torch.device("cpu")
LAY_OUT_BLOCK = 1024      # values a program of the Triton path's gather lays out


class _Class:
    """One slice size's pieces as a batch: (B, n, K) slices against (B, K, d) bases."""

    def __init__(self, pieces, U, mu, muU, seg_start: int, device, dtype):
        self.B = len(pieces)
        self.K = U[pieces[0][0].gid].shape[0]
        self.n = max(p.i1 - p.i0 for p, _ in pieces)
        self.d = max(U[p.gid].shape[1] for p, _ in pieces)
        B, n, K, d = self.B, self.n, self.K, self.d
        self.U = torch.zeros(B, K, d, dtype=dtype, device=device)
        self.mu = torch.zeros(B, n, K, device=device)
        self.muU = torch.zeros(B, n, d, device=device)
        self.x_at = torch.zeros(B, n, K, dtype=torch.int64, device=HOST)   # where each slice value sits in x
        self.p_at = torch.zeros(B, n, d, dtype=torch.int64, device=HOST)   # where each payload value sits
        self.sizes = [(p.i1 - p.i0, U[p.gid].shape[1]) for p, _ in pieces]
        for b, (p, off) in enumerate(pieces):
            m, dg = self.sizes[b]
            self.U[b, :, :dg] = U[p.gid].to(device=device, dtype=dtype)
            self.mu[b, :m] = mu[p.gid][p.i0: p.i1].to(device)
            self.muU[b, :m, :dg] = muU[p.gid][p.i0: p.i1].to(device)
            self.x_at[b, :m] = (p.start - seg_start) + torch.arange(m * K, device=HOST).view(m, K)
            self.p_at[b, :m, :dg] = off + torch.arange(m * dg, device=HOST).view(m, dg)

    @property
    def coded(self) -> int:
        return self.B * self.n * self.d

    @property
    def values(self) -> int:
        return self.B * self.n * self.K


class BatchedPlan:
    """One segment's compress / decompress on ``device``, built once per (segment, fit)."""

    def __init__(self, plan, total: int, seg: slice, U, mu, muU, world_size: int, dtype, device,
                 path: str = TORCH):
        self.dtype, self.beta, self.total = dtype, -1.0 / world_size, total
        self.path = path              # the codec's (``_kernels.choose_path``): Triton lays results out in a kernel
        length = seg.stop - seg.start
        by_K: dict[int, list] = {}
        for p, off in plan:
            if p.gid >= 0:
                by_K.setdefault(U[p.gid].shape[0], []).append((p, off))
        self.classes = [_Class(ps, U, mu, muU, seg.start, device, dtype) for ps in by_K.values()]
        coded = sum(c.coded for c in self.classes)
        values = sum(c.values for c in self.classes)
        # compress: x's slices gathered into one buffer; the GEMMs write a source [results | x] that one
        # gather lays out as the payload.  decompress: the payload's codes gathered; the GEMMs write a
        # source [reconstructions | payload] that one gather lays out as the gradient.
        none = [torch.zeros(0, dtype=torch.int64, device=HOST)]
        self.x_idx = torch.cat([c.x_at.view(-1) for c in self.classes] or none)
        self.p_idx = torch.cat([c.p_at.view(-1) for c in self.classes] or none)
        pay_idx = torch.empty(total, dtype=torch.int64, device=HOST)
        out_idx = torch.empty(length, dtype=torch.int64, device=HOST)
        at_r, at_y = 0, 0
        for c in self.classes:
            r = at_r + torch.arange(c.coded, device=HOST).view(c.B, c.n, c.d)
            y = at_y + torch.arange(c.values, device=HOST).view(c.B, c.n, c.K)
            for b, (m, dg) in enumerate(c.sizes):                # real slices and codes of piece b
                pay_idx[c.p_at[b, :m, :dg].reshape(-1)] = r[b, :m, :dg].reshape(-1)
                out_idx[c.x_at[b, :m].reshape(-1)] = y[b, :m].reshape(-1)
            at_r, at_y = at_r + c.coded, at_y + c.values
        for p, off in plan:
            if p.gid < 0:
                a, w = p.start - seg.start, p.stop - p.start
                pay_idx[off: off + w] = coded + a + torch.arange(w, device=HOST)
                out_idx[a: a + w] = values + off + torch.arange(w, device=HOST)
        self.pay_idx, self.out_idx = pay_idx.to(device), out_idx.to(device)
        self.x_idx, self.p_idx = self.x_idx.to(device), self.p_idx.to(device)
        self._buffers(coded, values, length, device)
        # fixed shapes and buffers until the next refit, no randomness: each call one CUDA graph replay
        self.compress = Graphed(self._compress, "gradiveq compress")
        self.decompress = Graphed(self._decompress, "gradiveq decompress")

    def _buffers(self, coded: int, values: int, length: int, device) -> None:
        """Work buffers and their per-class views, made once: a call dispatches no view."""
        dt = self.dtype
        self.xbuf = torch.empty(values, dtype=dt, device=device)
        self.pbuf = torch.empty(coded, dtype=dt, device=device)
        self.src = torch.empty(coded + length, device=device)          # [codes | raw x]
        self.src2 = torch.empty(values + self.total, device=device)    # [values | payload]
        self.src_x, self.src2_p = self.src[coded:], self.src2[values:]
        self.src_r, self.src2_y = self.src[:coded], self.src2[:values]
        low = dt != torch.float32                                       # bf16: GEMMs into their own buffers
        self.rbuf = torch.empty(coded, dtype=dt, device=device) if low else self.src_r
        self.ybuf = torch.empty(values, dtype=dt, device=device) if low else self.src2_y
        self.views, at_r, at_y = [], 0, 0
        for c in self.classes:
            self.views.append((self.xbuf[at_y: at_y + c.values].view(c.B, c.n, c.K),
                               self.rbuf[at_r: at_r + c.coded].view(c.B, c.n, c.d),
                               self.pbuf[at_r: at_r + c.coded].view(c.B, c.n, c.d),
                               self.ybuf[at_y: at_y + c.values].view(c.B, c.n, c.K),
                               c.U.transpose(1, 2)))
            at_r, at_y = at_r + c.coded, at_y + c.values
        if low:                                                         # mu in fp32, after the GEMMs
            none = [torch.zeros(0, device=device)]
            self.muU_flat = torch.cat([c.muU.view(-1) for c in self.classes] or none)
            self.mu_flat = torch.cat([c.mu.view(-1) for c in self.classes] or none)

    def _compress(self, x: Tensor) -> Tensor:
        low = self.dtype != torch.float32
        torch.index_select(x.to(self.dtype) if low else x, 0, self.x_idx, out=self.xbuf)
        for c, (X, R, _, _, _) in zip(self.classes, self.views):
            if low:
                torch.bmm(X, c.U, out=R)
            else:                                   # X U - (mu U) / N  (Eq. 3), into the source
                torch.baddbmm(c.muU, X, c.U, beta=self.beta, out=R)
        return LAY_OUT(self.path, self, x, True)

    def _decompress(self, payload: Tensor) -> Tensor:
        low = self.dtype != torch.float32
        torch.index_select(payload.to(self.dtype) if low else payload, 0, self.p_idx, out=self.pbuf)
        for c, (_, _, P, Y, Ut) in zip(self.classes, self.views):
            if low:
                torch.bmm(P, Ut, out=Y)
            else:                                   # P U^T + mu, into the source
                torch.baddbmm(c.mu, P, Ut, out=Y)
        return LAY_OUT(self.path, self, payload, False)

    def lay_out_torch(self, raw: Tensor, forward: bool) -> Tensor:
        """After the GEMMs, the payload (``forward``: compress) or the gradient: the raw values (``raw``, the
        call's input) copied into the source beside the results, the mean term added (bf16 bases), one gather."""
        low = self.dtype != torch.float32
        if forward:
            if low:
                self.src_r.copy_(self.rbuf).add_(self.muU_flat, alpha=self.beta)
            self.src_x.copy_(raw)
            return self.src.index_select(0, self.pay_idx)
        if low:
            self.src2_y.copy_(self.ybuf).add_(self.mu_flat)
        self.src2_p.copy_(raw)
        return self.src2.index_select(0, self.out_idx)

    def lay_out_triton(self, raw: Tensor, forward: bool) -> Tensor:
        """:meth:`lay_out_torch` as one launch (``_triton_lowrank.lay_out``) reading the GEMMs' results and
        ``raw`` at the source positions ``pay_idx`` or ``out_idx`` number."""
        from gvq.compressors import _triton_lowrank as k     # imports triton: only once a kernel runs
        low = self.dtype != torch.float32
        res, idx = (self.rbuf, self.pay_idx) if forward else (self.ybuf, self.out_idx)
        mu = (self.muU_flat if forward else self.mu_flat) if low else None
        beta = self.beta if forward else 1.0
        n = idx.numel()
        out = torch.empty(n, device=raw.device)             # fresh: the ring may still be sending the last one
        if n:
            launch_kernel(k.lay_out, (-(-n // LAY_OUT_BLOCK),), res, res if mu is None else mu, raw, idx, out, n,
                          res.numel(), beta, ADD_MU=mu is not None, BLOCK=LAY_OUT_BLOCK)
        return out


#: the step after a call's GEMMs, per path (``_kernels.Op``): the torch reference, and Triton's one launch
LAY_OUT = Op(torch=BatchedPlan.lay_out_torch, triton=BatchedPlan.lay_out_triton)
