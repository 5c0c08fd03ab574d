"""Building every run's aggregator from its config node (the runner, the launcher's checks and the
benchmarks all call :func:`aggregator_from`), and the one decision where it averages.

``aggregator.overlap`` and ``aggregator.bucket_cap_mb`` are the run's keys, not the aggregator's: they
are taken out of the node, the rest is instantiated (:func:`gvq.hooks.config.instantiate_aggregator`,
which the hook's ``build_aggregator`` calls too, never wrapping: its caller's DDP is the wrapper), and
``overlap: true`` wraps the result in :class:`gvq.hooks.overlapped.Overlapped`.
"""
from __future__ import annotations

from gvq.aggregators.base import Aggregator
from gvq.hooks.config import instantiate_aggregator
from gvq.hooks.overlapped import Overlapped


def aggregator_from(node, **kwargs) -> Aggregator:
    """The aggregator an ``aggregator`` config node builds (a DictConfig or a dict), and the one decision
    where it averages: ``overlap: true`` wraps it in :class:`Overlapped` (inside backward, in DDP's
    buckets of ``bucket_cap_mb``), else it is returned as built (after backward).  ``kwargs`` go to
    ``hydra.utils.instantiate``.  A one-line ValueError where it cannot be wrapped."""
    agg, run = instantiate_aggregator(node, **kwargs)
    return Overlapped(agg, run.get("bucket_cap_mb")) if run.get("overlap") else agg
