"""The benchmarks' shared core: compose a config as the CLI would, build an aggregator from its option
file, a model's workload (inputs and loss: gvq.workloads) and gradient shapes, spawning loopback ranks, and
printing a table with its setting.

Every ``gvq.bench`` subcommand imports from here.  A few also build on another's measurement, importing
it: ``netns`` runs ``aggregate``'s and ``train``'s, ``overlap`` runs ``train``'s, ``codecs`` times
``quantizers``' codecs and ``gpucheck`` reads ``codecs``' defaults; never the other way round, so there is
no cycle (tests/test_layout.py checks).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from gvq.schema.compose import compose  # the run config `python cli.py <overrides>` composes
from gvq.schema.setting import canonical_name, overrides_for
from gvq.schema.errors import ConfigError


def make_aggregator(name: str, overrides: list[str]):
    """Compose ``aggregator=<name>`` with the overrides; ``name:key=value`` applies to that one only.
    Built as the runner builds it: ``aggregator.overlap=true`` wraps it (DDP + the gvq hook)."""
    from gvq.hooks.builder import aggregator_from
    cfg = compose([f"aggregator={name}", *overrides_for(name, overrides)])
    return aggregator_from(cfg.aggregator)


def setting_name(name: str, overrides) -> str:
    """The name of what :func:`make_aggregator` builds from the same arguments, as every tool keys it
    (:func:`gvq.schema.setting.canonical_name`: ``powersgd rank=6`` under bench.yaml's set); a mode that is
    no option (``torch_ddp``, ``local``, ``allreduce``) by its own name."""
    return canonical_name(name, overrides_for(name, overrides))


def build_model(model: str, num_classes: int, in_channels: int) -> torch.nn.Module:
    """``conf/model/<model>.yaml`` instantiated with a fixed seed (every rank builds the same one)."""
    from hydra.utils import instantiate
    torch.manual_seed(0)
    return instantiate(compose([f"model={model}"]).model, num_classes=num_classes, in_channels=in_channels)


def model_workload(model: str, num_classes: int, shape=None):
    """The workload a timed step of ``conf/model/<model>.yaml`` runs (:func:`gvq.workloads.of_model`): inputs
    of ``shape``, else the input the model's config declares (a GPT's: a window of its ``model.context``)."""
    from gvq.workloads import of_model
    return of_model(compose([f"model={model}"]).model, num_classes, shape)


def model_shapes(model: str, num_classes: int) -> list[torch.Size]:
    """Parameter shapes of a model, in model order (the gradient an aggregator sees), built for its own
    declared input."""
    net = build_model(model, num_classes, model_workload(model, num_classes).in_channels)
    return [p.shape for p in net.parameters()]


def spawn_loopback(fn, world: int, *args):
    """Run ``fn(rank, *args, init_url, out_path)`` on ``world`` spawned ranks (file rendezvous in a
    temp dir, never a port); returns the JSON rank 0 wrote to ``out_path``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/out.json"
        mp.spawn(fn, args=(*args, f"file://{tmp}/rendezvous", out), nprocs=world)
        return json.loads(Path(out).read_text())


def run_bench(sub: str, overrides: list[str], pin: bool = False) -> list[dict]:
    """One ``python -m gvq.bench <sub> <overrides>`` in a subprocess (one thread a rank; ``pin``: all on core
    0), its table silenced; returns the records it wrote with ``--out``."""
    import os
    import subprocess
    import sys
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/r.json"
        cmd = [sys.executable, "-m", "gvq.bench", sub, *overrides, "--out", out]
        if pin:
            cmd = ["taskset", "-c", "0", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
        return json.loads(Path(out).read_text())


@contextlib.contextmanager
def one_thread():
    """One intra-op thread inside (as each rank runs), the previous count restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def collections_untimed():
    """Automatic garbage collection off inside, the objects alive on entry frozen out of every later
    collection; yields ``collect``, to call between timed spans.  Left on, the interpreter starts a
    collection in whichever phase happens to allocate, and a full one's CPU time lands in that one
    timed span (virtual time counts CPU).  Collection's previous state is restored on exit."""
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield gc.collect
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def median_seconds(fn, reps: int, device: torch.device | None = None) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls after one untimed call (tables, buffers);
    on CUDA each timed call is synchronised."""
    sync = torch.cuda.synchronize if device is not None and device.type == "cuda" else (lambda: None)
    fn()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def print_markdown(records: list[dict], cols: list[str], header: str) -> None:
    """A result table with its setting on the line above it (the figure never travels alone)."""
    import pandas as pd
    print(f"\n# {header}")
    print(pd.DataFrame(records)[cols].to_markdown(index=False, floatfmt=".4g"))


def net_defaults() -> dict:
    """The ``net`` node's defaults, read off its schema (their one home), as plain values."""
    from gvq.schema.options import NetSchema
    return {f.name: getattr(v, "value", v) for f in dataclasses.fields(NetSchema)
            for v in [getattr(NetSchema(), f.name)]}


def check_net(net: dict, links, worlds=(), own=("bandwidth_bps",)) -> None:
    """A benchmark's composed ``net`` node: the keys in ``own`` left at their defaults (the benchmark sets
    them: its links are ``grid.links_bps``), its nodes whole at every size of ``worlds``
    (:func:`gvq.run.validate.check_nodes`), then the run's clock rules (:func:`gvq.run.validate.check_clock`)
    with ``links`` as the link model; :class:`ConfigError`, one line naming the key, where not."""
    from gvq.run.validate import NET_KEYS, check_clock, check_nodes
    default = net_defaults()
    changed = [k for k in own if net[k] != default[k]]
    if changed:
        raise ConfigError(f"net.{changed[0]}: this benchmark sets it (its links: grid.links_bps)")
    for world in worlds:
        check_nodes(net, world)
    check_clock(net["clock"], net["compute_scale"], net["codec_scale"], all(b is not None for b in links),
                {**NET_KEYS, "link": "grid.links_bps=[1e9]"})


def configure_clock(net: dict, device: str = "cpu"):
    """This rank's clock from a benchmark's ``net`` node (as a run's ranks configure theirs)."""
    from gvq.comm import clock
    return clock.configure(net["clock"], net["compute_scale"], net["codec_scale"], net["exclusive"], device,
                           net["comm_core"])


def clock_label(net: dict) -> str:
    """The clock a table's times are on, for its header (a figure never travels without its clock)."""
    if net["clock"] == "wall":
        return "wall clock"
    extra = "" if (net["exclusive"], net["comm_core"]) == (True, "shared") else \
        f", exclusive {str(net['exclusive']).lower()}, comm_core {net['comm_core']}"
    return f"virtual time (compute x{net['compute_scale']:g}, codec x{net['codec_scale']:g}{extra})"
