"""gvq command line: ``python cli.py [key=value ...]`` trains one run; ``-m`` sweeps.

    python cli.py                                   # default: small CNN on digits, 2 ranks, rar
    python cli.py -m aggregator=rar world_size=2,4  # a sweep under runs/multirun/
"""
import hydra

from gvq.run.errors import one_line_errors
from gvq.run.schema import register

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg):
    from gvq.run.launch import launch
    launch(cfg)


if __name__ == "__main__":
    one_line_errors(main)       # Hydra's composition errors as one line naming the key (exit 2)
