"""The lab's model: a small decoder-only transformer assembled from posenc's pieces.

Token embedding, plus the absolute table of the encodings that have one (the
exact sinusoidal table, or a learned one); pre-norm blocks whose attention is
:func:`posenc.attention`, causal throughout, with the encoding's rotation of
queries and keys (:class:`posenc.Rotary`, xPos) and/or its bias module
(:mod:`posenc.bias`). What each encoding builds is data: its
:class:`~posenc.lab.encodings.Encoding` in :data:`posenc.lab.encodings.REGISTRY`.

Shapes: tokens ``(batch, seq)``; logits ``(batch, seq, vocab)``; q, k, v
``(batch, heads, seq, head_dim)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from posenc.core import checks
from posenc.faces.lab.encodings import (
    ENCODINGS,
    REGISTRY,
    Encoding,
    lookup,
    scaling_for,
    training_encoding,
)
from posenc.families.absolute.sinusoidal import sinusoidal
from posenc.families.bias.modules import AttentionBias
from posenc.families.rotary.module import Rotary
from posenc.families.rotary.multiaxis import xpos_rotate
from posenc.families.rotary.schedules import frequencies
from posenc.integration.attention import attention

__all__ = [
    "ENCODINGS",
    "TEST_TIME_SCALING",
    "LabModel",
    "ModelConfig",
    "scaling_for",
    "training_encoding",
]

#: Encodings that are another encoding's model in training and a rope scaling at test time.
TEST_TIME_SCALING = {e.name: e.test_scaling for e in REGISTRY.values() if e.test_scaling}
# the trained models that accept a rope scaling at test time
_SCALABLE = tuple(
    sorted({e.trains_as for e in REGISTRY.values() if e.test_scaling and e.trains_as})
)

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (q, k, v) -> out
AttentionFor = Callable[
    ["LabModel", int, torch.device, "dict[str, Any] | None", "torch.Generator | None"], Attend
]


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
    """

    vocab: int
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    max_positions: int = 256

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "layers", "heads", "max_positions"):
            checks.check_int(getattr(self, name), name, minimum=1)
        if self.d_model % self.heads or (self.d_model // self.heads) % 2:
            raise ValueError(
                f"d_model ({self.d_model}) must split into heads ({self.heads}) of an even size"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


# ------------------------------------------------------------------ absolute tables


class _SinusoidalTable(nn.Module):
    """The exact sinusoidal table (Vaswani et al. 2017, section 3.5); no parameters."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.d_model = config.d_model

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return sinusoidal(positions, self.d_model)


def _learned_table(config: ModelConfig) -> nn.Module:
    return nn.Embedding(config.max_positions, config.d_model)


#: :attr:`Encoding.absolute` -> the table's builder; tables map positions ``(seq,)`` to
#: ``(seq, d_model)``.
_ABSOLUTE_TABLES: dict[str, Callable[[ModelConfig], nn.Module]] = {
    "sinusoidal": _SinusoidalTable,
    "learned": _learned_table,
}


# ------------------------------------------------------------------ attention per rotation


def _rope_attention(
    model: LabModel,
    t: int,
    device: torch.device,
    scaling: dict[str, Any] | None,
    generator: torch.Generator | None,
) -> Attend:
    rope, bias = model._rotary(scaling), model.bias
    if not model.spec.random_positions:
        return lambda q, k, v: attention(q, k, v, bias=bias, rotary=rope, causal=True)
    # a sorted random subset of every position the model may see, so that test lengths
    # beyond the trained ones use positions already trained on (Ruoss et al. 2023)
    draw = torch.randperm(model.config.max_positions, generator=generator)[:t]
    positions = draw.sort().values.to(device)

    def randomized(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k = rope(q, k, positions=positions)
        return attention(q, k, v, bias=bias, causal=True)

    return randomized


def _xpos_attention(
    model: LabModel,
    t: int,
    device: torch.device,
    scaling: dict[str, Any] | None,
    generator: torch.Generator | None,
) -> Attend:
    freqs = frequencies("default", model.config.head_dim, 10000.0)
    bias = model.bias

    def xpos(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k = xpos_rotate(q, k, freqs, layout="half")
        return attention(q, k, v, bias=bias, causal=True)

    return xpos


def _unrotated_attention(
    model: LabModel,
    t: int,
    device: torch.device,
    scaling: dict[str, Any] | None,
    generator: torch.Generator | None,
) -> Attend:
    bias = model.bias
    return lambda q, k, v: attention(q, k, v, bias=bias, causal=True)


#: :attr:`Encoding.rotary` -> the attention of one forward pass over ``t`` tokens.
_ATTENTION: dict[str | None, AttentionFor] = {
    "rope": _rope_attention,
    "xpos": _xpos_attention,
    None: _unrotated_attention,
}


# ------------------------------------------------------------------ the model


class _Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.heads = config.heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, attend: Attend) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class LabModel(nn.Module):
    """A causal transformer with one positional encoding from :data:`ENCODINGS`.

    Args:
        config: sizes.
        encoding: the encoding; test-time scaling variants build the model of
            the encoding they train as (they differ only in :meth:`forward`'s
            ``scaling``).

    Attributes:
        encoding: the name of the encoding the model is trained with.
        spec: its :class:`~posenc.lab.encodings.Encoding`.
    """

    def __init__(self, config: ModelConfig, encoding: str) -> None:
        super().__init__()
        self.config = config
        self.spec: Encoding = lookup(training_encoding(encoding))
        self.encoding = self.spec.name
        d = config.d_model
        # token and learned position embeddings start at unit scale, as the sinusoidal
        # table has amplitude 1: no encoding starts drowned by the tokens or drowning them
        self.embed = nn.Embedding(config.vocab, d)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, config.vocab, bias=False)
        if self.spec.absolute is not None:
            # named by its kind, so that a learned table is saved as "learned.weight"
            self.add_module(self.spec.absolute, _ABSOLUTE_TABLES[self.spec.absolute](config))
        self.bias: AttentionBias | None = None
        if self.spec.bias is not None:
            self.bias = self.spec.bias(config.heads, config.head_dim)  # shared by every layer

    def _rotary(self, scaling: dict[str, Any] | None) -> Rotary:
        # one Rotary per schedule, kept out of the state dict: its tables are a cache
        key = repr(sorted((scaling or {}).items()))
        cache: dict[str, Rotary] = self.__dict__.setdefault("_ropes", {})
        if key not in cache:
            cache[key] = Rotary(self.config.head_dim, scaling=scaling)
        return cache[key]

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        scaling: dict[str, Any] | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Logits ``(batch, seq, vocab)`` of ``tokens`` ``(batch, seq)``.

        Args:
            tokens: int64 ids.
            scaling: an HF-style ``rope_scaling`` dict for the RoPE model at test
                time (``{"rope_type": "linear", "factor": 2.0}``).
            generator: the randomness of ``randomized`` positions (a new random
                subset per call otherwise).

        Raises:
            ValueError: a sequence longer than ``max_positions`` for the
                encodings that have a limit (learned, randomized); a ``scaling``
                for a model that does not scale at test time.
        """
        t = tokens.shape[1]
        spec, device = self.spec, tokens.device
        if spec.limited and t > self.config.max_positions:
            raise ValueError(
                f"sequence of {t} tokens is longer than max_positions="
                f"{self.config.max_positions} ({spec.name} has no positions beyond)"
            )
        if scaling is not None and spec.name not in _SCALABLE:
            raise ValueError(
                f"test-time scaling applies to {', '.join(_SCALABLE)} only; "
                f"this model is {spec.name!r}"
            )
        x = self.embed(tokens)
        if spec.absolute is not None:
            table = self.get_submodule(spec.absolute)
            x = x + table(torch.arange(t, device=device)).to(x.dtype)
        attend = _ATTENTION[spec.rotary](self, t, device, scaling, generator)
        for block in self.blocks:
            x = block(x, attend)
        return self.head(self.ln(x))
