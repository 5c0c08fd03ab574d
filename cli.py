"""gvq command line: ``python cli.py [key=value ...]`` trains one run; ``-m`` sweeps.

    python cli.py                                   # default: small CNN on digits, 2 ranks, rar
    python cli.py -m aggregator=rar world_size=2,4  # a sweep under runs/multirun/
"""
import sys

from gvq.run.warm import exit_fast, start_fork_server

if __name__ == "__main__":      # first, before Hydra's import: the ranks' imports start now, on another
    start_fork_server()         # core (gvq/run/warm.py); ranks import this file too and must not

import hydra

from gvq.run.errors import cli_status
from gvq.schema.config import register

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg):
    from gvq.run.launch import launch
    launch(cfg)


if __name__ == "__main__":
    # the exit status (gvq/run/errors.py): 0; 2 a config error, one line naming the key; 1 a failed run; 3 a
    # run that stopped learning; 128 + the signal that interrupted it.  exit_fast ends the process without
    # the teardown of torch's modules (slow, and nothing left to free), or returns where that is not safe
    sys.exit(exit_fast(lambda: cli_status(main)))
