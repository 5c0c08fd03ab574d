"""Top-k's selection plan and its ranking ops (:mod:`gvq.compressors.topk`, ``topk_chunk``, DGC's
re-selection): a segment's scopes laid out as rows, the fixed tensors each layout needs, and the two-stage
rank of a row's keys.  The plan is a function of (segment, layout, knobs) only, so a receiver sizes its
buffer from it; the constants are made once per layout and device, never per call.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch import Tensor

LOW31 = (1 << 31) - 1
MAX_BATCHES = 24       # lengths (past SHORT) batched apiece; past it powers of two: a fixed few whatever the layout
SHORT = 1024           # scopes up to this long share one batch; larger => fewer batches, more padding
MAX_BLOCK = 64         # a first stage's block (see rank_rows); larger => fewer blocks to rank, more candidates


@dataclass
class Plan:
    """One segment's selection, fixed by its length and layout: where the scopes start, k of each, and
    the positions the selection keeps."""
    n: int
    starts: list[int]          # each scope's first value, relative to the segment
    ks: list[int]              # values kept per scope
    rows: int                  # > 0: equal scopes (the last may be shorter), the vector's own rows
    bits: int                  # packed index width: ceil(log2 of the longest scope)
    batches: list[tuple[int, int, int, int]] = field(default_factory=list)   # (rows, width, k, block) each

    @property
    def k(self) -> int:
        return sum(self.ks)


def block_of(width: int, k: int) -> int:
    """The block of a row of ``width`` keeping ``k``: the largest power of two up to MAX_BLOCK whose k blocks
    hold at most a quarter of the row; 1 (rank every value at once) where that is under 4."""
    block = 1
    while 2 * block <= MAX_BLOCK and 4 * k * 2 * block <= width:
        block *= 2
    return block if block >= 4 else 1


def batched(lengths: list[int]) -> dict[int, list[int]]:
    """Row width -> the scopes ranked in rows of that width: the short ones (biases, norms) in one batch
    padded to the longest of them (each batch costs a few ops), the rest one batch per length (a model
    repeats a few), or per power of two where those are more than MAX_BATCHES."""
    exact = len({length for length in lengths if length > SHORT}) <= MAX_BATCHES
    short = [s for s, length in enumerate(lengths) if length <= SHORT]
    out: dict[int, list[int]] = {max(lengths[s] for s in short): short} if short else {}
    for s, length in enumerate(lengths):
        if length > SHORT:
            out.setdefault(length if exact else 1 << (length - 1).bit_length(), []).append(s)
    return dict(sorted(out.items()))


def plan_rows(n: int, scopes: list[tuple[int, int]], ks: list[int]) -> Plan:
    """The plan of a segment of ``n`` values cut into ``scopes`` (start, length), keeping ``ks`` of each:
    equal runs are the vector's own rows; unequal ones go in :func:`batched` row-batches."""
    lengths = [length for _, length in scopes]
    width = lengths[0] if lengths else 0
    equal = all(length == width for length in lengths[:-1]) and (not lengths or lengths[-1] <= width)
    longest = max(lengths, default=1)
    plan = Plan(n, [a for a, _ in scopes], ks, len(scopes) if equal else 0, max(1, (longest - 1).bit_length()))
    if plan.rows:                         # one batch; blocks must tile its rows (one row: pad its tail)
        block = block_of(width, plan.ks[0])
        block = block if plan.rows == 1 or width % block == 0 else 1
        plan.batches.append((plan.rows, -(-width // block) * block, plan.ks[0], block))
    else:
        for w, members in batched(lengths).items():
            top = max(plan.ks[s] for s in members)
            block = block_of(w, top)
            plan.batches.append((len(members), -(-w // block) * block, top, block))
    return plan


def constants(plan: Plan, device) -> dict[str, Tensor]:
    """The plan's fixed tensors on ``device``: each kept slot's scope start, the tie-breaks (``ramp``:
    the larger the lower a column), a block's offsets (``lanes``) and the row-batches' gathers."""
    lengths = [b - a for a, b in zip(plan.starts, plan.starts[1:] + [plan.n])]
    ar = functools.partial(torch.arange, device=device)
    long = functools.partial(torch.tensor, dtype=torch.long, device=device)
    slot_scope = torch.repeat_interleave(ar(len(plan.ks)), long(plan.ks), output_size=sum(plan.ks))
    widest = max(width for _, width, _, _ in plan.batches)
    c = {"slot_start": long(plan.starts)[slot_scope], "ramp": LOW31 - ar(widest), "lanes": ar(MAX_BLOCK)}
    if plan.rows:                       # each row's first k (the best first), the last row's maybe fewer
        c["kept"] = torch.cat([ar(k) + i * plan.ks[0] for i, k in enumerate(plan.ks)])
    else:
        c.update(_batch_constants(plan, lengths, device))
    return c


def _batch_constants(plan: Plan, lengths: list[int], device) -> dict[str, Tensor]:
    """Unequal scopes' row-batches: ``src``, each row slot's position in the segment; ``pads``, the slots
    past a row's scope (set to -1: their keys are negative and lose); per kept slot (scope order, best
    first), ``kept`` its column among the batches' topk outputs and ``base`` its row's first slot."""
    ar = functools.partial(torch.arange, device=device)
    full = functools.partial(torch.full, dtype=torch.long, device=device)
    src, pads, kept, base = ([None] * len(lengths) for _ in range(4))
    at = out_at = 0
    for (rows, width, top, _), members in zip(plan.batches, batched(lengths).values()):
        for row, s in enumerate(members):         # once per layout, never per call
            src[s] = torch.cat([ar(lengths[s]) + plan.starts[s], full((width - lengths[s],), 0)])
            pads[s] = ar(lengths[s], width) + at + row * width
            kept[s] = ar(plan.ks[s]) + out_at + row * top
            base[s] = full((plan.ks[s],), at + row * width)
        at, out_at = at + rows * width, out_at + rows * top
    order = [s for members in batched(lengths).values() for s in members]    # batch order
    return {"src": torch.cat([src[s] for s in order]), "pads": torch.cat(pads), "kept": torch.cat(kept),
            "base": torch.cat(base)}


def _keys(bits: Tensor, tie: Tensor) -> Tensor:
    """Unique int64 keys: |v|'s float32 bits above ``tie`` (larger for a lower index)."""
    return torch.add(tie, bits.to(torch.int64), alpha=1 << 32)     # int64 first: a mixed-dtype add is slow


def rank_rows(bits: Tensor, top: int, block: int, c: dict[str, Tensor]) -> Tensor:
    """Each row's ``top`` largest keys' columns, the largest first.  Blocked: the ``top`` blocks of largest
    maximum (ties to the lower block) hold every one of them -- a value of the row's top k whose block lost
    would be beaten by the k winning blocks' maxima -- so only those blocks' values are ranked exactly."""
    rows, width = bits.shape
    if block == 1:
        return torch.topk(_keys(bits, c["ramp"][:width]), top, dim=1).indices
    best = bits.view(rows, width // block, block).amax(2)
    won = torch.topk(_keys(best, c["ramp"][: width // block]), top, dim=1, sorted=False).indices
    cand = (won.unsqueeze(2) * block + c["lanes"][:block]).reshape(rows, top * block)
    pick = torch.topk(_keys(bits.gather(1, cand), LOW31 - cand), top, dim=1).indices
    return cand.gather(1, pick)


def select(x: Tensor, plan: Plan, c: dict[str, Tensor]) -> Tensor:
    """The kept positions of ``x`` under ``plan``, relative to the segment (int64, scope order)."""
    if plan.rows:                           # equal runs: |v| in place, a tail of pads that lose
        rows, width, top, block = plan.batches[0]
        a = torch.empty(rows * width, dtype=torch.float32, device=x.device)
        torch.abs(x.detach().reshape(-1).to(torch.float32), out=a[: plan.n])
        a[plan.n:] = -1.0
        local = rank_rows(a.view(torch.int32).view(rows, width), top, block, c)
        return local.reshape(-1).index_select(0, c["kept"]) + c["slot_start"]
    # one new gradient-sized tensor, not two (|v|, then its gather): on one CPU core a fresh one costs its
    # page faults; index_select, not a[idx], is ~9x faster than advanced indexing on a gradient's length
    a = x.detach().reshape(-1).to(torch.float32).index_select(0, c["src"]).abs_()
    bits = a.index_fill_(0, c["pads"], -1.0).view(torch.int32)      # a pad's key is negative: it loses
    cols, at = [], 0
    for rows, width, top, block in plan.batches:    # a fixed few: one per scope length (or power of two)
        cols.append(rank_rows(bits[at: at + rows * width].view(rows, width), top, block, c).reshape(-1))
        at += rows * width
    return c["src"].index_select(0, torch.cat(cols).index_select(0, c["kept"]) + c["base"])
