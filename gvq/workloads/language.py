"""Next-token prediction on windows of token ids (Austen's novels, any text file): the loss per token, and
bits per byte, which compare across tokenizers (``bytes_per_token``: the held-out text's bytes over its
tokens; 1 for byte tokens)."""
from __future__ import annotations

import math

import torch

from gvq.workloads.base import Workload


class LanguageModelling(Workload):
    """Inputs ``(T,)`` token ids, targets the next token at each of the ``T`` positions; ``num_classes`` is
    the vocabulary.  The model takes ids: one input channel."""

    #: a text run's columns: bits per byte on evaluation rows, tokens per second (all ranks) on every row
    extra_fields = ("test_bpb", "tokens_per_second")

    def __init__(self, num_classes: int, context: int, bytes_per_token: float = 1.0):
        super().__init__(num_classes, (context,))
        self.bytes_per_token = float(bytes_per_token)

    @property
    def in_channels(self) -> int:
        return 1

    @property
    def context(self) -> int:
        return self.sample_shape[0]

    def synthetic_batch(self, batch: int, generator: torch.Generator | None = None):
        """Windows of random ids and a random next token per position (inputs first, as one generator draws)."""
        return (torch.randint(0, self.num_classes, (batch, *self.sample_shape), generator=generator),
                torch.randint(0, self.num_classes, (batch, *self.sample_shape), generator=generator))

    def bits_per_byte(self, loss: float) -> float:
        """Nats per token as bits per byte: over ln 2, then over the bytes a token holds."""
        return loss / math.log(2) / self.bytes_per_token

    def row_metrics(self, row: dict, targets: int, step_s: float) -> None:
        if "test_loss" in row:
            row["test_bpb"] = self.bits_per_byte(row["test_loss"])
        row["tokens_per_second"] = targets / step_s if step_s > 0 else float("nan")

    def summary_metrics(self, test_loss: float, samples: int, wall_s: float) -> dict:
        return {"final_test_bpb": self.bits_per_byte(test_loss),
                "tokens_per_second": samples * self.context / wall_s}
