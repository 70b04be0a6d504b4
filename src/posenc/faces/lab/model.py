"""The lab's model: a small decoder-only transformer assembled from posenc's pieces.

Token embedding, plus the absolute table of the encodings that have one (the
exact sinusoidal table, or a learned one); pre-norm blocks whose attention is
:func:`posenc.attention`, causal throughout, with the encoding's rotation of
queries and keys (:class:`posenc.Rotary`, xPos; in every layer, or all but
every k-th for ``hybrid-nope``) and/or its bias module (:mod:`posenc.bias`).
What each encoding builds is data: its :class:`~posenc.lab.encodings.Encoding`
in :data:`posenc.lab.encodings.REGISTRY`.

Shapes: tokens ``(batch, seq)``; logits ``(batch, seq, vocab)``; q, k, v
``(batch, heads, seq, head_dim)``.

A forward pass may ask for the logits of a span of positions only (the answer
of a task, which is all a loss or an exact match reads): the positions after
it are never computed, as no earlier one attends to them, and the last block
computes its queries, and everything after attention, for the span alone,
every key and value still computed. Each query keeps its own position in every
encoding (rotations, tables and randomized draws are those of the whole
sequence), so the span's logits are those rows of the whole pass.

Under context parallelism (:class:`ContextParallel`) a forward pass holds one
rank's shard of every sequence: its tokens in the ``"zigzag"`` layout of
:mod:`posenc.context_parallel` (Megatron's load balancing), the sequences
right-padded to whole chunks. Every encoding is computed at the shard's global
positions (the whole sequence's positions, randomized draws included, sharded
like the tokens), and attention is ring attention over the group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

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
from posenc.families.bias.forget import ForgetGate
from posenc.families.bias.modules import ALiBi, AttentionBias
from posenc.families.bias.temperature import attn_temperature
from posenc.families.contextual import DAPE, CoPE
from posenc.families.rotary.apply import apply_rotary
from posenc.families.rotary.fope import FoPE
from posenc.families.rotary.module import Rotary
from posenc.families.rotary.multiaxis import xpos_tables
from posenc.families.rotary.schedules import frequencies
from posenc.families.rotary.tables import Layout
from posenc.integration.attention import attention
from posenc.integration.attention.stick_breaking import stick_breaking_attention
from posenc.integration.context_parallel import ring_attention, shard

__all__ = [
    "ENCODINGS",
    "TEST_TIME_SCALING",
    "ContextParallel",
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

# (q, k, v) -> out; q may be the last rows of k's positions only
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_LAYOUT: Layout = "half"  # the pairing of rotated channels, for RoPE and xPos alike


@dataclass(frozen=True)
class ContextParallel:
    """This rank's place in a context-parallel group, whose ranks share every sequence.

    Each rank holds its ``"zigzag"`` shard (:func:`posenc.context_parallel.shard`) of
    the sequences, right-padded to a multiple of ``2 * size`` tokens: under a causal
    mask no real token attends to the padding, so the real tokens' outputs are those
    of the unpadded sequence, and the padding's own outputs are to be ignored.

    Attributes:
        group: the ``torch.distributed`` process group of the ranks sharing a sequence.
        size: its ranks.
        rank: this rank's index in it.
    """

    group: Any
    size: int
    rank: int

    def local(self, x: torch.Tensor, fill: int) -> torch.Tensor:
        """This rank's shard of ``x`` ``(..., seq)``, padded with ``fill`` to whole chunks."""
        x = nn.functional.pad(x, (0, -x.shape[-1] % (2 * self.size)), value=fill)
        return shard(x, -1, self.size, self.rank, "zigzag")


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
    """

    vocab: int
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    max_positions: int = 256
    trained_positions: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "layers", "heads", "max_positions"):
            checks.check_int(getattr(self, name), name, minimum=1)
        if self.trained_positions is not None:
            checks.check_int(self.trained_positions, "trained_positions", minimum=1)
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


# ------------------------------------------------------------------ rotations

# (cos, sin) of the queries and (cos, sin) of the keys, one row per kept position
Tables = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
TablesFor = Callable[["LabModel", torch.Tensor, int, "dict[str, Any] | None"], Tables]


def _rope_tables(
    model: LabModel, positions: torch.Tensor, t: int, scaling: dict[str, Any] | None
) -> Tables:
    if scaling is None and model.spec.schedule is not None:  # Resonance RoPE's, always
        scaling = {"rope_type": model.spec.schedule}
    c, s = model._rotary(scaling).cos_sin(positions)
    return c, s, c, s


def _fope_tables(
    model: LabModel, positions: torch.Tensor, t: int, scaling: dict[str, Any] | None
) -> Tables:
    # FoPE's per-head C and S, (heads, seq, head_dim): apply_rotary's half-layout
    # formula q C + rotate_half(q) S with them is FoPE's rotation
    fope = cast(FoPE, model.get_submodule("fope"))
    c, s = (x.transpose(0, 1) for x in fope.cos_sin(positions))
    return c, s, c, s


def _xpos_tables(
    model: LabModel, positions: torch.Tensor, t: int, scaling: dict[str, Any] | None
) -> Tables:
    # xpos_rotate's tables, centred on the whole sequence of t tokens as there, and
    # built once for the layers and for queries that may be a suffix of the keys
    freqs = frequencies("default", model.config.head_dim, 10000.0)
    return xpos_tables(positions, freqs, center=t // 2, layout=_LAYOUT)


#: :attr:`Encoding.rotary` -> the rotation tables of one forward pass.
_ROTATIONS: dict[str, TablesFor] = {
    "rope": _rope_tables,
    "xpos": _xpos_tables,
    "fope": _fope_tables,
}


def _attend(
    bias: AttentionBias | None,
    tables: Tables | None,
    context: ContextParallel | None = None,
    *,
    kernel: str = "softmax",
    chunk: int | None = None,
    temperature: torch.Tensor | None = None,
) -> Attend:
    """Causal attention of queries that are the last ``q_len`` of the keys (posenc.attention's
    bottom-right alignment), each query rotated at its own position; under ``context``,
    ring attention of the rank's shard (queries and keys alike) over its group.

    ``kernel="stick-breaking"``: :func:`posenc.stick_breaking_attention`, the share no key
    took given to the query's own value. ``chunk``: keys of the query's chunk only.
    ``temperature``: the queries' scale at every key position (Llama 4's NoPE layers).
    Keyword arguments of the returned function (``log_fgate``, ``cope``, a per-layer
    ``bias``) go to :func:`posenc.attention`.
    """

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **extra: Any) -> torch.Tensor:
        first = k.shape[2] - q.shape[2]
        if tables is not None:
            cq, sq, ck, sk = tables
            q = apply_rotary(q, cq[..., first:, :], sq[..., first:, :], layout=_LAYOUT)
            k = apply_rotary(k, ck, sk, layout=_LAYOUT)
        if temperature is not None:
            q = q * temperature[first:, None].to(q.dtype)
        if context is not None:
            # rotated already at the shard's own positions (randomized ones too), so no
            # rotary=, which would rotate at the shard's indices in the sequence
            return ring_attention(
                q, k, v, group=context.group, layout="zigzag", bias=bias, causal=True
            )
        if kernel == "stick-breaking":
            out, rem = stick_breaking_attention(q, k, v)
            return out + rem[..., None] * v[:, :, first:]
        options: dict[str, Any] = {"bias": bias, "causal": True, **extra}
        if chunk is not None:
            options["chunk_size"] = chunk
        return attention(q, k, v, **options)

    return attend


def _position_module(spec: Encoding, config: ModelConfig) -> nn.Module | None:
    """The position module of one layer (:attr:`Encoding.per_layer`), or None."""
    if spec.per_layer == "forget-gate":
        return ForgetGate(config.d_model, config.heads)
    if spec.per_layer == "cope":
        return CoPE(config.head_dim, config.max_positions)
    if spec.per_layer == "dape":
        return DAPE(ALiBi(config.heads))
    return None


# ------------------------------------------------------------------ the model


class _Block(nn.Module):
    def __init__(self, config: ModelConfig, position: nn.Module | None = None) -> None:
        super().__init__()
        # the layer's own position module (FoX's gates, CoPE, DAPE), or None
        self.position = position
        d = config.d_model
        self.heads = config.heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, attend: Attend, queries: int) -> torch.Tensor:
        """The outputs ``(batch, queries, d_model)`` of the last ``queries`` positions of ``x``."""
        b, t, d = x.shape
        heads, size = self.heads, d // self.heads
        h, w = self.ln1(x), self.qkv.weight
        if queries == t:
            q, k, v = self.qkv(h).view(b, t, 3, heads, size).unbind(2)
        else:  # keys and values of every position, queries of the last ones
            q = nn.functional.linear(h[:, t - queries :], w[:d]).view(b, queries, heads, size)
            k, v = nn.functional.linear(h, w[d:]).view(b, t, 2, heads, size).unbind(2)
        extra: dict[str, Any] = {}
        if isinstance(self.position, ForgetGate):  # every key's gate, from the layer's input
            extra["log_fgate"] = self.position(h)
        elif isinstance(self.position, CoPE):
            extra["cope"] = self.position
        elif self.position is not None:  # DAPE: the layer's own bias
            extra["bias"] = self.position
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **extra)
        x = x[:, t - queries :] + self.out(y.transpose(1, 2).reshape(b, queries, d))
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
        self.blocks = nn.ModuleList(
            _Block(config, _position_module(self.spec, config)) for _ in range(config.layers)
        )
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, config.vocab, bias=False)
        if self.spec.absolute is not None:
            # named by its kind, so that a learned table is saved as "learned.weight"
            self.add_module(self.spec.absolute, _ABSOLUTE_TABLES[self.spec.absolute](config))
        self.bias: AttentionBias | None = None
        if self.spec.bias is not None:
            self.bias = self.spec.bias(config.heads, config.head_dim)  # shared by every layer
        if self.spec.rotary == "fope":  # its coefficients, frozen as the reference keeps them
            self.fope = FoPE(
                config.head_dim,
                config.heads,
                max_position_embeddings=config.trained_positions or config.max_positions,
            )

    def _rotary(self, scaling: dict[str, Any] | None) -> Rotary:
        # one Rotary per schedule, kept out of the state dict: its tables are a cache
        key = repr(sorted((scaling or {}).items()))
        cache: dict[str, Rotary] = self.__dict__.setdefault("_ropes", {})
        if key not in cache:
            cache[key] = Rotary(self.config.head_dim, layout=_LAYOUT, scaling=scaling)
        return cache[key]

    def _positions(
        self, t: int, device: torch.device, generator: torch.Generator | None
    ) -> torch.Tensor:
        """The positions of ``t`` tokens: ``0 .. t - 1``, or ``randomized``'s draw."""
        if not self.spec.random_positions:
            return torch.arange(t, device=device)
        # a sorted random subset of every position the model may see, so that test lengths
        # beyond the trained ones use positions already trained on (Ruoss et al. 2023)
        draw = torch.randperm(self.config.max_positions, generator=generator)[:t]
        return draw.sort().values.to(device)

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        scaling: dict[str, Any] | None = None,
        generator: torch.Generator | None = None,
        span: tuple[int, int] | None = None,
        context: ContextParallel | None = None,
    ) -> torch.Tensor:
        """Logits ``(batch, seq, vocab)`` of ``tokens`` ``(batch, seq)``, or of a span of them.

        Args:
            tokens: int64 ids.
            scaling: an HF-style ``rope_scaling`` dict for the RoPE model at test
                time (``{"rope_type": "linear", "factor": 2.0}``).
            generator: the randomness of ``randomized`` positions (a new random
                subset per call otherwise).
            span: ``(start, stop)``: the logits of positions ``start .. stop - 1``
                only, ``(batch, stop - start, vocab)``, equal to those rows of the
                whole pass (to float32 rounding) at a fraction of its work; None:
                every position.
            context: this rank's share of the work under context parallelism:
                ``tokens`` are still the whole sequences (every rank of the group
                the same), and the logits are those of the rank's tokens,
                ``context.local(tokens, fill)``, ``(batch, padded seq // size,
                vocab)``; the padding's rows are not the model's (ignore their
                targets). A collective: every rank of the group calls it together.

        Raises:
            ValueError: a sequence longer than ``max_positions`` for the
                encodings that have a limit (learned, randomized); a ``scaling``
                for a model that does not scale at test time; a span that is not
                ``0 <= start < stop <= seq``; a span under ``context`` (each rank
                holds pieces of the sequence's start and end: no suffix to cut).
        """
        x, attends, queries = self._start(tokens, scaling, generator, span, context)
        for i, (block, attend) in enumerate(zip(self.blocks, attends, strict=True)):
            x = block(x, attend, queries if i == len(self.blocks) - 1 else x.shape[1])
        return self.head(self.ln(x))

    def residuals(
        self, tokens: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> list[torch.Tensor]:
        """The residual stream of ``tokens`` ``(batch, seq)`` at every layer, every position.

        Element 0 is the embedding output (the token embedding, plus the absolute
        table where the encoding has one), element ``l`` the output of block ``l``
        (``l = 1 .. layers``), each ``(batch, seq, d_model)``: what the blocks of
        :meth:`forward` compute for the whole sequence, the last one included
        (:meth:`forward`'s logits are ``head(ln(residuals[-1]))``).

        Args:
            tokens: int64 ids.
            generator: the randomness of ``randomized`` positions, as in :meth:`forward`.

        Raises:
            ValueError: a sequence longer than ``max_positions`` for the encodings
                that have a limit (learned, randomized).
        """
        x, attends, _ = self._start(tokens, None, generator, None, None)
        stream = [x]
        for block, attend in zip(self.blocks, attends, strict=True):
            x = block(x, attend, x.shape[1])
            stream.append(x)
        return stream

    def _start(
        self,
        tokens: torch.Tensor,
        scaling: dict[str, Any] | None,
        generator: torch.Generator | None,
        span: tuple[int, int] | None,
        context: ContextParallel | None,
    ) -> tuple[torch.Tensor, list[Attend], int]:
        """The embedding output of the tokens a pass computes, each block's attention,
        and the queries of the last block (:meth:`forward`'s arguments, checked)."""
        t = tokens.shape[1]
        spec, device = self.spec, tokens.device
        if context is not None and span is not None:
            raise ValueError(
                "span: under context parallelism each rank computes its whole shard "
                "(pieces of the start and of the end of every sequence); pass span=None"
            )
        start, stop = (0, t) if span is None else _check_span(span, t)
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
        # positions of the whole sequence (randomized draws t of them, the same on every
        # rank of a group: their generators are in step), kept up to stop or sharded
        positions = self._positions(t, device, generator)
        if context is None:
            positions, tokens = positions[:stop], tokens[:, :stop]
        else:  # the padding's position and token are any valid ones: 0
            positions, tokens = context.local(positions, 0), context.local(tokens, 0)
            start, stop = 0, tokens.shape[1]
        x = self.embed(tokens)
        if spec.absolute is not None:
            x = x + self.get_submodule(spec.absolute)(positions).to(x.dtype)
        tables = None
        if spec.rotary is not None:
            tables = _ROTATIONS[spec.rotary](self, positions, t, scaling)
        if context is not None and not spec.context_parallel:
            raise ValueError(
                f"context parallelism: {spec.name} has no ring-attention form (rotations "
                "and biases with softmax only)"
            )
        # each layer rotates or not (hybrid-nope's and irope's NoPE layers), on one set of
        # tables; irope's RoPE layers attend within chunks, its NoPE layers scale queries
        temperature = None
        if spec.temperature:
            temperature = torch.as_tensor(
                attn_temperature(positions, floor_scale=spec.chunk or 8192), device=device
            )
        rotating = _attend(self.bias, tables, context, kernel=spec.kernel, chunk=spec.chunk)
        plain = _attend(self.bias, None, context, kernel=spec.kernel, temperature=temperature)
        attends = [rotating if spec.rotates(i) else plain for i in range(len(self.blocks))]
        return x, attends, stop - start


def _check_span(span: Any, t: int) -> tuple[int, int]:
    if not isinstance(span, tuple) or len(span) != 2:
        raise TypeError(f"span must be a (start, stop) tuple of ints; got {span!r}")
    start = checks.check_int(span[0], "span start", minimum=0)
    stop = checks.check_int(span[1], "span stop", minimum=start + 1)
    if stop > t:
        raise ValueError(f"span must end within the {t} tokens; got {span!r}")
    return start, stop
