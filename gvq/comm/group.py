"""Joining and leaving a rank's process group: the one way gvq's own ranks (the benches', the test helper's)
end theirs.

A rank that tears its group down while a peer still exchanges the last messages, or leaves DDP's reducer
(a reference cycle holding gloo work and its tensors) to the interpreter's finalization, can die with
SIGABRT ("terminate called without an active exception": a C++ thread destroyed while joinable, or a GIL
taken during finalization; pytorch/pytorch#179291).  So the clean path collects the cycles while the group
and the interpreter are alive, meets every peer at a barrier, and only then destroys the group.  A rank
leaving on an exception skips the barrier: its peers may be gone, and it would wait out the timeout.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager

import torch.distributed as dist


def leave(clean: bool) -> None:
    """Destroy the default group, after a garbage collection and a barrier when ``clean``."""
    try:
        if clean:
            gc.collect()            # a DDP model's cycles freed now, not during the interpreter's exit
            dist.barrier()          # no peer is still sending when the group goes away
    except RuntimeError:
        pass                        # a pair already closed (a handled timeout): no peer left to wait for
    finally:
        dist.destroy_process_group()


@contextmanager
def process_group(backend: str, **init):
    """``init_process_group(backend, **init)`` for the block; :func:`leave` after it (clean unless it
    raised).  Objects built in the block should not outlive it: build them in a function the block calls."""
    dist.init_process_group(backend, **init)
    clean = False
    try:
        yield
        clean = True
    finally:
        leave(clean)
