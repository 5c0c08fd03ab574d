"""DGC's ``triton`` path (:mod:`._kernels`; its kernels in :mod:`._triton_dgc`), set up and launched here
through ``_kernels.launch_kernel``: compress is 2 launches (a program per sparse scope: the sampled
threshold, the ten tries counted in one pass, top-k's select on the candidates; a program per run of at
most ``RUN`` values: the dense parts copied out, each run summed for the health check), decompress 2 (the
dense parts back and zeros elsewhere, then top-k's scatter).  No host read, and a program per scope or
run whatever the depth; the tables are constants of the layout, made once per ratio, segment and
device.  The payload is the torch path's, its slots in index order (the torch path writes them best
first): either path decodes either's.  Triton is optional: nothing here imports it until a kernel runs."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gvq.compressors._kernels import launch_kernel, triton_pow2

RUN = 4096               # values a dense program copies (or sums); runs never straddle two tensors
MAX_BLOCK = 2048         # values a select program loads at once (its scope looped over in blocks)
SAMPLE_BLOCK = 512       # sampled values a threshold search loads at once
COUNT_BLOCK = 256        # values the tries' count loads at once (x 16 tries: a (16, COUNT_BLOCK) compare)


def _dgc_kernels():
    from gvq.compressors import _triton_dgc      # imports triton: only once a kernel runs
    return _triton_dgc


def tables(codec, plan, device, low: float, shrink: list[float]) -> dict:
    """``scopes`` (9, S) int64: each sparse scope's start in the segment, length, k, first slot, sample
    count, stride, threshold rank, ceil(0.8 k) and whether k is its length; ``runs`` (3, R) int64: each
    run's start, length and first dense slot (-1: sparse); the tries' factors 0.8^j (float32, the torch
    path's: ``shrink``); and the select's block.  ``low``: a try is kept once it selects ceil(low k)."""
    tk, lengths, counts, ranks = codec.scope_samples(plan)
    starts = [int(plan.sparse[a]) for a in tk.starts]       # each sparse tensor is one run of the segment
    firsts = [sum(tk.ks[:i]) for i in range(len(tk.ks))]
    rows = [starts, lengths, tk.ks, firsts, counts, [m // c for m, c in zip(lengths, counts)], ranks,
            [math.ceil(low * k) for k in tk.ks], [int(k >= m) for m, k in zip(lengths, tk.ks)]]
    runs, slot = [], 0
    for start, length, dense in plan.pieces:                # once per layout, never per call
        for at in range(0, length, RUN):
            runs.append((start + at, min(RUN, length - at), slot + at if dense else -1))
        slot += length if dense else 0
    long = dict(dtype=torch.int64, device=device)
    return {"scopes": torch.tensor(rows, **long).reshape(9, len(tk.ks)),
            "runs": torch.tensor(runs, **long).reshape(-1, 3).t().contiguous(),
            "shrink": torch.tensor(shrink, dtype=torch.float32, device=device),
            "block": min(MAX_BLOCK, triton_pow2(max(lengths, default=1)))}


def dgc_compress(codec, x: Tensor, seg: slice) -> Tensor:
    """``DGC.compress``'s payload of ``x`` (the segment's values, flat, any float dtype): 2 launches."""
    plan, t = codec.plan(seg), codec.triton_tables(seg, x.device)
    ib, scopes, runs = plan.inner_bytes, t["scopes"].shape[1], t["runs"].shape[1]
    k = ib // 8
    out = torch.empty(codec.payload_spec(seg)[1], dtype=torch.uint8, device=x.device)  # fresh: may be in flight
    sums = torch.empty(runs, dtype=torch.float32, device=x.device)      # fresh: noted until the check
    if scopes:
        launch_kernel(_dgc_kernels().dgc_select, (scopes,), x, t["scopes"], t["shrink"], out[: 4 * k].view(torch.int32),
                      out[4 * k: ib].view(torch.float32), scopes, codec.key, BLOCK=t["block"],
                      SAMPLE=SAMPLE_BLOCK, COUNT=COUNT_BLOCK)
    launch_kernel(_dgc_kernels().dense_out, (runs,), x, t["runs"], out[ib:].view(torch.float32), sums, runs, BLOCK=RUN)
    codec.health.note(sums)
    return out


def dgc_decompress(codec, payload: Tensor, seg: slice) -> Tensor:
    """Inverse of :func:`dgc_compress` (and of the torch path's payloads, any slot order): 2 launches."""
    from gvq.compressors import _triton_topk                 # imports triton: only once a kernel runs
    plan, t = codec.plan(seg), codec.triton_tables(seg, payload.device)
    payload = payload.clone() if payload.storage_offset() % 4 else payload     # its words 4-byte aligned
    ib, scopes, runs = plan.inner_bytes, t["scopes"].shape[1], t["runs"].shape[1]
    k = ib // 8
    out = torch.empty(plan.n, dtype=torch.float32, device=payload.device)
    if runs:
        launch_kernel(_dgc_kernels().dense_in, (runs,), payload[ib:].view(torch.float32), t["runs"], out, runs,
                      BLOCK=RUN)
    if scopes:
        launch_kernel(_triton_topk.topk_scatter, (scopes,), payload[: 4 * k].view(torch.int32),
                      payload[4 * k: ib].view(torch.float32), t["scopes"], out, scopes, BITS=1, PACKED=False,
                      BLOCK=256)
    return out
