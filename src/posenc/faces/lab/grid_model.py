"""The image-grid lab model: a tiny bidirectional ViT-like encoder with a 2-D rotary encoding.

Each cell's token is embedded (no absolute table: every position the model reads
comes from its rotation), a learned CLS token is put first, and pre-norm blocks
attend without a causal mask through :func:`posenc.attention`; a linear head reads
the CLS token's final state. In every layer, the queries and keys of the patch tokens
are rotated by that layer's own module of the encoding (a module with learned
frequencies or generators learns them per layer); the CLS token is not rotated, as
DINOv3 (transformers ``DINOv3ViTModel``: ``apply_rotary_pos_emb`` skips the prefix
tokens) and RoPE-ViT (naver-ai/rope-vit ``models/vit_rope.py``: ``q[:, :, 1:]``)
leave it.

Shapes: tokens ``(batch, height * width)``; q, k, v ``(batch, heads, seq, head_dim)``
with ``seq = 1 + height * width``; logits ``(batch, classes)``.

A rotation module is any ``nn.Module`` with ``forward(q, k, coords) -> (q, k)`` and
``coords(height, width) -> (height * width, 2)``, the patch coordinates of its own
convention (row-major, as the tokens); :data:`posenc.lab.grid.ENCODINGS` names the
builder of each encoding's, ``(head_dim, heads) -> module``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from posenc.core import checks
from posenc.faces.lab.grid_tasks import DIRECTIONS, VOCAB
from posenc.families.rotary.multiaxis import AxialRotary, axial_grid, pixel_frequencies
from posenc.integration.attention import attention


class NoRotation(nn.Module):
    """The ``none`` line: queries and keys left as they are (the model reads no position)."""

    def __init__(self, head_dim: int, heads: int) -> None:
        super().__init__()

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, coords: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, k)`` unchanged."""
        return q, k

    def coords(self, height: int, width: int) -> torch.Tensor:
        """Zeros ``(height * width, 2)``: no cell is told apart."""
        return torch.zeros(height * width, 2)


class AxialCells(AxialRotary):
    """posenc's :class:`~posenc.rotary.multiaxis.AxialRotary` on integer ``(row, column)``.

    rotary-embedding-torch's ``get_axial_freqs`` with ``freqs_for="lang"`` (base
    10000): half the head's channels turn with the row, half with the column.
    """

    def __init__(self, head_dim: int, heads: int) -> None:
        super().__init__(head_dim, axes=2)

    def coords(self, height: int, width: int) -> torch.Tensor:
        """``(row, column)`` of each cell, row-major: ``axial_grid(height, width)``."""
        return axial_grid(height, width).flatten(0, 1)


class AxialPixels(AxialRotary):
    """:class:`AxialCells`' rotation on coordinates normalised to ``[-1, 1]``.

    rotary-embedding-torch's ``freqs_for="pixel"``: frequencies ``linspace(1, max_freq /
    2, n) * pi`` (:func:`~posenc.rotary.multiaxis.pixel_frequencies`, ``max_freq`` 10)
    on ``axial_grid(height, width, normalized=True)``: ``linspace(-1, 1, n)`` per axis,
    so a larger grid stays in the trained range.
    """

    def __init__(self, head_dim: int, heads: int) -> None:
        axis_dim = head_dim // 2 // 2 * 2
        super().__init__(head_dim, axes=2, freqs=pixel_frequencies(axis_dim, max_freq=10.0))

    def coords(self, height: int, width: int) -> torch.Tensor:
        """``(row, column)`` of each cell in ``[-1, 1]``, row-major."""
        return axial_grid(height, width, normalized=True).flatten(0, 1)


# ------------------------------------------------------------------ the model


class _Block(nn.Module):
    def __init__(self, d_model: int, heads: int, rotation: nn.Module) -> None:
        super().__init__()
        self.heads = heads
        self.rotation: Any = rotation  # forward(q, k, coords) and coords(height, width)
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        # the CLS token (first) is not rotated
        q_cells, k_cells = self.rotation(q[:, :, 1:], k[:, :, 1:], coords)
        q = torch.cat([q[:, :, :1], q_cells.to(q.dtype)], dim=2)
        k = torch.cat([k[:, :, :1], k_cells.to(k.dtype)], dim=2)
        y = attention(q, k, v)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GridEncoder(nn.Module):
    """A bidirectional encoder over a grid's cells, one 2-D encoding per model.

    Args:
        build: ``(head_dim, heads) ->`` one layer's rotation module (module docstring):
            the ``build`` of an encoding of :data:`posenc.lab.grid.ENCODINGS`.
        d_model: width.
        layers: blocks.
        heads: attention heads (``d_model`` divisible by it, head dim even).
        vocab: cell tokens.
        classes: outputs of the head.

    Raises:
        ValueError: sizes below 1, or a width that does not split into heads of an even
            size.
    """

    def __init__(
        self,
        build: Callable[[int, int], nn.Module],
        *,
        d_model: int = 64,
        layers: int = 2,
        heads: int = 4,
        vocab: int = VOCAB,
        classes: int = len(DIRECTIONS),
    ) -> None:
        super().__init__()
        for name, value in (("d_model", d_model), ("layers", layers), ("heads", heads),
                            ("vocab", vocab), ("classes", classes)):  # fmt: skip
            checks.check_int(value, name, minimum=1)
        if d_model % heads or (d_model // heads) % 2:
            raise ValueError(f"d_model ({d_model}) must split into heads ({heads}) of an even size")
        self.embed = nn.Embedding(vocab, d_model)
        self.cls = nn.Parameter(torch.randn(1, 1, d_model) * 0.02)
        self.blocks = nn.ModuleList(
            _Block(d_model, heads, build(d_model // heads, heads)) for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Logits ``(batch, classes)`` of ``tokens`` ``(batch, height * width)``, row-major.

        Raises:
            ValueError: ``tokens`` not ``(batch, height * width)``.
        """
        if tokens.ndim != 2 or tokens.shape[1] != height * width:
            raise ValueError(
                f"tokens must be (batch, {height} * {width}); got shape {tuple(tokens.shape)}"
            )
        x = torch.cat([self.cls.expand(tokens.shape[0], -1, -1), self.embed(tokens)], dim=1)
        # one set of coordinates per pass, shared by the layers (DINOv3 draws its training
        # augmentation once per forward pass, as its reference computes its tables once)
        first = cast(_Block, self.blocks[0])
        coords = first.rotation.coords(height, width).to(x.device)
        for block in self.blocks:
            x = block(x, coords)
        return self.head(self.norm(x[:, 0]))
