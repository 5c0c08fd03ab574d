"""What the compute phase costs N ranks sharing this host's cores: the compute twin of the host message
timings (:mod:`gvq.predict.messages`), for validation against this host's N-rank benchmarks only.

``calibrate-overlap host_ranks=[...]`` runs the calibrated forward + backward + step on N ranks under the
virtual clock's host lock, as ``gvq.bench train``'s ranks run it: each alone on its core, but after the other
ranks' processes have been through its caches, so with many ranks a core each costs more than one quiet
rank's (docs/results.md has the measurement).  A cluster gives every rank its own device, so
projections never read these figures; ``validate`` prices a cell's compute from them where its N was timed.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

#: iterations every rank times; more => steadier high quantiles (the slowest of N) for longer calibrations
HOST_ITERS = 8
#: one quiet rank's samples taken just before each N's run: the speed its samples are rescaled from
QUIET_REPS = 10


def host_compute(cal: dict, host_ranks) -> dict:
    """``overlap.json``'s ``host_compute``: {N: {"quiet_s": one quiet rank's median just before,
    "samples": every rank's compute seconds in every timed iteration, sorted}} for each N of ``host_ranks``."""
    from gvq.bench.common import spawn_loopback
    from gvq.predict.calibrate import compute
    from gvq.predict.structure import calibrated_shape
    shape = list(calibrated_shape(cal))
    work = (cal["model"], cal["batch_size"], cal["num_classes"])
    out = {}
    for n in host_ranks:
        quiet = statistics.median(compute(*work, reps=QUIET_REPS, shape=shape))
        got = spawn_loopback(_compute_rank, n, n, work, shape, HOST_ITERS)
        out[str(n)] = {"quiet_s": quiet, "samples": sorted(got["samples"])}
        each = statistics.median(got["samples"])
        print(f"gvq.predict calibrate-overlap: {n} ranks on this host: compute {each * 1e3:.1f} ms a rank "
              f"(one quiet rank: {quiet * 1e3:.1f} ms)", flush=True)
    return {"host_compute": out}


def _compute_rank(rank: int, world: int, work: tuple, shape: list, iters: int, init: str, out: str) -> None:
    import torch.distributed as dist

    from gvq.comm import clock
    from gvq.predict.calibrate import compute_step
    torch.set_num_threads(1)                   # as calibrate and every benchmark rank
    clock.configure("virtual", exclusive=True)   # as the benchmarks: one rank's compute at a time
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        step = compute_step(*work, shape=shape)
        step()                                  # first call's allocations are not a step's cost
        mine = []
        for _ in range(iters):
            dist.barrier()                      # every rank's step in each round, as in an iteration
            t0 = clock.now()
            with clock.phase("compute"):
                step()
            mine.append(clock.now() - t0)
        got = [None] * world
        dist.all_gather_object(got, mine)
        if rank == 0:
            Path(out).write_text(json.dumps({"samples": [s for r in got for s in r]}))
    finally:
        dist.destroy_process_group()


def read(folder) -> dict[int, dict]:
    """N -> ``host_compute`` entry of ``folder/overlap.json`` (empty without one, or without the timing)."""
    path = Path(folder) / "overlap.json"
    got = json.loads(path.read_text()).get("host_compute", {}) if path.exists() else {}
    return {int(n): e for n, e in got.items()}


def at_speed(entry: dict, now: list[float]) -> list[float]:
    """``entry``'s N-rank samples at the host's speed of the moment: rescaled by one quiet rank's median now
    (``now``: samples) over its median when they were timed, as the host's speed drifts over minutes."""
    scale = statistics.median(now) / entry["quiet_s"]
    return [s * scale for s in entry["samples"]]
