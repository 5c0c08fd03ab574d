"""The method contract: what a rank does from "gradients computed" to "parameters updated", and when it
syncs.  ``python cli.py method=every_step|local_sgd|diloco|streaming_diloco|demo`` (conf/method/).

The training loop (:func:`gvq.run.train.step`) calls, every iteration, :meth:`Method.before_step` once
the gradients are checked (every_step: the aggregator averages them), the inner optimizer's step, then
:meth:`Method.after_step` (local SGD, DiLoCo: at a sync, parameters or the pseudo-gradient averaged
through the same aggregator).  The loop evaluates and checks the replicas on :meth:`synced_parameters`,
and checkpoints :meth:`state_dict`.  Anchors: epfml/powersgd's ``optimizer_step(optimizer,
aggregator)``; torchft's DiLoCo, which fires from the inner optimizer's step post-hook.
"""
from __future__ import annotations

import contextlib

import torch

from gvq.aggregators.base import Aggregator, RunContext
from gvq.schema import columns


class Method:
    """The one contract every ``conf/method`` option satisfies; every member has the default of a method
    that averages the gradients every step (:class:`gvq.methods.every_step.EveryStep` is this class
    named).  Call order: :meth:`check` and :meth:`check_run` (before any rank starts), :meth:`setup`
    (after the aggregator's ``setup`` and ``wrap``, replicas already identical), then per iteration
    :meth:`before_step`, the inner optimizer's step, :meth:`after_step`; :meth:`state_dict` /
    :meth:`load_state_dict` around checkpoints (after :meth:`setup`); :meth:`close` at the end.  The loop
    calls :meth:`aggregator_context` before the aggregator's ``setup``."""

    #: its value of ``method=`` (logs, summary)
    name: str = "method"
    #: extra per-iteration CSV columns it reports (declared in gvq/schema/columns.py)
    extra_fields: tuple[str, ...] = ()

    def check(self, agg: Aggregator) -> None:
        """Raise a one-line ``ValueError`` if ``agg`` cannot move what this method sends (the launcher's
        preflight calls it before any rank starts; :meth:`setup` again).  Default: any aggregator."""

    def check_run(self, cfg: dict) -> None:
        """Raise a one-line ``ValueError`` if the rest of the run (``cfg``: the composed run config as a
        dict; its ``optim``, ``net`` ...) cannot serve this method (DeMo: it decodes the step's direction
        itself, so the inner optimizer must be momentum-free SGD).  Config validation calls it, and the
        loop's :func:`gvq.run.train.build_method` again.  Default: any run."""

    def aggregator_context(self, ctx: RunContext) -> RunContext:
        """The context the run's aggregator is set up in, from the run's ``ctx`` (called on every rank, before
        the aggregator's ``setup``): which ranks exchange what this method sends.  Default: ``ctx``, every
        rank (DiLoCo with ``method.workers=node``: one rank of every node)."""
        return ctx

    def setup(self, params: list[torch.nn.Parameter], agg: Aggregator) -> None:
        """Bind to this rank's parameters and the aggregator that moves what it sends."""
        self.check(agg)
        self.agg = agg

    # -- the schedule ------------------------------------------------------------------------------------
    def syncs(self, iteration: int) -> bool:
        """Whether the ranks communicate in ``iteration`` (gradients, parameters or a pseudo-gradient)."""
        return True

    def averages_gradients(self, iteration: int) -> bool:
        """Whether ``iteration``'s gradients are averaged before the inner step (the loop then checks the
        average for an overflow); False: every rank steps on its own gradients."""
        return True

    # -- one iteration -----------------------------------------------------------------------------------
    def before_step(self, iteration: int) -> dict:
        """After backward, before the inner step: the gradients averaged (:meth:`averages_gradients`), or
        left local with the columns of a step that sent nothing.  Returns the iteration's measurements."""
        if self.averages_gradients(iteration):
            return {**self.agg.aggregate(iteration), **self.sync_marker(True)}
        return {**columns.unsynced_row(), **self.sync_marker(False)}

    def after_step(self, iteration: int) -> dict:
        """After the inner optimizer's step: a method that syncs parameters does it here, returning its
        measurements (they replace :meth:`before_step`'s).  Default: nothing."""
        return {}

    def sync_marker(self, synced: bool) -> dict:
        """The ``synced`` column where the method logs it (:attr:`extra_fields`)."""
        return {"synced": int(synced)} if "synced" in self.extra_fields else {}

    def synced_parameters(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """A context in which ``model`` holds the parameters every rank agrees on (the last sync's):
        what evaluation scores and the replica check compares.  Default: the parameters as they are."""
        return contextlib.nullcontext()

    # -- checkpoints ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What a checkpoint must keep for a bitwise resume (tensors, numbers).  Default: nothing."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output (after :meth:`setup`)."""

    def close(self) -> None:
        """Release what :meth:`setup` opened besides the run's aggregator (its own transport).  Default: nothing."""
