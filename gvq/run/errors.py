"""The CLI's composition errors as one line: the key or option at fault, and what is allowed.

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


def one_line_errors(main) -> None:
    """Run Hydra's ``main`` with composition errors as one line on stderr (exit 2)."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":      # the user asked for Hydra's own report
        return main()
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        return main()
    except (ConfigCompositionException, MissingConfigException, OverrideParseException,
            OmegaConfBaseException) as e:
        _exit(describe(e))
    except ValueError as e:                            # Hydra's own checks of an override's shape
        if not _raised_in_hydra(e):
            raise
        keyless = [a for a in sys.argv[1:] if a.startswith("=")]
        _exit(f"{keyless[0]!r}: an override needs a key (key=value)" if keyless else first_line(e))


def _exit(line: str) -> None:
    print(f"gvq: config error: {line}", file=sys.stderr)
    sys.exit(2)


def _raised_in_hydra(e: BaseException) -> bool:
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and f"{os.sep}hydra{os.sep}" in frames[-1].filename
