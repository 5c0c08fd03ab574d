"""The baseline a practitioner runs in the GPU regime: torch DDP on NCCL (``python -m gvq.predict project
overlap=true baseline=nccl``, the default), which prices overlapped fp16 and ``ddp`` wherever compute is
scaled below x1.

DDP hands each bucket to NCCL, whose all-reduce runs on the GPU: no host core is shared with backward and
no message is posted from a host thread.  A bucket of ``v`` values costs the link's ring bound,
2(N-1)/N x its bytes x 8 / B + 2(N-1) x alpha (NCCL's ring: N-1 reduce-scatter and N-1 all-gather
steps, each paying the link's latency once), and, for the fp16 hook (``fp16_compress_hook``), its cast to
fp16 and back at the GPU's cost: the ``fp16`` row of ``gvq.bench codecs device=cuda`` files
(:data:`GPU_CODECS` by default, read as :func:`gvq.predict.codec_costs.line` reads any row; where none
exists, the calibration's own fp16 codec, said so).  The ``allreduce`` hook (``ddp``) sends fp32; its
division by N is one GPU kernel, left unpriced.  Buckets are DDP's defaults from ``overlap.json`` (fp16's:
DDP buckets by fp32 parameter bytes whatever the hook), each handed over when backward produces it, on a
lane that owes backward nothing (``replay_lanes`` with ``shared=False``); no non-finite check and no error
measurement (gvq's runner makes those, DDP does not).

``gvq_ring`` is the pricing before this baseline: overlapped fp16 as gvq's own ring on a host
communication thread sharing backward's core (2(N-1) posted messages a bucket), its codec at this host's
cost.  The CPU regime (compute x1) keeps it under either baseline: there DDP on gloo runs its collectives
on host threads too.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from gvq.predict import codec_costs
from gvq.predict import cost_model as M
from gvq.predict.overlap import BucketCost, Overlap, replay_lanes
from gvq.schema.tool import Arg

#: ``baseline`` choices and what each prices overlapped fp16 as in the GPU regime
BASELINES = {"nccl": "DDP on NCCL (ring bound on the link, off the host cores, GPU codec costs)",
             "gvq_ring": "gvq's ring on a host comm thread sharing backward's core, host codec costs"}


class Baseline(Enum):
    """What prices overlapped fp16 (and ddp) in the GPU regime (:data:`BASELINES`)."""
    nccl = "nccl"
    gvq_ring = "gvq_ring"
#: the gvq.bench codecs files measured on a GPU that price the fp16 hook's casts by default
GPU_CODECS = Path(__file__).resolve().parents[2] / "docs" / "gpu" / "h200-2026-11-27"
#: bytes a value travels as, per aggregator the baseline prices: the fp16 hook's and the allreduce hook's
WIRE_BYTES = {"fp16": 2, "ddp": 4}


def ring_seconds(nbytes: float, n: int, bps: float, alpha: float = 0.0) -> float:
    """NCCL's ring all-reduce of ``nbytes`` over ``n`` ranks at ``bps`` bit/s, ``alpha`` s a step."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * 8.0 * nbytes / bps + 2 * (n - 1) * alpha


@dataclass(frozen=True)
class GpuCodec:
    """The fp16 hook's two casts: [fixed s, s per value] each, and the file they come from."""
    compress: tuple[float, float]
    decompress: tuple[float, float]
    source: str

    def seconds(self, values: float) -> float:
        return self.compress[0] + self.decompress[0] + (self.compress[1] + self.decompress[1]) * values


def load_codec(path: Path = GPU_CODECS) -> GpuCodec | None:
    """The ``fp16`` row of the ``gvq.bench codecs`` files at ``path`` (None where there is none)."""
    if not Path(path).exists():
        return None
    rows = codec_costs.load_rows([Path(path)])
    row = rows.get("fp16")
    if row is None:
        return None
    c, d = (codec_costs.line(row, op) for op in ("compress", "decompress"))
    return GpuCodec(tuple(c), tuple(d), row["source"])


@dataclass(frozen=True)
class Nccl:
    """The ``nccl`` baseline: which cells it prices (:meth:`applies`) and how (:meth:`iteration`).
    ``codec``: the GPU's fp16 casts; None prices them at the calibration's own fp16 codec."""
    codec: GpuCodec | None = None
    alpha: float = 0.0
    name: str = "nccl"

    def applies(self, compute_scale: float) -> bool:
        """The GPU regime: compute scaled below this host's x1."""
        return compute_scale < 1.0

    def describe(self) -> str:
        root, src = GPU_CODECS.parents[2], Path(self.codec.source) if self.codec else None
        where = ("fp16 casts at this host's cost (no GPU file)" if src is None else
                 f"fp16 casts from {src.relative_to(root) if src.is_relative_to(root) else src}")
        return f"baseline in the GPU regime: nccl, {BASELINES['nccl']}; {where}"

    def cast_seconds(self, ov: Overlap, values: float) -> float:
        if self.codec is not None:
            return self.codec.seconds(values)
        key = next(r["key"] for rounds in ov.m.struct["aggregators"]["fp16"].values() for r in rounds
                   if r["kind"] != "plain")
        own = ov.m.cal["codecs"][key]
        return float(M.op_cost(own["compress"], values, 1.0) + M.op_cost(own["decompress"], values, 1.0))

    def bucket_costs(self, ov: Overlap, name: str, n: int, bps: float) -> tuple[list[float], list[BucketCost]]:
        """(ready share, cost) per DDP default bucket of aggregator ``name`` (``fp16`` or ``ddp``)."""
        numel, ready, costs = ov.m.struct["numel"], [], []
        for b in ov.ov["buckets"]["fp16"]["default"]:
            v = b["values"] * numel
            cast = self.cast_seconds(ov, v) if name == "fp16" else 0.0
            ready.append(max(ov.ov["profile"]["ready"][i] for i in b["params"]))
            costs.append(BucketCost(ring_seconds(WIRE_BYTES[name] * v, n, bps, self.alpha) + cast, 0.0))
        return ready, costs

    def iteration(self, ov: Overlap, name: str, n: int, bps: float, compute_scale: float) -> dict:
        """One overlapped iteration of DDP with ``name``'s hook on NCCL (the module docstring)."""
        ready, costs = self.bucket_costs(ov, name, n, bps)
        return replay_lanes(ov.phases(n, compute_scale), ready, costs, shared=False)


#: ``project``'s path to the files whose fp16 row prices the NCCL hook's casts (default: the H200's; none
#: there: this host's calibration)
BASELINE_CODEC_COSTS = Arg("--baseline-codec-costs", "baseline=nccl: gvq.bench codecs files whose fp16 row "
                           "prices the hook's casts (default: the H200's)", default=str(GPU_CODECS))


def from_args(args) -> Nccl | None:
    """The baseline ``baseline=`` asks for (None: ``gvq_ring``, the pricing before it)."""
    if args.baseline != "nccl":
        return None
    try:
        return Nccl(load_codec(args.baseline_codec_costs))
    except M.PredictError as e:
        raise M.PredictError(f"--baseline-codec-costs: {e}") from None
