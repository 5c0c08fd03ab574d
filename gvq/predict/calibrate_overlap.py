"""``python -m gvq.predict calibrate-overlap``: what the overlapped cost model needs beyond ``calibrate``;
writes ``overlap.json`` beside ``calibration.json``.

* DDP's buckets, formed as torch forms them when it rebuilds its buckets after the first iteration:
  parameters in the order backward produced their gradients, cut at DDP's default first bucket
  (:func:`gvq.comm.internals.ddp_first_bucket_bytes`) for the first bucket and ``bucket_cap_mb`` after it
  (no small first bucket once ``bucket_cap_mb`` is set, as ``aggregator.bucket_cap_mb`` sets it);
* backward timed apart from forward and the optimizer step, and when, within backward, each
  parameter's gradient was produced (a hook per parameter, CPU time of the one thread): a bucket is
  ready when its last gradient is;
* per bucket, its share of the whole gradient's values and its own rings at every stored N, as the
  aggregator declares them (:func:`gvq.predict.structure.bucket_rounds`): the model
  replays a bucket's own pieces;
* per bucket, ``codec_factor``: what its own codec costs over what the whole gradient's codec curves say
  for pieces of its sizes (GradiVeQ restricts its bases to a bucket's layers, so a bucket's codec is not
  the whole one at a smaller size; every other aggregator's bucket runs the whole codec: 1).
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from gvq.comm.internals import ddp_first_bucket_bytes
from gvq.predict.cost_model import PredictError

MIB = 1024 * 1024
DEFAULT_CAP_MB = 25                      # torch DDP's bucket_cap_mb when unset
PROFILE_REPS = 20


def bucket_limits(cap_mb: float | None) -> list[int]:
    """DDP's bucket size limits in bytes: unset, a small first bucket then 25 MiB; set, that size."""
    if cap_mb is None:
        return [ddp_first_bucket_bytes(), DEFAULT_CAP_MB * MIB]
    return [int(cap_mb * MIB)]


def assign_buckets(nbytes: list[int], order: list[int], limits: list[int]) -> list[list[int]]:
    """Positions into ``nbytes`` grouped into buckets as DDP's (private) bucket assignment by size
    groups dense tensors of one dtype: taken in ``order``, a bucket closes once it holds at least its
    limit (the k-th bucket's limit is ``limits[k]``, the last limit for every later one)."""
    out, cur, size = [], [], 0
    for i in order:
        cur.append(i)
        size += nbytes[i]
        if size >= limits[min(len(out), len(limits) - 1)]:
            out.append(cur)
            cur, size = [], 0
    return out + ([cur] if cur else [])


def backward_profile(model: str, batch: int, num_classes: int, reps: int = PROFILE_REPS, shape=None) -> dict:
    """CPU seconds of forward (with the loss and zero_grad), backward and the SGD step on inputs of
    ``shape`` (default: the model's default data's), ``reps`` sorted samples each, and per parameter
    (model order) the median share of backward elapsed when its gradient was produced; ``order``: the
    parameters in the order their gradients came."""
    from gvq.bench.common import build_model, model_workload
    work = model_workload(model, num_classes, shape)
    net = build_model(model, work.num_classes, work.in_channels)
    params = list(net.parameters())
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    x, y = work.synthetic_batch(batch)
    stamps: dict[int, float] = {}
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda _, i=i: stamps.__setitem__(i, time.thread_time()))
    samples = {"forward": [], "backward": [], "step": []}
    shares = []
    for rep in range(reps + 1):                 # the first one untimed (allocations, plans)
        t0 = time.thread_time()
        loss = work.loss(net(x), y)
        opt.zero_grad(set_to_none=False)
        t1 = time.thread_time()
        loss.backward()
        t2 = time.thread_time()
        opt.step()
        t3 = time.thread_time()
        if rep:
            for k, v in zip(samples, (t1 - t0, t2 - t1, t3 - t2)):
                samples[k].append(v)
            shares.append([(stamps[i] - t1) / max(t2 - t1, 1e-12) for i in range(len(params))])
        order = list(stamps)                    # the hooks' call order: the order gradients came
        stamps.clear()
    ready = [statistics.median(s[i] for s in shares) for i in range(len(params))]
    return {**{k: sorted(v) for k, v in samples.items()}, "ready": ready, "order": order,
            "nbytes": [p.numel() * p.element_size() for p in params]}


def bucket_entries(name: str, agg, buckets: list[list[int]], numel: int, curves: dict | None = None,
                   ns: list[int] | None = None) -> list[dict]:
    """Per bucket: ``params``, ``values`` (its share of the gradient's values), ``rounds`` (its own rings
    at every N of ``ns``, default the stored structure's, as the aggregator declares
    them: a bucket's pieces are not the whole gradient's scaled, e.g. GradiVeQ cuts fewer in a small
    bucket) and ``codec_factor`` (:func:`codec_factor`; 1 without ``curves``, the calibration's codec
    curves)."""
    from gvq.predict.structure import bucket_rounds, stored, structure_ns
    out = []
    for b in buckets:
        out.append({"params": b, "values": sum(agg.params[i].numel() for i in b) / numel,
                    "rounds": {str(n): stored(bucket_rounds(name, agg, b, n)) for n in ns or structure_ns()},
                    "codec_factor": 1.0 if curves is None else codec_factor(name, agg, b, curves)})
    return out


def codec_factor(name: str, agg, params: list[int], curves: dict, reps: int = 3) -> float:
    """A bucket's codec calls on its own 2-rank ring pieces (median of ``reps``, caches flushed as in
    ``calibrate``), over the whole gradient's curves ``curves[name]`` at those calls' sizes.  Only an
    aggregator declaring ``bucket_codecs`` (GradiVeQ: its bases restricted to the bucket's layers, fewer
    blocks, other shapes) is timed; every other aggregator's bucket runs the whole codec, whose curves
    hold."""
    from gvq.predict.calibrate import Evict, one_rank_ring
    from gvq.predict.cost_model import op_cost
    from gvq.predict.structure import bucket_rounds
    if not agg.bucket_codecs:
        return 1.0
    rnd = bucket_rounds(name, agg, params, 2)[0]
    codec, pieces = rnd["codec"], [q for seg in rnd["segs"] for q in seg]
    ordered = tuple(sorted(params))                  # as the hook averages a bucket (bucket_rounds too)
    flat, evict = torch.randn(sum(agg.params[i].numel() for i in ordered)), Evict(True)
    runs = [one_rank_ring(codec, flat, pieces, lambda f: agg.codec_session(f, ordered), False, evict)
            for _ in range(reps + 1)][1:]            # the first pass untimed: plans, layouts
    own = sum(statistics.median(r[op][k][1] for r in runs) for op in runs[0] for k in range(len(pieces)))
    model = sum(float(op_cost(curves[name][op], size, 1.0)) for op in runs[0] for size, _ in runs[0][op])
    return own / model if model > 0 else 1.0


def calibrate_overlap(folder: Path, caps: list[float], reps: int = PROFILE_REPS, host_ranks=(),
                      host_ranks_per_node=(1,)) -> dict:
    """Profile backward and cut DDP's buckets for the model ``folder/calibration.json`` was made on,
    with its aggregators and settings; time messages with each of ``host_ranks`` ranks on this host, on
    flat rings and on the hierarchical rings of nodes of each ``host_ranks_per_node`` that divides it
    (:func:`host_messages`); write ``folder/overlap.json``."""
    from gvq.predict.structure import build_on_one_rank, calibrated_entries, calibrated_workload
    cal = json.loads((folder / "calibration.json").read_text())
    named = calibrated_entries(cal, json.loads((folder / "structure.json").read_text()))
    work = calibrated_workload(cal)
    shape = work.sample_shape
    torch.set_num_threads(1)
    torch.manual_seed(0)
    prof = backward_profile(cal["model"], cal["batch_size"], cal["num_classes"], reps, shape)
    layouts = {cap_key(c): assign_buckets(prof["nbytes"], prof["order"], bucket_limits(c)) for c in [None, *caps]}
    out = {"model": cal["model"], "profile": prof, "buckets": {}, **host_messages(host_ranks, host_ranks_per_node)}
    for name, entry in named.items():
        agg, numel = build_on_one_rank(entry, cal["model"], cal["num_classes"], cal["settings"], work.in_channels)
        out["buckets"][name] = {k: bucket_entries(name, agg, b, numel, cal["codecs"]) for k, b in layouts.items()}
        print(f"gvq.predict calibrate-overlap: {name}: buckets {[len(b) for b in layouts.values()]}", flush=True)
    (folder / "overlap.json").write_text(json.dumps(out))
    return out


def host_messages(host_ranks, ranks_per_node=(1,)) -> dict:
    """``overlap.json``'s message costs as N ranks sharing this host's cores pay them (what validation against
    this host's N-rank benchmarks needs): ``host_msg`` {N: [fixed, per byte]} on flat rings (R = 1), and
    ``host_msg_nodes`` {R: {N: ...}} on hierarchical rings of nodes of R, for each R dividing N into 2 or more
    nodes (the others are no shape)."""
    from gvq.predict.messages import message_cost
    out = {"host_msg": {}, "host_msg_nodes": {}}
    for per in ranks_per_node:
        for n in host_ranks:
            if per > 1 and (n % per or n // per < 2):
                continue
            cost = message_cost(max(4, 80 // n), n, per)     # fewer calls at large N: each posts ~4 N messages
            (out["host_msg"] if per == 1 else out["host_msg_nodes"].setdefault(str(per), {}))[str(n)] = cost
            shape = "flat" if per == 1 else f"nodes of {per}"
            print(f"gvq.predict calibrate-overlap: {n} ranks on this host ({shape}): {cost[0] * 1e6:.1f} "
                  "us per message posted", flush=True)
    return out


def cap_key(cap_mb: float | None) -> str:
    """How a bucket size is keyed in ``overlap.json``: ``default`` (DDP's) or the size in MB."""
    return "default" if cap_mb is None else f"{cap_mb:g}"


def predict_calibrate_overlap(cfg, paths) -> dict:
    """``python -m gvq.predict calibrate-overlap``: :func:`calibrate_overlap` on a calibrated model."""
    from gvq.predict.keys import ROOT_DIR
    from gvq.schema.tool import namespace
    args = namespace(cfg, paths)
    folder = args.calibration or ROOT_DIR / args.model
    if not (folder / "calibration.json").exists():
        raise PredictError(f"gvq.predict calibrate-overlap: no {folder}/calibration.json: run "
                         f"`python -m gvq.predict calibrate model={args.model}` first")
    out = calibrate_overlap(folder, args.bucket_mb, host_ranks=args.host_ranks,
                            host_ranks_per_node=args.host_ranks_per_node)
    prof = out["profile"]
    print(f"gvq.predict calibrate-overlap: forward {statistics.median(prof['forward']) * 1e3:.1f} ms, backward "
          f"{statistics.median(prof['backward']) * 1e3:.1f} ms, step {statistics.median(prof['step']) * 1e3:.1f} "
          f"ms -> {folder}/overlap.json")
    return out
