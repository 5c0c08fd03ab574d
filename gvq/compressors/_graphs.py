"""A codec call captured once as a CUDA graph and replayed (``Graphed``): on a GPU a call of a few ops still
pays a launch and Python dispatch per op; a graph replays all of them in one launch.

Only for calls whose shapes and buffers are fixed between refits and that draw no random numbers (the
graph would replay the same draws): GradiVeQ's batched plans.  Capture happens on the first call on a CUDA
tensor, after two warm-up calls on a side stream, and is checked once against the eager call; a capture
refused (an op that cannot be captured, an older driver) or a replay that differs falls back to the eager
call for good, with one warning.  Elsewhere (the host, meta) the call runs as it is.  ``GVQ_CUDA_GRAPHS=0``
turns capture off (eager on the GPU too: the reference to compare a graph against).
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch
from torch import Tensor


def capturing(x: Tensor) -> bool:
    return x.device.type == "cuda" and os.environ.get("GVQ_CUDA_GRAPHS", "1") != "0"


class Graphed:
    """``Graphed(fn)(x)``: ``fn(x)`` (one tensor in, one out), replayed from a CUDA graph where it can be;
    the result is a fresh tensor (a copy of the graph's output), as the eager call's is."""

    def __init__(self, fn: Callable[[Tensor], Tensor], what: str):
        self.fn, self.what = fn, what
        self.captured: tuple | None = None
        self.refused = False

    def __call__(self, x: Tensor) -> Tensor:
        if self.refused or not capturing(x):
            return self.fn(x)
        if self.captured is None or self.captured[1].shape != x.shape or self.captured[1].dtype != x.dtype:
            self.captured = self._capture(x)
            if self.captured is None:
                return self.fn(x)
        graph, static_in, static_out = self.captured
        static_in.copy_(x)
        graph.replay()
        return static_out.clone()

    def _capture(self, x: Tensor):
        try:
            static_in = x.clone()
            side = torch.cuda.Stream(x.device)
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):
                for _ in range(2):                 # warm-up: lazy allocations happen outside the graph
                    self.fn(static_in)
            torch.cuda.current_stream(x.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = self.fn(static_in)
            graph.replay()
            eager = self.fn(x)                     # once: the replay must be the eager call
            if not torch.allclose(static_out, eager, rtol=1e-4, atol=1e-6, equal_nan=True):
                raise RuntimeError("the replayed graph differs from the eager call")
            return graph, static_in, static_out
        except RuntimeError as e:
            self.refused = True
            warnings.warn(f"gvq: {self.what}: CUDA graph refused ({str(e).splitlines()[0][:160]}); "
                          "running it eagerly", RuntimeWarning, stacklevel=3)
            return None
