"""gvq command line: ``python cli.py [key=value ...]`` trains one run; ``-m`` sweeps.

    python cli.py                                   # default: small CNN on digits, 2 ranks, rar
    python cli.py -m aggregator=rar world_size=2,4  # a sweep under runs/multirun/
"""
import hydra

from gvq.run.errors import one_line_errors
from gvq.run.schema import register
from gvq.run.warm import start_fork_server

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg):
    from gvq.run.launch import launch
    launch(cfg)


if __name__ == "__main__":          # (ranks import this file too: they must not start servers)
    start_fork_server()         # the ranks' imports start now, on another core (gvq/run/warm.py)
    one_line_errors(main)       # Hydra's composition errors as one line naming the key (exit 2)
