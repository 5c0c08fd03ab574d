"""Range checks the typed schema cannot express.  Each failure is one line naming the key and what is
allowed; :func:`gvq.run.launch.launch` prints it and exits with status 2, without a traceback."""
from __future__ import annotations

import math
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gvq.run.checkpoint import complete_sets
from gvq.run.schema import TOP_LEVEL_KEYS

#: top-level knobs that only some aggregators read, through an interpolation in their option file
#: (``lam: ${lambda}`` in conf/aggregator/gradiveq.yaml); top-level so sweeps can cross them with every
#: aggregator (``-m aggregator=rar,gradiveq lambda=0.01,0.05``)
KNOBS = ("lambda", "K", "s", "L_t", "L_c", "warmup")


class ConfigError(ValueError):
    """A bad config value; its message is the single line shown to the user."""


def _require(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def check_k(k) -> None:
    ok = k == "auto" or (isinstance(k, int) and not isinstance(k, bool) and k >= 1) or (
        isinstance(k, str) and re.fullmatch(r"x[1-9][0-9]*", k) is not None)
    _require(ok, f"K={k!r}: must be auto, x<m> (m*F*D per layer) or a positive int (multiple of F*D)")


def validate(cfg) -> None:
    """Raise :class:`ConfigError` on the first bad value of the composed run config."""
    extra = sorted(set(cfg.keys()) - TOP_LEVEL_KEYS)
    _require(not extra, f"{extra[0]}: unknown key; allowed top-level keys: {', '.join(sorted(TOP_LEVEL_KEYS))}"
             if extra else "")
    for key in ("world_size", "iterations", "batch_size", "eval_every"):
        _require(cfg[key] >= 1, f"{key}={cfg[key]}: must be >= 1")
    _require(cfg.timeout_s > 0, f"timeout_s={cfg.timeout_s}: must be > 0")
    _require(0 <= cfg.seed < 2**32, f"seed={cfg.seed}: must be in [0, 2^32) (numpy's and scikit-learn's seeds)")
    _require(cfg.device in ("cpu", "cuda"), f"device={cfg.device}: must be cpu or cuda")
    _require(cfg.checkpoint.every >= 0, f"checkpoint.every={cfg.checkpoint.every}: must be >= 0 (0: never)")
    _require(cfg.checkpoint.keep >= 1, f"checkpoint.keep={cfg.checkpoint.keep}: must be >= 1 (complete sets kept)")
    _require(cfg.resume is None or Path(cfg.resume).is_dir(), f"resume={cfg.resume}: no such directory")
    _require(cfg.resume is None or bool(complete_sets(Path(cfg.resume) / "checkpoint")),
             f"resume={cfg.resume}: no complete checkpoint set there (checkpoint/iter-*/complete.json)")
    _require(cfg.nan_policy in ("error", "skip"), f"nan_policy={cfg.nan_policy}: must be error or skip")
    lam = cfg["lambda"]
    _require(0.0 <= lam < 1.0, f"lambda={lam}: must be in [0, 1)")
    check_k(cfg.K)
    s = cfg.s
    _require(s >= 1 and (math.isinf(s) or float(s).is_integer()), f"s={s}: must be an integer >= 1 or inf")
    _require(cfg.L_t >= 2, f"L_t={cfg.L_t}: must be >= 2 (PCA needs at least 2 samples)")
    _require(cfg.L_c >= 1, f"L_c={cfg.L_c}: must be >= 1")
    _require(cfg.warmup >= 0, f"warmup={cfg.warmup}: must be >= 0")
    _validate_optim(cfg.optim)
    net = cfg.net
    _require(net.bandwidth_bps is None or net.bandwidth_bps > 0,
             f"net.bandwidth_bps={net.bandwidth_bps}: must be > 0 (or null for no emulation)")
    _require(net.latency_s >= 0, f"net.latency_s={net.latency_s}: must be >= 0")
    _validate_clock(net, cfg.device)
    _require(cfg.logger.wandb.mode in ("offline", "online", "disabled"),
             f"logger.wandb.mode={cfg.logger.wandb.mode}: must be offline, online or disabled")


def _validate_clock(net, device: str) -> None:
    _require(net.clock in ("wall", "virtual"), f"net.clock={net.clock}: must be wall or virtual")
    for key in ("compute_scale", "codec_scale"):
        _require(net[key] > 0, f"net.{key}={net[key]}: must be > 0")
        _require(net[key] == 1 or net.clock == "virtual",
                 f"net.{key}={net[key]}: scales apply to the virtual clock only (add net.clock=virtual)")
    if net.clock == "virtual":
        _require(net.bandwidth_bps is not None, "net.clock=virtual: there is no link model to advance the "
                 "clock (net=none); pick a link, e.g. net=mbit50 or net.bandwidth_bps=1e9")
        _require(device == "cpu", "net.clock=virtual: CPU time does not measure GPU kernels; use device=cpu "
                 "(and net.compute_scale for a faster machine)")


def _validate_optim(o) -> None:
    _require(o.lr > 0, f"optim.lr={o.lr}: must be > 0")
    _require(0 <= o.momentum < 1, f"optim.momentum={o.momentum}: must be in [0, 1)")
    _require(o.weight_decay >= 0, f"optim.weight_decay={o.weight_decay}: must be >= 0")
    _require(o.schedule in ("cosine", "step", "constant"),
             f"optim.schedule={o.schedule}: must be cosine, step or constant")
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
