"""The lab's model: a small decoder-only transformer assembled from posenc's pieces.

Token embedding, plus an absolute encoding for the encodings that have one
(:func:`posenc.sinusoidal` exact tables, or a learned table); pre-norm blocks
whose attention is :func:`posenc.attention` with a rotary encoding
(:class:`posenc.Rotary`, xPos) and/or a bias module (:mod:`posenc.bias`);
causal throughout.

Encodings (:data:`ENCODINGS`):

- ``nope``: nothing but the causal mask (Kazemnejad et al. 2023);
- ``sinusoidal``, ``learned``: absolute, added to the token embedding;
- ``rope``; ``rope-linear``, ``rope-ntk``, ``rope-yarn``: the same trained RoPE
  model, evaluated with that scaling schedule applied at test time (factor:
  evaluated length over the longest trained one);
- ``xpos`` (Sun et al. 2022);
- ``alibi``, ``t5`` (decoder buckets), ``kerple`` (log), ``fire``,
  ``sandwich``: attention biases;
- ``randomized``: RoPE at positions drawn as a sorted random subset of
  ``0 .. max_positions - 1`` for every batch, in training and evaluation
  (Ruoss et al. 2023), so that longer test sequences use positions already seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import posenc
from posenc.core import checks
from posenc.faces.lab.names import ENCODINGS

__all__ = ["ENCODINGS", "TEST_TIME_SCALING", "LabModel", "ModelConfig", "training_encoding"]


#: Encodings that are RoPE in training and a scaling schedule at test time.
TEST_TIME_SCALING = {"rope-linear": "linear", "rope-ntk": "ntk", "rope-yarn": "yarn"}


def training_encoding(encoding: str) -> str:
    """The encoding a model is trained with (test-time scaling variants train as ``rope``)."""
    checks.check_choice(encoding, "encoding", ENCODINGS)
    return "rope" if encoding in TEST_TIME_SCALING else encoding


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

    def forward(self, x: torch.Tensor, attend: Any) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class LabModel(nn.Module):
    """A causal transformer with one positional encoding from :data:`ENCODINGS`.

    Args:
        config: sizes.
        encoding: the encoding; test-time scaling variants build the ``rope``
            model (they differ only in :meth:`forward`'s ``scaling``).
    """

    def __init__(self, config: ModelConfig, encoding: str) -> None:
        super().__init__()
        self.config = config
        self.encoding = training_encoding(encoding)
        d, h = config.d_model, config.heads
        # token and learned position embeddings start at unit scale, as the sinusoidal
        # table has amplitude 1: no encoding starts drowned by the tokens or drowning them
        self.embed = nn.Embedding(config.vocab, d)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, config.vocab, bias=False)
        self.learned: nn.Embedding | None = None
        self.bias: nn.Module | None = None
        if self.encoding == "learned":
            self.learned = nn.Embedding(config.max_positions, d)
        biases = {
            "alibi": lambda: posenc.ALiBi(h),
            "t5": lambda: posenc.T5Bias(h, bidirectional=False),
            "kerple": lambda: posenc.KERPLE(h),
            "fire": lambda: posenc.FIRE(h),
            "sandwich": lambda: posenc.Sandwich(h, dim=config.head_dim),
        }
        if self.encoding in biases:
            self.bias = biases[self.encoding]()  # one module shared by every layer

    def _rotary(self, scaling: dict[str, Any] | None) -> Any:
        # one Rotary per schedule, kept out of the state dict: its tables are a cache
        key = repr(sorted((scaling or {}).items()))
        cache: dict[str, Any] = self.__dict__.setdefault("_ropes", {})
        if key not in cache:
            cache[key] = posenc.Rotary(self.config.head_dim, scaling=scaling)
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
                encodings that have a limit (learned, randomized).
        """
        t = tokens.shape[1]
        enc, device = self.encoding, tokens.device
        if enc in ("learned", "randomized") and t > self.config.max_positions:
            raise ValueError(
                f"sequence of {t} tokens is longer than max_positions="
                f"{self.config.max_positions} ({enc} has no positions beyond)"
            )
        x = self.embed(tokens)
        if enc == "sinusoidal":
            pe = posenc.sinusoidal(torch.arange(t, device=device), self.config.d_model)
            x = x + pe.to(x.dtype)
        elif self.learned is not None:
            x = x + self.learned(torch.arange(t, device=device))
        attend = self._attend(t, device, scaling, generator)
        for block in self.blocks:
            x = block(x, attend)
        return self.head(self.ln(x))

    def _attend(
        self,
        t: int,
        device: torch.device,
        scaling: dict[str, Any] | None,
        generator: torch.Generator | None,
    ) -> Any:
        enc = self.encoding
        if scaling is not None and enc != "rope":
            raise ValueError(f"test-time scaling applies to rope only; this model is {enc!r}")
        if enc == "rope":
            rope = self._rotary(scaling)
            return lambda q, k, v: posenc.attention(q, k, v, rotary=rope, causal=True)
        if enc == "randomized":
            rope = self._rotary(None)
            draw = torch.randperm(self.config.max_positions, generator=generator)[:t]
            positions = draw.sort().values.to(device)

            def randomized(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                q, k = rope(q, k, positions=positions)
                return posenc.attention(q, k, v, causal=True)

            return randomized
        if enc == "xpos":
            from posenc.families.rotary.multiaxis import xpos_rotate
            from posenc.families.rotary.schedules import frequencies

            freqs = frequencies("default", self.config.head_dim, 10000.0)

            def xpos(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                q, k = xpos_rotate(q, k, freqs, layout="half")
                return posenc.attention(q, k, v, causal=True)

            return xpos
        bias = self.bias
        return lambda q, k, v: posenc.attention(q, k, v, bias=bias, causal=True)


def scaling_for(encoding: str, length: int, trained: int) -> dict[str, Any] | None:
    """The ``rope_scaling`` a test-time scaling encoding uses at ``length`` tokens.

    None within the trained length and for other encodings; beyond it, the
    schedule with factor ``length / trained`` (YaRN with the trained length as
    its original one).
    """
    kind = TEST_TIME_SCALING.get(encoding)
    if kind is None or length <= trained:
        return None
    factor = math.ceil(100 * length / trained) / 100
    if kind == "yarn":
        return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": trained}
    return {"rope_type": kind, "factor": factor}
