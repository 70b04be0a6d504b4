"""The lab's model: a small decoder-only transformer assembled from posenc's pieces.

Token embedding, plus the absolute table of the encodings that have one (the
exact sinusoidal table, or a learned one); pre-norm blocks whose attention is
:func:`posenc.attention`, causal throughout, with the encoding's rotation of
queries and keys (through the rotation protocol of ``rotary=``: :class:`posenc.Rotary`,
:class:`posenc.FoPE`, xPos's tables; in every layer, or all but every k-th for
``hybrid-nope``), its bias module (:mod:`posenc.bias`) and the score terms of each
layer's position module (:data:`posenc.lab.encodings.PER_LAYER`: FoX's gates,
CoPE, DAPE); or another kernel (stick-breaking, PaTH with its layer's transforms).
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
    ENCODINGS as ENCODINGS,
)
from posenc.faces.lab.encodings import (
    PER_LAYER,
    POSITION_IDS,
    REGISTRY,
    ROPE_BASE,
    Encoding,
    lookup,
    training_encoding,
)
from posenc.faces.lab.encodings import (
    scaling_for as scaling_for,
)
from posenc.faces.lab.layers import PositionModule
from posenc.faces.lab.sizes import ModelConfig
from posenc.families.absolute.sinusoidal import sinusoidal
from posenc.families.arithmetic import randomized_positions
from posenc.families.bias.modules import AttentionBias
from posenc.families.bias.temperature import attn_temperature
from posenc.families.rotary.dynamic import LENGTH_DEPENDENT
from posenc.families.rotary.fope import FoPE
from posenc.families.rotary.module import Rotary
from posenc.families.rotary.multiaxis import xpos_tables
from posenc.families.rotary.rotation import RotaryTables, Rotation
from posenc.families.rotary.schedules import frequencies
from posenc.families.rotary.tables import Layout, cos_sin
from posenc.integration.attention import attention
from posenc.integration.attention.path import path_attention
from posenc.integration.attention.stick_breaking import stick_breaking_attention
from posenc.integration.context_parallel import ring_attention, shard

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


def _id_table(config: ModelConfig) -> nn.Module:
    return nn.Embedding(config.id_rows, config.d_model)


#: :attr:`Encoding.absolute` -> the table's builder; tables map positions ``(seq,)`` to
#: ``(seq, d_model)``.
_ABSOLUTE_TABLES: dict[str, Callable[[ModelConfig], nn.Module]] = {
    "sinusoidal": _SinusoidalTable,
    "learned": _learned_table,
}


# ------------------------------------------------------------------ rotations


@dataclass(frozen=True)
class Turn:
    """The rotation of one forward pass: queries and keys rotated through the protocol.

    ``rotation`` (a :class:`posenc.rotary.rotation.Rotation`) rotates the keys at
    ``positions`` and the queries, which may be the last keys only, at their own;
    ``keys``, where given, rotates the keys instead (xPos scales queries and keys
    apart). What :func:`posenc.attention`'s ``rotary=`` does, at positions of the
    pass's own (randomized ones, a shard's).

    Attributes:
        rotation: the queries' rotation (and the keys', without ``keys``).
        positions: ``(seq,)`` int: the keys' positions as ``rotation`` reads them.
        keys: the keys' own rotation, or None.
    """

    rotation: Rotation
    positions: torch.Tensor
    keys: Rotation | None = None

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``q`` ``(batch, heads, q_len, head_dim)`` and ``k`` (``k_len >= q_len``) rotated."""
        first = k.shape[2] - q.shape[2]
        if self.keys is None and first == 0:  # one call for both (one launch on CUDA)
            rq, rk = self.rotation.rotate((q, k), self.positions)
            return rq, rk
        (rq,) = self.rotation.rotate((q,), self.positions[first:])
        (rk,) = (self.rotation if self.keys is None else self.keys).rotate((k,), self.positions)
        return rq, rk


TurnFor = Callable[["LabModel", torch.Tensor, int, "dict[str, Any] | None"], Turn]


def _rope(model: LabModel, positions: torch.Tensor, t: int, scaling: dict[str, Any] | None) -> Turn:
    if scaling is None and model.spec.schedule is not None:  # Resonance RoPE's, always
        scaling = {"rope_type": model.spec.schedule}
    if scaling is not None and scaling["rope_type"] in LENGTH_DEPENDENT:
        # the frequencies of a sequence of t tokens, whichever of its logits the pass
        # computes (a span stops early): a Rotary's own follow the lengths of the calls
        # it has seen, as HF's dynamic_rope_update does
        params = {k: v for k, v in scaling.items() if k != "rope_type"}
        freqs = frequencies(scaling["rope_type"], model.config.head_dim, ROPE_BASE, params,
                            seq_len=t)  # fmt: skip
        c, s = cos_sin(positions, freqs, layout=_LAYOUT, dtype=torch.float32)
        rows = torch.arange(positions.shape[0], device=positions.device)
        return Turn(RotaryTables(c, s, layout=_LAYOUT), rows)
    return Turn(model._rotary(scaling), positions)


def _fope(model: LabModel, positions: torch.Tensor, t: int, scaling: dict[str, Any] | None) -> Turn:
    # FoPE's per-head coefficients, frozen as the reference keeps them
    return Turn(cast(FoPE, model.get_submodule("fope")), positions)


def _xpos(model: LabModel, positions: torch.Tensor, t: int, scaling: dict[str, Any] | None) -> Turn:
    # xpos_rotate's tables, centred on the whole sequence of t tokens as there, one row
    # per position of the pass: queries and keys scale apart, so each has its tables
    freqs = frequencies("default", model.config.head_dim, 10000.0)
    cq, sq, ck, sk = xpos_tables(positions, freqs, center=t // 2, layout=_LAYOUT)
    rows = torch.arange(positions.shape[0], device=positions.device)
    return Turn(RotaryTables(cq, sq, layout=_LAYOUT), rows, RotaryTables(ck, sk, layout=_LAYOUT))


#: :attr:`Encoding.rotary` -> the rotation of one forward pass, from the model, the
#: pass's positions, its whole length and the test-time scaling.
_ROTATIONS: dict[str, TurnFor] = {
    "rope": _rope,
    "xpos": _xpos,
    "fope": _fope,
}


# ------------------------------------------------------------------ kernels


def _softmax(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: AttentionBias | None,
    chunk: int | None, terms: Any = (), rotary: Any = None,
) -> torch.Tensor:  # fmt: skip
    # rotary: a layer's own rotation of q and k (PoPE's, Dual Chunk Attention's)
    options: dict[str, Any] = {"bias": bias, "causal": True, "terms": terms, "rotary": rotary}
    if chunk is not None:
        options["chunk_size"] = chunk
    return attention(q, k, v, **options)


def _stick_breaking(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: AttentionBias | None,
    chunk: int | None,
) -> torch.Tensor:  # fmt: skip
    out, rem = stick_breaking_attention(q, k, v)
    return out + rem[..., None] * v[:, :, k.shape[2] - q.shape[2] :]


def _path(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: AttentionBias | None,
    chunk: int | None, *, w: torch.Tensor, beta: torch.Tensor,
    log_fgate: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    first = k.shape[2] - q.shape[2]
    if first:
        # PaTH takes as many queries as keys: the earlier positions' queries are zero
        # rows whose outputs are dropped (a causal query's output reads its own row only)
        q = nn.functional.pad(q, (0, 0, first, 0))
    out = path_attention(q, k, v, w, beta, log_fgate=log_fgate)
    return out[:, :, first:]


#: :attr:`Encoding.kernel` -> ``(q, k, v, bias, chunk, **inputs) -> out``: queries the
#: last of the keys, rotated already; ``inputs`` those of the layer's position module.
_KERNELS: dict[str, Callable[..., torch.Tensor]] = {
    "softmax": _softmax,
    "stick-breaking": _stick_breaking,
    "path": _path,
}


def _attend(
    bias: AttentionBias | None,
    turn: Turn | None,
    context: ContextParallel | None = None,
    *,
    kernel: str = "softmax",
    chunk: int | None = None,
    temperature: torch.Tensor | None = None,
) -> Attend:
    """Causal attention of queries that are the last ``q_len`` of the keys (posenc.attention's
    bottom-right alignment), each query rotated at its own position by ``turn``; under
    ``context``, ring attention of the rank's shard (queries and keys alike) over its group.

    ``kernel``: an entry of ``_KERNELS`` (``"stick-breaking"``:
    :func:`posenc.stick_breaking_attention`, the share no key took given to the query's
    own value; ``"path"``: :func:`posenc.path_attention`). ``chunk``: keys of the query's
    chunk only. ``temperature``: the queries' scale at every key position (Llama 4's NoPE
    layers). Keyword arguments of the returned function (the layer's position module's
    :meth:`~posenc.lab.layers.PositionModule.attend_inputs`: ``terms``, PaTH's ``w``,
    ``beta`` and ``log_fgate``) go to the kernel.
    """

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **inputs: Any) -> torch.Tensor:
        first = k.shape[2] - q.shape[2]
        if turn is not None:
            q, k = turn(q, k)
        if temperature is not None:
            q = q * temperature[first:, None].to(q.dtype)
        if context is not None:
            # rotated already at the shard's own positions (randomized ones too), so no
            # rotary=, which would rotate at the shard's indices in the sequence
            return ring_attention(
                q, k, v, group=context.group, layout="zigzag", bias=bias, causal=True
            )
        return _KERNELS[kernel](q, k, v, bias, chunk, **inputs)

    return attend


# ------------------------------------------------------------------ the model


class _Block(nn.Module):
    def __init__(self, config: ModelConfig, position: PositionModule | None = None) -> None:
        super().__init__()
        # the layer's own position module (FoX's gates, CoPE, DAPE, PaTH's transforms), or None
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
        # the layer's position module reads every position's input (the keys')
        inputs = {} if self.position is None else self.position.attend_inputs(h)
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **inputs)
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
        per_layer = None if self.spec.per_layer is None else PER_LAYER[self.spec.per_layer]
        self.blocks = nn.ModuleList(
            _Block(config, None if per_layer is None else per_layer(config))
            for _ in range(config.layers)
        )
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, config.vocab, bias=False)
        if self.spec.absolute is not None:
            # named by its kind, so that a learned table is saved as "learned.weight"
            table = _id_table if self.spec.ids else _ABSOLUTE_TABLES[self.spec.absolute]
            self.add_module(self.spec.absolute, table(config))
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
            cache[key] = Rotary(
                self.config.head_dim, base=ROPE_BASE, layout=_LAYOUT, scaling=scaling
            )
        return cache[key]

    def _positions(
        self, t: int, device: torch.device, generator: torch.Generator | None
    ) -> torch.Tensor:
        """The positions of ``t`` tokens: ``0 .. t - 1``, or ``randomized``'s draw."""
        if not self.spec.random_positions:
            return torch.arange(t, device=device)
        # a sorted random subset of every position the model may see, so that test lengths
        # beyond the trained ones use positions already trained on (Ruoss et al. 2023)
        if generator is None:
            generator = torch.default_generator
        return randomized_positions(t, self.config.max_positions, generator).to(device)

    def _ids(
        self, significance: torch.Tensor | None, t: int, generator: torch.Generator | None
    ) -> torch.Tensor:
        """The ids ``(batch, seq)`` of :attr:`Encoding.ids`'s scheme, random offsets in training."""
        scheme = self.spec.ids
        if significance is None:
            raise ValueError(
                f"{self.spec.name} reads the layout of the numbers (its {scheme} ids): pass "
                "significance= (the arithmetic tasks' batches carry it)"
            )
        if not isinstance(significance, torch.Tensor) or significance.dim() != 2:
            raise TypeError("significance must be a (batch, seq) integer tensor")
        if significance.shape[1] != t:
            raise ValueError(
                f"significance must have the tokens' {t} columns; got {significance.shape[1]}"
            )
        draws = (generator or torch.default_generator) if self.training else None
        return POSITION_IDS[cast(str, scheme)](significance, self.config.id_rows, draws)

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        scaling: dict[str, Any] | None = None,
        generator: torch.Generator | None = None,
        span: tuple[int, int] | None = None,
        context: ContextParallel | None = None,
        significance: torch.Tensor | None = None,
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
            significance: ``(batch, seq)`` the layout of the numbers
                (:class:`~posenc.lab.tasks.Batch`'s), read by the encodings whose
                table reads ids computed from it (Abacus, coupling): random offsets
                in training (``model.train()``, from ``generator``), the scheme's
                fixed start in ``model.eval()``. Ignored by the other encodings.

        Raises:
            ValueError: a sequence longer than ``max_positions`` for the
                encodings that have a limit (learned, randomized); a ``scaling``
                for a model that does not scale at test time; a span that is not
                ``0 <= start < stop <= seq``; a span under ``context`` (each rank
                holds pieces of the sequence's start and end: no suffix to cut).
        """
        x, attends, queries = self._start(tokens, scaling, generator, span, context, significance)
        for i, (block, attend) in enumerate(zip(self.blocks, attends, strict=True)):
            x = block(x, attend, queries if i == len(self.blocks) - 1 else x.shape[1])
        return self.head(self.ln(x))

    def residuals(
        self,
        tokens: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        significance: torch.Tensor | None = None,
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
            significance: the layout of the numbers, as in :meth:`forward`.

        Raises:
            ValueError: a sequence longer than ``max_positions`` for the encodings
                that have a limit (learned, randomized).
        """
        x, attends, _ = self._start(tokens, None, generator, None, None, significance)
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
        significance: torch.Tensor | None = None,
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
        if context is not None and not spec.context_parallel:
            raise ValueError(
                f"context parallelism: {spec.name} has no ring-attention form (rotations "
                "and biases with softmax only)"
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
        if spec.ids is not None:  # the table reads ids of the numbers' layout, per row
            ids = self._ids(significance, t, generator)[:, :stop].to(device)
            x = x + self.get_submodule(cast(str, spec.absolute))(ids).to(x.dtype)
        elif spec.absolute is not None:
            x = x + self.get_submodule(spec.absolute)(positions).to(x.dtype)
        turn = None
        if spec.rotary is not None:
            turn = _ROTATIONS[spec.rotary](self, positions, t, scaling)
        # each layer rotates or not (hybrid-nope's and irope's NoPE layers), on one set of
        # tables; irope's RoPE layers attend within chunks, its NoPE layers scale queries
        temperature = None
        if spec.temperature:
            temperature = torch.as_tensor(
                attn_temperature(positions, floor_scale=spec.chunk or 8192), device=device
            )
        rotating = _attend(self.bias, turn, context, kernel=spec.kernel, chunk=spec.chunk)
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
