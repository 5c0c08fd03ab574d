"""Range checks the typed schemas cannot express, each in one place.  Each failure is one line naming
the key and what is allowed; :func:`gvq.run.launch.launch` prints it and exits with status 2, without a
traceback.

Choices (``device``, ``net.clock``, ``optim.schedule`` ...) are enums in the schemas
(:mod:`gvq.schema.config`, :mod:`gvq.schema.options`), refused at compose time.  The GradiVeQ knobs
(``lambda``, ``K``, ``s``, ``L_t``, ``L_c``, ``warmup``) are checked by the constructors that read them,
run here on the top-level values so that a bad one is refused whichever aggregator runs.  The clock's
rules serve the run (``net.*``) and the benchmarks' ``net`` keys (``net.clock`` ...): :func:`check_clock`.
"""
from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gvq.comm.links import whole_nodes
from gvq.run.checkpoint import complete_sets
from gvq.schema.config import KNOBS, TOP_LEVEL_KEYS
from gvq.schema.errors import ConfigError

#: how the clock's keys are spelt in a run config; a benchmark names its own link key
NET_KEYS = {"clock": "net.clock", "compute_scale": "net.compute_scale", "codec_scale": "net.codec_scale",
            "link": "net=mbit50 or net.bandwidth_bps=1e9"}


def _require(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def validate(cfg) -> None:
    """Raise :class:`ConfigError` on the first bad value of the composed run config."""
    extra = sorted(set(cfg.keys()) - TOP_LEVEL_KEYS)
    _require(not extra, f"{extra[0]}: unknown key; allowed top-level keys: {', '.join(sorted(TOP_LEVEL_KEYS))}"
             if extra else "")
    for key in ("world_size", "iterations", "batch_size", "eval_every"):
        _require(cfg[key] >= 1, f"{key}={cfg[key]}: must be >= 1")
    _require(cfg.timeout_s > 0, f"timeout_s={cfg.timeout_s}: must be > 0")
    _require(0 <= cfg.seed < 2**32, f"seed={cfg.seed}: must be in [0, 2^32) (numpy's and scikit-learn's seeds)")
    _require(cfg.checkpoint.every >= 0, f"checkpoint.every={cfg.checkpoint.every}: must be >= 0 (0: never)")
    _require(cfg.restarts >= 0, f"restarts={cfg.restarts}: must be >= 0 (0: a lost rank fails the run)")
    _require(cfg.checkpoint.keep >= 1, f"checkpoint.keep={cfg.checkpoint.keep}: must be >= 1 (complete sets kept)")
    _require(cfg.resume is None or Path(cfg.resume).is_dir(), f"resume={cfg.resume}: no such directory")
    _require(cfg.resume is None or bool(complete_sets(Path(cfg.resume) / "checkpoint")),
             f"resume={cfg.resume}: no complete checkpoint set there (checkpoint/iter-*/complete.json)")
    check_knobs(cfg)
    check_method(cfg)
    check_aggregator(cfg)
    _validate_optim(cfg.optim)
    net = cfg.net
    _require(net.bandwidth_bps is None or net.bandwidth_bps > 0,
             f"net.bandwidth_bps={net.bandwidth_bps}: must be > 0 (or null for no emulation)")
    _require(net.latency_s >= 0, f"net.latency_s={net.latency_s}: must be >= 0")
    check_nodes(net, cfg.world_size)
    check_clock(net.clock, net.compute_scale, net.codec_scale, net.bandwidth_bps is not None)
    _require(net.clock != "virtual" or cfg.device == "cpu", "net.clock=virtual: CPU time does not measure GPU "
             "kernels; use device=cpu (and net.compute_scale for a faster machine)")


def check_nodes(net, world_size: int) -> None:
    """A two-level net (a run's ``net`` node, or a benchmark's, at each of its world sizes): whole nodes, and
    every link modelled where the clock computes time."""
    per = net["ranks_per_node"]
    try:
        whole_nodes(world_size, per)
    except ValueError as e:
        raise ConfigError(f"net.{e}") from None
    intra = net["intra_bandwidth_bps"]
    _require(intra is None or intra > 0, f"net.intra_bandwidth_bps={intra}: must be > 0 (or null: unshaped)")
    _require(net["intra_latency_s"] >= 0, f"net.intra_latency_s={net['intra_latency_s']}: must be >= 0")
    _require(per == 1 or net["clock"] != "virtual" or intra is not None,
             "net.clock=virtual with net.ranks_per_node > 1 needs net.intra_bandwidth_bps (the links inside a node)")


def check_knobs(cfg) -> None:
    """The :data:`KNOBS`' ranges, by the GradiVeQ constructors that hold them (``lambda=1.5`` is refused
    even for an aggregator that does not read it: it is a typo either way)."""
    from gvq.aggregators.gradiveq import GradiVeQAggregator
    from gvq.compressors.gradiveq.codec import GradiVeQ
    from gvq.schema.options import GradiVeQAggregatorSchema, knobs
    try:
        GradiVeQAggregator(GradiVeQ(lam=cfg["lambda"], K=cfg.K, s=cfg.s),
                           **knobs(GradiVeQAggregatorSchema, L_t=cfg.L_t, L_c=cfg.L_c, warmup=cfg.warmup))
    except ValueError as e:
        raise ConfigError(str(e).strip().splitlines()[0]) from None


def check_method(cfg) -> None:
    """The method's ranges (``method.every=0``), by its constructor, and what it needs of the rest of the
    run (``Method.check_run``: DeMo's momentum-free SGD): one line before any rank starts."""
    from hydra.utils import get_object
    knobs = OmegaConf.to_container(cfg.method, resolve=True)
    try:                                 # called as itself: instantiate() would wrap the ValueError
        get_object(knobs.pop("_target_"))(**knobs).check_run(OmegaConf.to_container(cfg, resolve=True))
    except ValueError as e:
        raise ConfigError(str(e).strip().splitlines()[0]) from None


def check_aggregator(cfg) -> None:
    """What the aggregator needs of the rest of the run (``Aggregator.check_run``: DGC's momentum-free
    SGD), by its class: one line before any rank starts."""
    from hydra.utils import get_object
    try:
        get_object(cfg.aggregator._target_).check_run(OmegaConf.to_container(cfg, resolve=True))
    except ValueError as e:
        raise ConfigError(str(e).strip().splitlines()[0]) from None


def check_clock(clock: str, compute_scale: float, codec_scale: float, has_link: bool,
                keys: dict = NET_KEYS) -> None:
    """The clock's rules: positive scales, scales only on the virtual clock, which needs a link model."""
    for key, value in (("compute_scale", compute_scale), ("codec_scale", codec_scale)):
        _require(value > 0, f"{keys[key]}={value:g}: must be > 0")
        _require(value == 1 or clock == "virtual",
                 f"{keys[key]}={value:g}: scales apply to the virtual clock only (add {keys['clock']}=virtual)")
    _require(clock != "virtual" or has_link, f"{keys['clock']}=virtual: there is no link model to advance "
             f"the clock; pick a link, e.g. {keys['link']}")


#: optim.<key> -> (low, high, what is allowed), for whichever option declares the key
OPTIM_RANGES = {"momentum": (0, 1, "in [0, 1)"), "eps": (1e-300, float("inf"), "> 0"),
                "weight_decay": (0, float("inf"), ">= 0")}


def _validate_optim(o) -> None:
    _require(o.lr > 0, f"optim.lr={o.lr}: must be > 0")
    for key, (lo, hi, allowed) in OPTIM_RANGES.items():
        _require(key not in o or lo <= o[key] < hi, f"optim.{key}={o.get(key)}: must be {allowed}")
    _require("betas" not in o or (len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas)),
             f"optim.betas={list(o.get('betas', []))}: two decay rates in [0, 1)")
    _require(o.clip_norm is None or o.clip_norm > 0,
             f"optim.clip_norm={o.clip_norm}: must be > 0 (or null: no clipping)")
    _require(all(0 < m < 1 for m in o.milestones), f"optim.milestones={list(o.milestones)}: fractions in (0, 1)")
    _require(0 < o.gamma <= 1, f"optim.gamma={o.gamma}: must be in (0, 1]")
    _require(o.warmup_iters >= 0, f"optim.warmup_iters={o.warmup_iters}: must be >= 0")


def knobs_read(aggregator: DictConfig) -> set[str]:
    """The :data:`KNOBS` the (unresolved) aggregator config interpolates, i.e. the ones it reads."""
    text = OmegaConf.to_yaml(aggregator)             # interpolations stay as written: ${lambda}
    return {k for k in KNOBS if re.search(r"\$\{\s*" + re.escape(k) + r"\s*\}", text)}


def inert_knobs(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """Knobs the user set on the command line (or in a sweep) that this run's aggregator does not
    read: they change nothing, so the launcher warns and the report does not split groups by them.
    Knobs a preset sets are not counted: presets set them for the aggregators that read them."""
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    read = knobs_read(cfg.aggregator)
    return [k for k in KNOBS if k in given and k not in read]
