"""``python -m gvq.predict calibrate-overlap``: what the overlapped cost model needs beyond ``calibrate``;
writes ``overlap.json`` beside ``calibration.json``.

* DDP's buckets, formed as torch forms them when it rebuilds its buckets after the first iteration:
  parameters in the order backward produced their gradients, cut at ``dist._DEFAULT_FIRST_BUCKET_BYTES``
  for the first bucket and ``bucket_cap_mb`` after it (no small first bucket once ``bucket_cap_mb`` is
  set, as ``aggregator.bucket_cap_mb`` sets it);
* backward timed apart from forward and the optimizer step, and when, within backward, each
  parameter's gradient was produced (a hook per parameter, CPU time of the one thread): a bucket is
  ready when its last gradient is;
* per bucket, its share of the whole gradient's values and of each ring's payload bytes, from the
  aggregator's own per-bucket rings (:func:`gvq.predict.structure.bucket_rounds`): the model replays a
  bucket as the whole gradient's ring at that N with its pieces scaled by these shares.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from gvq.predict.model import PredictError

MIB = 1024 * 1024
DEFAULT_CAP_MB = 25                      # torch DDP's bucket_cap_mb when unset
PROFILE_REPS = 20


def bucket_limits(cap_mb: float | None) -> list[int]:
    """DDP's bucket size limits in bytes: unset, a small first bucket then 25 MiB; set, that size."""
    if cap_mb is None:
        return [dist._DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_CAP_MB * MIB]
    return [int(cap_mb * MIB)]


def assign_buckets(nbytes: list[int], order: list[int], limits: list[int]) -> list[list[int]]:
    """Positions into ``nbytes`` grouped into buckets as ``dist._compute_bucket_assignment_by_size``
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


def backward_profile(model: str, batch: int, num_classes: int, reps: int = PROFILE_REPS) -> dict:
    """CPU seconds of forward (with the loss and zero_grad), backward and the SGD step, ``reps`` sorted
    samples each, and per parameter (model order) the median share of backward elapsed when its
    gradient was produced; ``order``: the parameters in the order their gradients came."""
    from gvq.bench.common import build_model
    shape = (1, 8, 8) if model == "cnn" else (3, 32, 32)
    net = build_model(model, num_classes, shape[0])
    params = list(net.parameters())
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, *shape), torch.randint(0, num_classes, (batch,))
    stamps: dict[int, float] = {}
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda _, i=i: stamps.__setitem__(i, time.thread_time()))
    samples = {"forward": [], "backward": [], "step": []}
    shares = []
    for rep in range(reps + 1):                 # the first one untimed (allocations, plans)
        t0 = time.thread_time()
        loss = torch.nn.functional.cross_entropy(net(x), y)
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


def bucket_shares(name: str, agg, buckets: list[list[int]], numel: int) -> list[dict]:
    """Per bucket: ``values`` (its share of the gradient's values) and ``bytes`` (per ring, its share
    of that ring's payload bytes), from the aggregator's per-bucket rings at two ranks."""
    from gvq.predict.structure import bucket_rounds, rounds
    whole = [sum(map(sum, r["bytes"])) for r in rounds(name, agg, numel, 2)]
    out = []
    for b in buckets:
        mine = [sum(map(sum, r["bytes"])) for r in bucket_rounds(name, agg, b, 2)]
        out.append({"params": b, "values": sum(agg.params[i].numel() for i in b) / numel,
                    "bytes": [m / max(w, 1) for m, w in zip(mine, whole)]})
    return out


def calibrate_overlap(folder: Path, caps: list[float], reps: int = PROFILE_REPS) -> dict:
    """Profile backward and cut DDP's buckets for the model ``folder/calibration.json`` was made on,
    with its aggregators and settings; write ``folder/overlap.json``."""
    from gvq.predict.structure import build_on_one_rank
    cal = json.loads((folder / "calibration.json").read_text())
    names = list(json.loads((folder / "structure.json").read_text())["aggregators"])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    prof = backward_profile(cal["model"], cal["batch_size"], cal["num_classes"], reps)
    layouts = {cap_key(c): assign_buckets(prof["nbytes"], prof["order"], bucket_limits(c)) for c in [None, *caps]}
    out = {"model": cal["model"], "profile": prof, "buckets": {}}
    for name in names:
        agg, numel = build_on_one_rank(name, cal["model"], cal["num_classes"], cal["settings"])
        out["buckets"][name] = {k: bucket_shares(name, agg, b, numel) for k, b in layouts.items()}
        print(f"gvq.predict calibrate-overlap: {name}: buckets {[len(b) for b in layouts.values()]}", flush=True)
    (folder / "overlap.json").write_text(json.dumps(out))
    return out


def cap_key(cap_mb: float | None) -> str:
    """How a bucket size is keyed in ``overlap.json``: ``default`` (DDP's) or the size in MB."""
    return "default" if cap_mb is None else f"{cap_mb:g}"


def main(argv=None):
    import argparse

    from gvq.predict.__main__ import ROOT_DIR
    p = argparse.ArgumentParser(prog="python -m gvq.predict calibrate-overlap",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet32", help="calibrated under runs/predict/<model> (calibrate first)")
    p.add_argument("--calibration", type=Path, default=None, help="calibrate's output folder, if elsewhere")
    p.add_argument("--bucket-mb", type=float, nargs="*", default=[0.25],
                   help="bucket sizes (MB) besides DDP's default, as gvq.bench overlap --bucket-mb")
    args = p.parse_args(argv)
    folder = args.calibration or ROOT_DIR / args.model
    if not (folder / "calibration.json").exists():
        raise PredictError(f"gvq.predict calibrate-overlap: no {folder}/calibration.json: run "
                         f"`python -m gvq.predict calibrate --model {args.model}` first")
    out = calibrate_overlap(folder, args.bucket_mb)
    prof = out["profile"]
    print(f"gvq.predict calibrate-overlap: forward {statistics.median(prof['forward']) * 1e3:.1f} ms, backward "
          f"{statistics.median(prof['backward']) * 1e3:.1f} ms, step {statistics.median(prof['step']) * 1e3:.1f} "
          f"ms -> {folder}/overlap.json")
    return out
