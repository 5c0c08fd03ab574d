"""The workload contract: what a run trains on, seen by every tool that runs a model -- the loss of a model's
output on a batch, what it counts as correct, the metrics it adds to a row and a summary, and the inputs a
benchmark's timed step feeds the model (one input's shape, the channels the model is built with, a synthetic
batch).

The training loop (:mod:`gvq.run.train`: ``step``, ``evaluate``), the benchmarks (``gvq.bench train``,
``overlap``), the calibrations (``gvq.predict``) and the recorded gradients (``gvq.analysis``) all ask one
:class:`Workload` (built by :mod:`gvq.workloads.build`), so none of them guesses a shape or a loss from a
model's name.  One kind per file: :mod:`~gvq.workloads.classification` (an image, one label),
:mod:`~gvq.workloads.language` (a window of tokens, a next token per position).
"""
from __future__ import annotations

import abc

import torch
import torch.nn.functional as F


class Workload(abc.ABC):
    """``num_classes`` (labels, or a language model's vocabulary) and ``sample_shape`` (one input's shape:
    ``(C, H, W)`` or ``(T,)``)."""

    #: the columns this kind adds to every row (declared in gvq/schema/columns.py); none by default
    extra_fields: tuple[str, ...] = ()

    def __init__(self, num_classes: int, sample_shape: tuple[int, ...]):
        self.num_classes = int(num_classes)
        self.sample_shape = tuple(int(s) for s in sample_shape)

    @property
    @abc.abstractmethod
    def in_channels(self) -> int:
        """The channels the model is built with for these inputs."""

    @abc.abstractmethod
    def synthetic_batch(self, batch: int, generator: torch.Generator | None = None):
        """Random ``(x, y)`` of ``batch`` inputs, as a timed step needs them (values do not matter, shapes
        and dtypes do)."""

    def loss(self, out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy per target: a ``(B, C)`` output per image, a ``(B, T, V)`` one per token (both
        flatten to one row of logits a target)."""
        return F.cross_entropy(out.flatten(0, -2), y.flatten(), reduction=reduction)

    def correct(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per target, whether the most likely class is the target's (accuracy is its mean)."""
        return out.argmax(-1) == y

    def row_metrics(self, row: dict, targets: int, step_s: float) -> None:
        """Add this kind's columns to ``row`` (an evaluation row holds ``test_loss``); ``targets`` scored by
        all ranks in the ``step_s`` seconds since the last row.  None by default."""
        return None

    def summary_metrics(self, test_loss: float, samples: int, wall_s: float) -> dict:
        """The summary's keys of this kind, from the final ``test_loss`` and ``samples`` trained on (all
        ranks, all iterations) in ``wall_s``.  None by default."""
        return {}
