"""``hydra/sweeper=gvq`` (the default, conf/config.yaml; its config conf/hydra/sweeper/gvq.yaml): Hydra's basic
sweeper, whose jobs are the cartesian product of the overrides, less each override a job's option lacks while
another option swept beside it has it (:func:`gvq.run.sweep.applicable_jobs`): ``-m method=every_step,diloco
method.every=10,30,100`` runs every_step once and diloco three times.  What it runs is what
:class:`gvq.run.sweep.SweepCheck` checked before the first job."""
from typing import Any, List, Optional

from gvq.comm.internals import hydra_basic_sweeper
from gvq.run.sweep import applicable_jobs


class GvqSweeper(hydra_basic_sweeper()):
    def sweep(self, arguments: List[str]) -> Any:
        self.choices = dict(self.config.hydra.runtime.choices)   # a group's option where a job names none
        return super().sweep(arguments)

    def split_arguments(self, overrides, max_batch_size: Optional[int]) -> List[List[List[str]]]:
        jobs = applicable_jobs(super().split_arguments(overrides, None)[0], self.choices)
        n = max_batch_size or max(1, len(jobs))
        return [jobs[i: i + n] for i in range(0, len(jobs), n)]
