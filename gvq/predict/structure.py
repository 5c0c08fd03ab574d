"""What each aggregator's ring sends at N ranks, read off the real code: its rounds (PowerSGD has two),
the kind of ring (:mod:`gvq.comm.ring`'s plain, re-encode, additive, allgather, ps) and, per segment, its
pieces' gradient values and payload bytes (``payload_spec``), from the segment functions the
aggregators themselves call.  Built once per model by ``calibrate`` (GradiVeQ needs a fitted basis)."""
from __future__ import annotations

import torch

from gvq.aggregators.base import RunContext, equal_segments
from gvq.aggregators.compressed import CompressedAggregator
from gvq.aggregators.gradiveq import GradiVeQAggregator
from gvq.aggregators.gradiveq_sync import payload_balanced_segments
from gvq.aggregators.powersgd import PowerSGDAggregator
from gvq.compressors.base import split_on_cuts
from gvq.compressors.powersgd import block_balanced_segments

AGGREGATORS = ("rar", "fp16", "qsgd", "gradiveq_bf16", "powersgd")
SETTINGS = ["K=x1", "gradiveq_bf16:aggregator.compressor.pool=true",   # make bench's: K/d = 8, PowerSGD r6
            "gradiveq_bf16:aggregator.compressor.target_ratio=8", "powersgd:aggregator.rank=6"]


def structure_ns() -> list[int]:
    """World sizes stored: every N to 16, then doubling to 1024 (and the paper's 6 among them)."""
    return list(range(2, 17)) + [24, 32, 48, 64, 128, 256, 512, 1024]


def build_on_one_rank(name: str, model: str, num_classes: int, settings=SETTINGS):
    """The aggregator ``name`` (with ``settings``; make bench's by default) set up on one rank of
    ``model``'s gradient, GradiVeQ fitted as ``gvq.bench`` fits it; returns (aggregator, numel)."""
    from gvq.bench.common import build_model, make_aggregator
    net = build_model(model, num_classes, 1 if model == "cnn" else 3)
    params = [p for p in net.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    agg = make_aggregator(name, list(settings))
    agg.setup(params, RunContext(rank=0, world_size=1))
    agg.prepare_benchmark([p.grad.clone() for p in params])
    return agg, sum(p.numel() for p in params)


def _nbytes(comp, q: slice) -> int:
    dtype, n = comp.payload_spec(q)
    return n * torch.empty(0, dtype=dtype).element_size()


def _round(kind: str, key: str, comp, segs: list) -> dict:
    segs = [[s] if isinstance(s, slice) else list(s) for s in segs]
    return {"kind": kind, "key": key, "codec": comp, "segs": segs,
            "vals": [[q.stop - q.start for q in seg] for seg in segs],
            "bytes": [[(q.stop - q.start) * 4 if comp is None else _nbytes(comp, q) for q in seg] for seg in segs]}


def stored(rnds: list[dict]) -> list[dict]:
    """Rounds as ``structure.json`` and ``overlap.json`` keep them: without the codec and the slices."""
    return [{k: v for k, v in r.items() if k not in ("codec", "segs")} for r in rnds]


def rounds(name: str, agg, numel: int, n: int) -> list[dict]:
    """The rings aggregator option ``name`` runs at ``n`` ranks, in order (see the module docstring);
    each round's ``key`` names its codec's costs in the calibration."""
    if isinstance(agg, GradiVeQAggregator):
        comp = agg.compressor
        return [_round("additive", name, comp, payload_balanced_segments(comp, numel, n, agg.pieces))]
    if isinstance(agg, PowerSGDAggregator):
        low, by = agg.low_rank, block_balanced_segments
        return [_round("additive", f"{name}-P", low.p_stage, by(low.blocks, lambda b: b.p_len, n)),
                _round("additive", f"{name}-Q", low.q_stage, by(low.blocks, lambda b: b.q_len, n))]
    if isinstance(agg, CompressedAggregator):
        comp = agg.compressor
        if agg.topology != "ring":
            return [_round(agg.topology, name, comp, [[slice(0, numel)]])]
        kind = "additive" if agg.sum_hop else "reencode"
        return [_round(kind, name, comp, split_on_cuts(comp.cuts(numel), n))]
    return [_round("plain", name, None, equal_segments(numel, n))]


def bucket_rounds(name: str, agg, params: list[int], n: int) -> list[dict]:
    """The rings one DDP bucket holding ``params`` (positions in model order) runs at ``n`` ranks, as the
    aggregator's per-bucket path builds them (the hook averages a bucket's parameters sorted)."""
    params = sorted(params)
    numel = sum(agg.params[i].numel() for i in params)
    if isinstance(agg, GradiVeQAggregator):
        codec = agg.compressor.restricted_to(params)
        return [_round("additive", name, codec, payload_balanced_segments(codec, codec.layout.numel, n, agg.pieces))]
    if isinstance(agg, PowerSGDAggregator):
        low, by = agg.low_rank.subset(params), block_balanced_segments
        return [_round("additive", f"{name}-P", low.p_stage, by(low.blocks, lambda b: b.p_len, n)),
                _round("additive", f"{name}-Q", low.q_stage, by(low.blocks, lambda b: b.q_len, n))]
    return rounds(name, agg, numel, n)
