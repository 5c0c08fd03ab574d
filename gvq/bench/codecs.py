"""Codecs against their floor: ``python -m gvq.bench codecs [model=resnet32] [device=cpu|cuda]``.

Every compressor at a model's gradient size, one intra-op thread on the CPU: compress, decompress and,
for additive codecs, the payload sum a ring hop does, per call (median of ``reps``).  Beside each, the
floor: what the call cannot beat on this machine, from ceilings measured in the same run --

* ``gemm_gflops``: one-core matmul rate in the codec's dtype (a 1024 x 1024 fp32 / bf16 product);
* ``mem_gbps``: memory bandwidth (a 256 MB copy: bytes read + written per second);

and floor = max(multiply-adds x 2 / GEMM rate, bytes that must move / bandwidth), where the bytes are the
input, the payload, and what a codec streams from memory on every call (GradiVeQ's bases, PowerSGD's
Q and P matrices); scalar quantizers are bandwidth-bound (their arithmetic is a few operations a value).
Beside the times, ops and host syncs per call (``gvq.bench.opcount``: what a GPU pays a launch for; on the
host with ``kernels=torch`` they are the device path's), and the Triton kernels launched per call
(``gvq.compressors._kernels``: 0 where the codec takes the torch ops, as on the host).
``x_floor`` = time / floor: 1 is the hardware's limit, not an achievable target for a Python codec.
GradiVeQ is fitted once, before timing, as ``gvq.bench aggregate`` fits it (``prepare_benchmark``): on L_t
isotropic random samples, so d = L_t - 1 per layer at lambda 0.01 -- the paper's regime (d near L_t - 1;
ResNet-32: 45 M multiply-adds, 60 MB of fp32 bases) -- and the pooled settings' d = K / ratio (the fit's
time is not a per-call cost).  On CUDA every timed call is synchronised.
"""
from __future__ import annotations

import itertools

import torch

from gvq.bench import Progress
from gvq.bench.common import (
    make_aggregator,
    median_seconds,
    model_shapes,
    one_thread,
    print_markdown,
)
from gvq.bench.opcount import count_call
from gvq.bench.keys import CODECS
from gvq.bench.quantizers import laplace_vector
from gvq.compressors._kernels import count_launches
from gvq.compressors.gradiveq.codec import BASIS_DTYPES
from gvq.run.logs import write_json_atomic

#: label -> (option file in conf/aggregator/, overrides): the GradiVeQ settings the papers and docs/results.md use
GRADIVEQ = {"gradiveq": ("gradiveq", []), "gradiveq_bf16": ("gradiveq_bf16", []),
            "gradiveq_pooled": ("gradiveq_pooled", []),
            "gradiveq_pooled_bf16": ("gradiveq_pooled", ["aggregator.compressor.basis_dtype=bfloat16"])}
DEFAULT = list(CODECS)


def ceilings(device: torch.device, reps: int = 5) -> dict:
    """Measured on the running machine, now: GEMM GFLOP/s per dtype and copy bandwidth (GB/s, read + write)."""
    out = {}
    for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        a = torch.randn(1024, 1024, device=device).to(dt)
        out[f"gemm_gflops_{name}"] = 2 * 1024 ** 3 / median_seconds(lambda: torch.mm(a, a), reps, device) / 1e9
    src = torch.empty(64 << 20, device=device).fill_(1.0)          # 256 MB: past every cache
    dst = torch.empty_like(src)
    out["mem_gbps"] = 2 * src.numel() * 4 / median_seconds(lambda: dst.copy_(src), reps, device) / 1e9
    return out


def fitted_gradiveq(label: str, shapes, device: torch.device, L: int = 100, timed: bool = True):
    """The fitted compressor, its multiply-adds and streamed bytes per call, its dtype, and the fit's
    own time (a PCA refresh: seconds, median of 3, after one warm-up fit; ``timed=False``: None, one fit,
    for callers that only need the fitted codec)."""
    comp = make_aggregator(*GRADIVEQ[label]).compressor
    comp.world_size = 2
    comp.bind([tuple(s) for s in shapes])
    n = comp.layout.numel
    g = torch.Generator().manual_seed(0)
    samples = torch.randn(L, n, generator=g).to(device)    # isotropic: the paper's d near L_t - 1
    comp.fit(samples)
    fit_s = median_seconds(lambda: comp.fit(samples), 3, device) if timed else None
    ds = [comp.basis(g.gid)[0].shape[1] for g in comp.groups]
    macs = sum(g.n * g.K * d for g, d in zip(comp.groups, ds))
    streamed = sum(g.K * d for g, d in zip(comp.groups, ds)) * BASIS_DTYPES[comp.basis_dtype].itemsize
    return comp, macs, streamed, comp.basis_dtype, fit_s


def powersgd_state(shapes, device: torch.device):
    from gvq.compressors.powersgd import PowerSGD
    agg = make_aggregator("powersgd", [])
    state = PowerSGD(shapes, agg.rank, agg.min_compression_rate, agg.warm_start, kernels=agg.kernels)
    state.to(device)
    macs = sum(b.rows * b.cols * b.rank for b in state.blocks if b.rank)        # per pass
    streamed = 4 * sum((b.rows + b.cols) * b.rank for b in state.blocks if b.rank)
    return state, macs, streamed


def build_codec(name: str, shapes, device: torch.device):
    """The codec a row times, ready to call on the whole gradient: (codec, multiply-adds, streamed bytes,
    dtype, fit seconds)."""
    if name in GRADIVEQ:
        return fitted_gradiveq(name, shapes, device)
    if name == "powersgd":
        state, macs, streamed = powersgd_state(shapes, device)
        state.begin()
        return state.p_stage, macs, streamed, "float32", float("nan")  # pass P (M Q): the larger product
    # the codec the aggregator runs on this vector: told its tensors (CompressedAggregator.codec_for asks
    # Compressor.grouped), so per-tensor scopes and groups (top-k, EF-SignSGD, 1-bit) are timed as trained
    codec = make_aggregator(name, []).compressor.grouped([tuple(s) for s in shapes])
    return codec, 0, 0, "float32", float("nan")


class FirstCalls:
    """``compress`` as each iteration's first call on the vector: named anew (``begin_vector``, as the
    aggregator names it once per vector and iteration) before every call, so a codec that keeps an
    iteration's draws (random-k's positions) is timed drawing them, never a cache hit; for the others
    ``begin_vector`` is a no-op.  Timed together (the aggregator pays both per iteration); counted apart
    (:meth:`count`: ``begin_vector`` runs on the host, it launches nothing)."""

    def __init__(self, comp, x, seg):
        self.comp, self.x, self.seg, self.iteration = comp, x, seg, itertools.count(1)

    def renew(self) -> None:
        self.comp.begin_vector(0, next(self.iteration), 0)

    def __call__(self):
        self.renew()
        return self.comp.compress(self.x, self.seg)

    def count(self):
        return count_call(lambda: self.comp.compress(self.x, self.seg), before=self.renew)


def codec_ops(name: str, shapes) -> tuple[int, int]:
    """(compress ops, decompress ops) of one call on the whole gradient, on the device path (host tensors,
    the fused host kernels off): what a GPU launches."""
    comp = build_codec(name, shapes, torch.device("cpu"))[0]
    if name != "powersgd":          # its passes have no host kernels: the torch ops on the host already
        comp.kernels = "torch"      # before the first call, which chooses the path for good
    numel = sum(int(torch.Size(s).numel()) for s in shapes)
    x, seg = laplace_vector(numel), slice(0, numel)
    compress = FirstCalls(comp, x, seg)
    payload = compress()
    return (compress.count().ops, count_call(lambda: comp.decompress(payload, seg)).ops)


def measure_codec(name: str, shapes, device: torch.device, ceil: dict, reps: int) -> dict:
    """One codec's row: per-call times, the floor of its compress, and time / floor."""
    numel = sum(int(torch.Size(s).numel()) for s in shapes)
    x = laplace_vector(numel).to(device)
    seg = slice(0, numel)
    comp, macs, streamed, dtype, fit_s = build_codec(name, shapes, device)
    compress = FirstCalls(comp, x, seg)
    payload = compress()

    def decompress():
        return comp.decompress(payload, seg)
    row = {"codec": name, "numel": numel, "dtype": dtype, "payload_mb": payload.numel() * payload.element_size() / 1e6,
           "compress_ms": 1e3 * median_seconds(compress, reps, device),
           "decompress_ms": 1e3 * median_seconds(decompress, reps, device)}
    row["add_ms"] = 1e3 * median_seconds(lambda: payload + payload, reps, device) if comp.additive else float("nan")
    # the GPU's cost proxy, on any device: ops (each a launch + dispatch there) and host syncs per call
    for part, fn, tally in (("compress", compress, compress.count()),
                            ("decompress", decompress, count_call(decompress))):
        with count_launches() as kernels:          # Triton launches: the op counter does not see them
            fn()
        row[f"{part}_ops"], row[f"{part}_syncs"], row[f"{part}_launches"] = tally.ops, tally.syncs, kernels.launches
    moved = 4 * numel + payload.numel() * payload.element_size() + streamed
    row["floor_ms"] = 1e3 * max(2 * macs / (ceil[f"gemm_gflops_{dtype}"] * 1e9), moved / (ceil["mem_gbps"] * 1e9))
    row["x_floor"] = row["compress_ms"] / row["floor_ms"]
    row["fit_s"] = fit_s
    return row


def bench_codecs(cfg, paths) -> list[dict]:
    """``python -m gvq.bench codecs``: every codec per call against its floor, with its ops and launches."""
    from gvq.schema.tool import namespace
    args = namespace(cfg, paths)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(args.device)
    with one_thread():
        ceil = ceilings(device)
        shapes = model_shapes(args.model, args.num_classes)
        rows, shown = [], Progress("codecs", len(args.codecs))
        for name in args.codecs:
            rows.append(measure_codec(name, shapes, device, ceil, args.reps))
            shown.done(f"{name} on {device.type}")
    setting = ", ".join(f"{k} {v:.1f}" for k, v in ceil.items())
    print_markdown(rows, ["codec", "dtype", "payload_mb", "compress_ms", "decompress_ms", "add_ms", "floor_ms",
                          "x_floor", "compress_ops", "compress_launches", "compress_syncs", "decompress_ops",
                          "decompress_launches", "decompress_syncs", "fit_s"],
                   f"codecs per call, {args.model} gradient ({sum(int(torch.Size(s).numel()) for s in shapes):,} "
                   f"values), {device.type}, 1 thread, median of {args.reps}; floor of compress from {setting}")
    if args.out:
        write_json_atomic(args.out, {"ceilings": ceil, "rows": rows}, indent=1)
    return rows
