"""A ``-m`` sweep checked whole before its first job: every job's config composed and validated, so a sweep
that would be refused at some job is refused before Hydra makes its dir (a refused sweep leaves nothing
under ``runs/multirun/``, which ``python -m gvq.report`` would otherwise find as the latest sweep).

Hydra calls :class:`SweepCheck` (``hydra.callbacks`` in conf/hydra/default.yaml) at the start of a multirun,
before its sweeper saves ``multirun.yaml``.  Its jobs are expanded as Hydra's basic sweeper expands them
(the cartesian product of every override's values, ``hydra.sweeper.params`` first), composed with
:func:`hydra.compose` and checked by :func:`gvq.run.validate.validate`; the first refused job ends the sweep
in one line (:class:`gvq.run.errors.ConfigRefused`, a ``BaseException``: Hydra's callback runner does
not swallow it).  A key one aggregator family has and another lacks (``aggregator=rar,qsgd
aggregator.compressor.bits=2,4``: rar has no compressor) gets a line that says so and how to sweep across
families: one sweep per family, reported together (docs/knobs.md, "Sweeps across families").
"""
from __future__ import annotations

import itertools

from hydra import compose
from hydra.experimental.callback import Callback
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gvq.comm.internals import HYDRA_BASIC_SWEEPER
from gvq.run.errors import refuse
from gvq.schema.errors import ConfigError, describe

#: the sweeper whose expansion :func:`sweep_jobs` mirrors; another sweeper (optuna, ax) draws its jobs
#: as it goes, so there is nothing to check up front
BASIC_SWEEPER = HYDRA_BASIC_SWEEPER
#: what composing a job raises for a bad override (gvq.run.errors catches the same for a single run)
COMPOSE_ERRORS = (ConfigCompositionException, MissingConfigException, OverrideParseException, OmegaConfBaseException)
CROSS_FAMILY = ("a -m sweep gives every job every override, so sweep each family on its own and report them "
                "together: python cli.py -m aggregator=qsgd aggregator.compressor.bits=2,4 "
                "hydra.sweep.dir=DIR/qsgd; python cli.py -m aggregator=rar hydra.sweep.dir=DIR/rar; "
                "python -m gvq.report DIR (docs/knobs.md: sweeps across families)")


def sweep_jobs(arguments: list[str]) -> list[list[str]]:
    """Each job's overrides, as Hydra's basic sweeper forms them: every value of a swept key crossed with
    every value of every other key, in the order given."""
    lists = {}
    for o in OverridesParser.create().parse_overrides(arguments):
        key = o.get_key_element()
        if o.is_sweep_override():
            if not o.is_discrete_sweep():          # interval(...): the basic sweeper refuses it itself
                return []
            lists[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            lists[key] = [f"{key}={o.get_value_element_as_str()}"]
    return [list(job) for job in itertools.product(*lists.values())]


def _failed_key(e: BaseException) -> str | None:
    cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else e
    return str(cause.full_key) if isinstance(cause, OmegaConfBaseException) and cause.full_key else None


def job_line(job: list[str], e: BaseException) -> str:
    """The refusal of one job: which job, the key at fault, and, where an aggregator option lacks a key
    another option of the sweep has, that it lacks it and how to sweep across families."""
    line, key = describe(e), _failed_key(e)
    option = next((o.split("=", 1)[1] for o in job if o.startswith("aggregator=")), None)
    if option and key and key.startswith("aggregator."):
        return f"sweep job [{' '.join(job)}]: aggregator={option} has no {key} ({line}); {CROSS_FAMILY}"
    return f"sweep job [{' '.join(job)}]: {line}"


def check_sweep(config: DictConfig, config_name: str | None) -> None:
    """Compose and validate every job of the sweep ``config`` (the multirun's composed config) describes;
    raise :class:`gvq.run.errors.ConfigRefused` at the first refused one."""
    from gvq.run.validate import validate
    if OmegaConf.select(config, "hydra.sweeper._target_") != BASIC_SWEEPER:
        return
    params = config.hydra.sweeper.params
    params = OmegaConf.to_container(params, resolve=False) if params is not None else {}
    task = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    for job in sweep_jobs([f"{k}={v}" for k, v in params.items()] + list(task)):
        try:
            validate(compose(config_name, overrides=job))
        except ConfigError as e:
            raise refuse(f"sweep job [{' '.join(job)}]: {e}") from None
        except COMPOSE_ERRORS as e:
            raise refuse(job_line(job, e)) from None


class SweepCheck(Callback):
    """Hydra callback (``hydra.callbacks.sweep_check``): :func:`check_sweep` when a multirun starts."""

    def on_multirun_start(self, config: DictConfig, config_name: str | None = None, **kwargs) -> None:
        check_sweep(config, config_name)
