"""The layout every lab task shares: its special tokens and :class:`Batch`.

:mod:`posenc.lab.tasks` and :mod:`posenc.lab.suite_tasks` both make batches of this
layout; the names are re-exported from :mod:`posenc.lab.tasks`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["BOS", "EOS", "IGNORE", "PAD", "PLUS", "SEP", "Batch"]

#: Special tokens shared by every task.
PAD, BOS, SEP, EOS = 0, 1, 2, 3
#: Target value of positions that are not scored (``cross_entropy``'s default ``ignore_index``).
IGNORE = -100
#: The ``+`` between the two operands of ``addition`` (same id as recall's first key; tasks
#: never share a model, so ids only need to be unique within a task).
PLUS = 14


@dataclass(frozen=True)
class Batch:
    """A batch of examples that all have the same task length.

    Attributes:
        tokens: ``(batch, seq)`` int64 input ids, right-padded with :data:`PAD`.
        targets: ``(batch, seq)`` int64; ``targets[b, t]`` is the token the model must
            predict at position ``t`` (``tokens[b, t + 1]`` where scored) and
            :data:`IGNORE` where the position is not scored.
        length: The task length ``n`` every example in the batch has (for text, the
            window length, which equals ``seq``); for a task drawing lengths per
            example (the arithmetic formats' training), the longest it drew from.
        significance: ``(batch, seq)`` int64, the arithmetic tasks' layout of their
            numbers (:mod:`posenc.families.arithmetic`: a digit's power of ten, -1 after
            a number, -2 elsewhere), which Abacus and position coupling read; None
            for the other tasks.
    """

    tokens: torch.Tensor
    targets: torch.Tensor
    length: int
    significance: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> Batch:
        """The batch with every tensor on ``device``."""
        places = None if self.significance is None else self.significance.to(device)
        return Batch(self.tokens.to(device), self.targets.to(device), self.length, places)

    def rows(self, rows: slice) -> Batch:
        """The examples ``rows`` of the batch."""
        places = None if self.significance is None else self.significance[rows]
        return Batch(self.tokens[rows], self.targets[rows], self.length, places)

    @property
    def scored(self) -> tuple[int, int]:
        """``(start, stop)``: columns ``start .. stop - 1``, the first scored target to the last.

        A synthetic task scores from ``SEP``'s column to the one before ``EOS``, text
        every column; a batch scoring nothing gives every column.
        """
        columns = (self.targets != IGNORE).any(dim=0).nonzero()
        if columns.numel() == 0:
            return 0, self.targets.shape[1]
        return int(columns[0]), int(columns[-1]) + 1
