"""A ``-m`` sweep checked whole before its first job: every job's config composed and validated, so a sweep
that would be refused at some job is refused before Hydra makes its dir (a refused sweep leaves nothing
under ``runs/multirun/``, which ``python -m gvq.report`` would otherwise find as the latest sweep).

Hydra calls :class:`SweepCheck` (``hydra.callbacks`` in conf/hydra/default.yaml) at the start of a multirun,
before its sweeper saves ``multirun.yaml``.  Its jobs are expanded as Hydra's basic sweeper expands them
(the cartesian product of every override's values, ``hydra.sweeper.params`` first), composed with
:func:`hydra.compose` and checked by :func:`gvq.run.validate.validate`; the first refused job ends the sweep
in one line (:class:`gvq.run.errors.ConfigRefused`, a ``BaseException``: Hydra's callback runner does
not swallow it).

A key one option of a group has and another option swept beside it lacks applies to the jobs whose
option has it (:func:`applicable_jobs`: ``-m method=every_step,diloco method.every=10,30,100`` is every_step
once and diloco three times; ``aggregator=rar,qsgd aggregator.compressor.bits=2,4`` is rar once and qsgd
twice).  gvq's sweeper (hydra_plugins/gvq_sweeper, the default ``hydra/sweeper``) runs those jobs, and this
check mirrors it.  A key no option of the sweep has is still refused, naming it.
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
#: gvq's own (the default): the basic sweeper's product, less the overrides a job's option lacks
GVQ_SWEEPER = "hydra_plugins.gvq_sweeper.gvq_sweeper.GvqSweeper"
SWEEPERS = (BASIC_SWEEPER, GVQ_SWEEPER)
#: what composing a job raises for a bad override (gvq.run.errors catches the same for a single run)
COMPOSE_ERRORS = (ConfigCompositionException, MissingConfigException, OverrideParseException, OmegaConfBaseException)

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


def _option_has(group: str, option: str, path: str) -> bool:
    """Whether ``group=option`` composes a ``group.path`` key (its schema's, nested ones included)."""
    from gvq.schema.compose import compose
    try:
        cfg = compose([f"{group}={option}"])
    except ConfigError:
        return True                    # not composable alone: keep the override, the job's check refuses it
    return OmegaConf.select(cfg, f"{group}.{path}", default=_ABSENT) is not _ABSENT


_ABSENT = object()


def _split(override: str) -> tuple[str, str, str]:
    """``group.path=value`` as (group, path, override); ("", "", override) for any other override."""
    key = override.split("=", 1)[0]
    group, dot, path = key.partition(".")
    return (group, path, override) if dot and group.isidentifier() else ("", "", override)


def applicable_jobs(jobs: list[list[str]], choices: dict[str, str]) -> list[list[str]]:
    """``jobs`` with each ``group.key=value`` override dropped from the jobs whose ``group`` option lacks
    the key while another option of ``group`` in the sweep has it; jobs left equal run once, in order.
    ``choices``: each group's option where a job does not name one (the composed defaults)."""
    def option(job, group):
        return next((o.split("=", 1)[1] for o in job if o.split("=", 1)[0] == group), choices.get(group))
    swept: dict[str, set] = {}
    for job in jobs:
        for group, path, _ in map(_split, job):
            if path and option(job, group) is not None:
                swept.setdefault(group, set()).update(option(j, group) for j in jobs)
    out: list[list[str]] = []
    for job in jobs:
        kept = [o for group, path, o in map(_split, job)
                if not path or group not in swept or _option_has(group, option(job, group), path)
                or not any(_option_has(group, other, path) for other in swept[group])]
        if kept not in out:
            out.append(kept)
    return out


def job_line(job: list[str], e: BaseException) -> str:
    """The refusal of one job: which job, and the key at fault (no option of the sweep has it)."""
    return f"sweep job [{' '.join(job)}]: {describe(e)}"


def check_sweep(config: DictConfig, config_name: str | None) -> None:
    """Compose and validate every job of the sweep ``config`` (the multirun's composed config) describes;
    raise :class:`gvq.run.errors.ConfigRefused` at the first refused one."""
    from gvq.run.validate import validate
    if OmegaConf.select(config, "hydra.sweeper._target_") not in SWEEPERS:
        return
    params = config.hydra.sweeper.params
    params = OmegaConf.to_container(params, resolve=False) if params is not None else {}
    task = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    jobs = sweep_jobs([f"{k}={v}" for k, v in params.items()] + list(task))
    if OmegaConf.select(config, "hydra.sweeper._target_") == GVQ_SWEEPER:
        jobs = applicable_jobs(jobs, dict(config.hydra.runtime.choices))
    for job in jobs:
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
