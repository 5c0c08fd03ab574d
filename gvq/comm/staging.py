"""Host staging for a process group that cannot carry device tensors.

gloo's point-to-point send of a CUDA tensor kills the process (``gloo::IoException ... Bad address``), and
NCCL cannot hold two ranks on one GPU, so ranks that share a GPU talk over gloo with every payload copied
through host memory: a send copies the device tensor into a host buffer and sends that; a receive lands
in a host buffer and is copied to the device tensor when it is waited for.  Buffers are pinned where CUDA
is present (faster, asynchronous-capable copies) and reused per (size, dtype), never while a message on
them is still in flight.  The copies' time is ``stage_s``: part of the aggregation's time (it is spent
inside it), also logged on its own.

:class:`gvq.comm.p2p.P2P` stages on its own whenever its process group is not NCCL and a tensor is not on
the host, so a device tensor never reaches gloo; ``stage=True`` stages every tensor, host ones included,
which is how the path is exercised on machines without a GPU.
"""
from __future__ import annotations

import time

import torch

from gvq.comm import clock


class HostStage:
    """A pool of host buffers and the staged copies; ``seconds``: time spent copying since ``reset``."""

    def __init__(self):
        self._free: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}
        self.seconds = 0.0
        self._pin = torch.cuda.is_available()

    def reset(self) -> None:
        self.seconds = 0.0

    def acquire(self, like: torch.Tensor) -> torch.Tensor:
        free = self._free.get((like.numel(), like.dtype))
        if free:
            return free.pop()
        return torch.empty(like.numel(), dtype=like.dtype, pin_memory=self._pin)

    def release(self, buf: torch.Tensor) -> None:
        self._free.setdefault((buf.numel(), buf.dtype), []).append(buf)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst.copy_(src)``, timed (synchronous: a send must not leave before its bytes are on the
        host, a received tensor must hold its bytes once its wait returns)."""
        t0 = time.perf_counter()
        with clock.get().blocked():                # a copy engine's time, not this rank's CPU's
            dst.copy_(src.reshape(dst.shape))
            if dst.is_cuda or src.is_cuda:
                torch.cuda.current_stream().synchronize()
        self.seconds += time.perf_counter() - t0

    def outgoing(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of ``tensor`` to send (released when the send is waited for)."""
        buf = self.acquire(tensor)
        self.copy(buf, tensor)
        return buf


class Staged:
    """A send or receive through a host buffer: P2P waits on ``handle`` (the real message), then calls
    ``finish``, which copies a received buffer into its device tensor and returns the buffer to the pool."""

    def __init__(self, handle, stage: HostStage, buf: torch.Tensor, dst: torch.Tensor | None = None):
        self.handle, self.stage, self.buf, self.dst = handle, stage, buf, dst
        self.finished = False

    def finish(self) -> None:
        if self.finished:
            return
        if self.dst is not None:
            self.stage.copy(self.dst, self.buf)
        self.stage.release(self.buf)
        self.finished = True
