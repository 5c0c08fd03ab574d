"""How a run ends other than in success, as types, and the one place they become the CLI's exit status.

:class:`RunEnded` and its kinds are what :func:`gvq.run.launch.launch` raises (its one line already on
stderr): :class:`ConfigRefused` (exit 2), :class:`RunFailed` (1: a rank failed or stopped; 3: the run
stopped learning), and :class:`gvq.run.signals.Interrupted` (128 + the signal).  :func:`cli_status` runs
the CLI and returns the status it ends with; ``cli.py`` alone ends the process.

:func:`one_line_errors` runs the CLI with Hydra re-raising instead of printing its several-line report
(``HYDRA_FULL_ERROR=1``, unless the user set it: then they get Hydra's full report) and prints what it
raises as ``gvq: config error: <key>: <what is wrong>; <allowed values or the closest match>``
(:func:`gvq.schema.errors.describe`, the line a hook's ``from_config`` raises too), exit 2.  Everything
else propagates unchanged (a bug keeps its traceback).
"""
from __future__ import annotations

import os
import sys
import traceback

from hydra.errors import (
    ConfigCompositionException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf.errors import OmegaConfBaseException

from gvq.schema.errors import describe, first_line


class RunEnded(BaseException):
    """A run ended without its result, its one line on stderr; ``code``: the exit status the CLI ends with.
    A ``BaseException``, as ``KeyboardInterrupt``: Hydra's job runner records an ``Exception`` as a failed
    job and runs a sweep's next one, whereas a refused or interrupted run ends the sweep (a failed job
    does not: inside a sweep launch() returns, see :func:`gvq.run.launch.launch`)."""
    code = 1


class ConfigRefused(RunEnded):
    """The config was refused before any rank started (``gvq: config error: <line>``)."""
    code = 2


class RunFailed(RunEnded):
    """A single run failed (``code`` 1: a rank failed, or ``nan_policy=error`` stopped it; 3: it stopped
    learning), or a torchrun rank ended with ``code``."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def refuse(line: str) -> ConfigRefused:
    """Print a config error's one line; returns the exception to raise."""
    print(f"gvq: config error: {line}", file=sys.stderr)
    return ConfigRefused(line)


def cli_status(main) -> int:
    """Run the CLI's Hydra ``main`` with one-line errors: the exit status it ends with (0, or the
    ``code`` of the :class:`RunEnded` it raised)."""
    try:
        one_line_errors(main)
    except RunEnded as e:
        return e.code
    return 0


def one_line_errors(main) -> None:
    """Run Hydra's ``main`` with composition errors as one line on stderr (:class:`ConfigRefused`)."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":      # the user asked for Hydra's own report
        return main()
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        return main()
    except (ConfigCompositionException, MissingConfigException, OverrideParseException,
            OmegaConfBaseException) as e:
        raise refuse(describe(e)) from None
    except ValueError as e:                            # Hydra's own checks of an override's shape
        if not _raised_in_hydra(e):
            raise
        keyless = [a for a in sys.argv[1:] if a.startswith("=")]
        raise refuse(f"{keyless[0]!r}: an override needs a key (key=value)" if keyless else first_line(e)) from None


def _raised_in_hydra(e: BaseException) -> bool:
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and f"{os.sep}hydra{os.sep}" in frames[-1].filename
