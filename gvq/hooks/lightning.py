"""The gvq hook in Lightning, as a callback (``pip install 'gvq[lightning]'``)::

    from gvq.hooks.lightning import GvqHook
    trainer = Trainer(strategy="ddp", callbacks=[GvqHook("qsgd")])       # accelerator="cpu" or "gpu"

Lightning's own ``DDPStrategy(ddp_comm_hook=...)`` registers a hook only on CUDA (on CPU it trains with
DDP's all-reduce, silently), and a state built before ``Trainer`` has no process group to size itself
by.  The callback builds the state in ``on_fit_start``, once the strategy has wrapped the model in
``DistributedDataParallel`` (on every device), registers :func:`gvq.hooks.gvq_hook` on that wrapper and
closes the state in ``teardown``.  Accumulation (``accumulate_grad_batches``: DDP's ``no_sync``) and
mixed precision need nothing more: the hook sees one averaging per optimizer step, in the gradients'
dtype.  Its checkpoint state is every rank's (:class:`gvq.hooks.checkpoint.AllRanks`: Lightning writes
rank 0's file), restored into the state it builds on resume (``fit(ckpt_path=...)``).
"""
from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy

from gvq.hooks.checkpoint import AllRanks
from gvq.hooks.config import build_aggregator, check_overrides
from gvq.hooks.state import GvqHookState, gvq_hook


class GvqHook(pl.Callback):
    """Average every optimizer step's gradients with a gvq option (``config`` and ``overrides`` as in
    :meth:`GvqHookState.from_config`; ``context``: its :class:`RunContext` fields, e.g. ``seed``)."""

    def __init__(self, config, overrides=None, **context):
        build_aggregator(config, **check_overrides(overrides))   # a bad name or knob: one line, before any rank starts
        self.config, self.overrides, self.context = config, overrides, context
        self.state: GvqHookState | None = None
        self._restored: dict | None = None       # a checkpoint's state, loaded before the model is wrapped

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        strategy = trainer.strategy
        if not isinstance(strategy, DDPStrategy):
            raise ValueError(f"GvqHook: Lightning strategy {type(strategy).__name__} is not DDP: the gvq "
                             "hook averages DDP's buckets (use strategy='ddp', 'ddp_spawn' or DDPStrategy)")
        # the DDP wrapper, not the module's parameters: its process group is the one averaged over
        self.state = GvqHookState.from_config(self.config, strategy.model, self.overrides, **self.context)
        if self._restored is not None:
            AllRanks(self.state).load_state_dict(self._restored)
            self._restored = None
        strategy.model.register_comm_hook(self.state, gvq_hook)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.state is not None:
            self.state.close()

    def state_dict(self) -> dict:
        """Every rank's state (a collective: Lightning asks every rank while it saves a checkpoint)."""
        return AllRanks(self.state).state_dict() if self.state is not None else {}

    def load_state_dict(self, state_dict: dict) -> None:
        self._restored = state_dict or None
