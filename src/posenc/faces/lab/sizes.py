"""The lab model's sizes: :class:`ModelConfig`, apart from the model so that the
encodings' registry can name it without importing the model."""

from __future__ import annotations

from dataclasses import dataclass

from posenc.core import checks


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the lab's transformer.

    Attributes:
        vocab: tokens.
        d_model: width.
        layers: blocks.
        heads: attention heads (``d_model`` divisible by it, head dim even).
        max_positions: positions the model may see (the learned table's size,
            the range ``randomized`` draws from): at least the longest test
            sequence.
        trained_positions: the longest sequence of training, for the encodings
            that read it (FoPE drops the frequencies that turn less than once
            over it); None: ``max_positions``.
        max_ids: the rows of the learned table of the encodings whose ids come from
            the layout of the numbers (Abacus, coupling): the widest test number's
            columns plus 2 (row 0 and the after-number id), the range both papers
            draw their offsets in (McLeish et al. 2024's ``max_k`` about the test
            digits, Cho et al. 2024's ``max_position``); None: ``max_positions``.
    """

    vocab: int
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    max_positions: int = 256
    trained_positions: int | None = None
    max_ids: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "layers", "heads", "max_positions"):
            checks.check_int(getattr(self, name), name, minimum=1)
        for name in ("trained_positions", "max_ids"):
            if getattr(self, name) is not None:
                checks.check_int(getattr(self, name), name, minimum=1)
        if self.d_model % self.heads or (self.d_model // self.heads) % 2:
            raise ValueError(
                f"d_model ({self.d_model}) must split into heads ({self.heads}) of an even size"
            )

    @property
    def id_rows(self) -> int:
        """The rows of a table read at ids of the numbers' layout (``max_ids``, else
        ``max_positions``)."""
        return self.max_ids or self.max_positions

    @property
    def head_dim(self) -> int:
        """Channels per attention head: the width over the head count."""
        return self.d_model // self.heads
