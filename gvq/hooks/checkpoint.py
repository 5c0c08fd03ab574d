"""Every rank's hook state in one checkpoint, for frameworks that write one file from rank 0.

accelerate's ``save_state`` and Lightning's ``save_checkpoint`` ask every rank for its objects' state but
write rank 0's only, and on resume every rank loads that one file.  A :class:`GvqHookState` is per rank
(error memories, dithers, samples): loaded from rank 0's file, every rank would carry rank 0's, which
:meth:`GvqHookState.load_state_dict` refuses.  :class:`AllRanks` is the state to hand such a framework:
its ``state_dict()`` gathers every rank's (a collective: every rank calls it, as those frameworks do) and
its ``load_state_dict()`` takes this rank's own::

    accelerator.register_for_checkpointing(AllRanks(state))   # then save_state / load_state as usual
"""
from __future__ import annotations

import torch.distributed as dist

from gvq.hooks.state import GvqHookState


class AllRanks:
    """Checkpoint view of ``state`` covering every rank (see the module docstring)."""

    def __init__(self, state: GvqHookState):
        self.state = state

    def state_dict(self) -> dict:
        """Every rank's ``state.state_dict()``, in rank order (a collective over the ranks the state
        averages among, on its own process group)."""
        mine = self.state.state_dict()
        ranks = [None] * mine["world_size"]
        dist.all_gather_object(ranks, mine, group=self.state.group)
        return {"world_size": mine["world_size"], "ranks": ranks}

    def load_state_dict(self, saved: dict) -> None:
        """This rank's entry of a :meth:`state_dict` (refused in one line from another world size)."""
        ctx = self.state.aggregator.ctx
        if saved["world_size"] != ctx.world_size:
            raise ValueError(f"gvq hook: a checkpoint of {saved['world_size']} ranks cannot resume on "
                             f"{ctx.world_size} (each rank's state is its own)")
        self.state.load_state_dict(saved["ranks"][ctx.rank])
