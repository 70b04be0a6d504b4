"""``torch.nn.Module`` shells over the functions: absolute encodings added to token embeddings.

This module imports torch; ``import posenc`` does not import it.

Shapes: ``x`` is ``(batch, seq, dim)`` (or unbatched ``(seq, dim)``);
``positions`` is ``(seq,)`` or ``(batch, seq)``.

- :class:`SinusoidalEmbedding`: the fixed encoding of Vaswani et al. 2017
  (section 3.5) in any :data:`posenc.PRESETS` convention, as fairseq's
  ``SinusoidalPositionalEmbedding`` and HF M2M100 use it: an exact float32
  table that no ``model.to(bfloat16)`` can round, grown on demand under a
  lock, offset-aware for KV caches, ``torch.compile``-able.
- :class:`LearnedPositionalEmbedding`: a trained table (the paper's
  alternative) with the BART/OPT ``offset=2`` and the fairseq ``padding_idx``
  conventions, so HF checkpoints load into it unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from posenc.core import checks
from posenc.core.tables import ExactTables, Tables
from posenc.families.absolute.sinusoidal import Sinusoid, resolve, sinusoidal


def _check_positions(positions: Any, *, floats: bool) -> torch.Tensor:
    checks.check_position_tensor(positions, floats=floats)
    if positions.ndim not in (1, 2):
        raise ValueError(
            f"positions must be (seq,) or (batch, seq); got shape {tuple(positions.shape)}"
        )
    return positions


class SinusoidalEmbedding(ExactTables):
    """Adds a fixed sinusoidal encoding to token embeddings, exact in any model dtype.

    ``forward(x)`` returns ``dropout(x * input_scale + pe)``, with ``pe`` the
    rows of ``posenc.sinusoidal`` for positions ``offset .. offset + seq - 1``
    (or the given ``positions``). This is fairseq's
    ``SinusoidalPositionalEmbedding`` / HF ``M2M100SinusoidalPositionalEmbedding``
    with ``preset="fairseq"``, ``padding_idx`` and ``input_scale=sqrt(dim)``
    (fairseq's ``embed_scale``), and the paper's encoding with the default preset.

    The table of integer positions ``0 .. max_len - 1`` is float32, exact to
    float32 rounding, and a cache, not state (:class:`posenc.core.tables.ExactTables`:
    not in the state dict, untouched by ``model.to(torch.bfloat16)`` or ``.half()``,
    which lost transformers' ``inv_freq`` in #25681 and #30709). Other devices and
    dtypes get that table cast once, cached per device *and* dtype. Asking for a
    position past its end doubles it once (built whole, then swapped in under a
    lock, so concurrent callers never see a partial table; fairseq #5555), rather
    than refilling it per call.
    Positions beyond ``max_table_elements`` entries (256 MiB), negative positions,
    float positions (diffusion timesteps) and float64 ``x`` (which deserves
    more than the float32 table) are computed directly, exactly.

    ``torch.compile(fullgraph=True)`` traces ``forward`` with integer
    ``offset`` (or with explicit positions) as long as the table for ``x``'s
    device and dtype is already long enough (the float32 one on the CPU is made
    at construction; one eager call makes the others): no values are inspected
    while compiling, and a table that is missing or too short raises instead of
    growing.

    Args:
        dim: channels (a positive int).
        preset: a name from :data:`posenc.PRESETS` or a :class:`posenc.Sinusoid`.
        max_len: initial table length.
        padding_idx: a position number whose encoding is all zeros (fairseq:
            pads are numbered ``padding_idx``, real tokens from
            ``padding_idx + 1``; see :func:`posenc.positions.fairseq_positions`).
        input_scale: multiplies ``x`` before the encoding is added, e.g.
            ``math.sqrt(dim)``; ``None`` leaves ``x`` as is.
        dropout: dropout probability applied to the sum.
        **overrides: :class:`posenc.Sinusoid` fields or their aliases
            (``max_period``, ``flip_sin_to_cos`` ...), as in :func:`posenc.sinusoidal`
            (diffusers' knobs only with diffusers' layout: ``preset="ddpm"`` or ``"ldm"``).

    Raises:
        TypeError: ``dim``, ``max_len``, ``padding_idx`` not ints; non-numeric
            ``input_scale`` or ``dropout``.
        ValueError: non-positive ``dim``/``max_len``, ``dim`` above
            :data:`posenc.core.checks.MAX_CHANNELS` (refused before any frequency
            is computed), negative ``padding_idx``, ``dropout`` outside [0, 1],
            unknown preset or override, a diffusers-only alias on a layout that
            is not diffusers'.

    Examples:
        >>> import torch
        >>> import posenc
        >>> pe = posenc.SinusoidalEmbedding(16)
        >>> x = torch.zeros(2, 5, 16)  # token embeddings (batch, seq, dim)
        >>> out = pe(x)
        >>> out.shape
        torch.Size([2, 5, 16])
        >>> torch.allclose(out[0], posenc.sinusoidal(torch.arange(5), 16))
        True
        >>> torch.equal(pe(x[:, :1], offset=4)[:, 0], out[:, 4])  # one new token after 4 cached
        True
    """

    max_table_elements = 1 << 26  # 256 MiB of float32
    width_name = "dim"

    def __init__(
        self,
        dim: int,
        *,
        preset: str | Sinusoid = "vaswani",
        max_len: int = 2048,
        padding_idx: int | None = None,
        input_scale: float | None = None,
        dropout: float = 0.0,
        **overrides: Any,
    ) -> None:
        super().__init__()
        self.dim = checks.check_int(dim, "dim", minimum=1)
        self.max_len = checks.check_int(max_len, "max_len", minimum=1)
        self.spec = resolve(preset, **overrides)
        self.spec.slots(self.dim)  # reject an odd dim the convention refuses, now
        self.preset = preset if isinstance(preset, str) else "custom"
        self.padding_idx = (
            None if padding_idx is None else checks.check_int(padding_idx, "padding_idx")
        )
        self.input_scale = (
            None if input_scale is None else checks.check_number(input_scale, "input_scale")
        )
        p = checks.check_number(dropout, "dropout")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout must lie in [0, 1]; got {dropout!r}")
        self.dropout = nn.Dropout(p)
        self.width, self.initial_length = self.dim, self.max_len
        self._table_for(self.max_len, torch.device("cpu"), torch.float32)

    def extra_repr(self) -> str:
        parts = [f"{self.dim}", f"preset={self.preset!r}", f"max_len={self.max_len}"]
        if self.padding_idx is not None:
            parts.append(f"padding_idx={self.padding_idx}")
        if self.input_scale is not None:
            parts.append(f"input_scale={self.input_scale:g}")
        return ", ".join(parts)

    # ------------------------------------------------------------------ the tables

    @property
    def table(self) -> torch.Tensor:
        """The exact float32 table on the CPU, ``(n, dim)`` with ``n >= max_len``."""
        cpu = torch.device("cpu")
        table = self._table_for(self.max_len, cpu, torch.float32)
        return (table or self._build(self.max_len, cpu, torch.float32))[0]

    def _build(self, n: int, device: torch.device, dtype: torch.dtype) -> Tables:
        if device.type != "cpu" or dtype != torch.float32:
            # every other table is the float32 one, cast: rows identical on every device
            master = self._table_for(n, torch.device("cpu"), torch.float32)
            assert master is not None  # the same size cap
            return (master[0].to(device=device, dtype=dtype),)
        table = torch.from_numpy(sinusoidal(n, self.dim, preset=self.spec))
        if self.padding_idx is not None and self.padding_idx < n:
            table[self.padding_idx] = 0
        return (table,)

    def _tabled(self, dtype: torch.dtype) -> bool:
        return dtype != torch.float64  # float64-exact values: the table holds float32 ones

    def _compiled_table(self, device: torch.device, dtype: torch.dtype) -> Tables:
        # inside a graph every dtype reads the float32 table, cast in the graph
        cpu = torch.device("cpu")
        for key in ((device, dtype), (device, torch.float32), (cpu, torch.float32)):
            if key in self._tables:
                return tuple(t.to(device=device, dtype=dtype) for t in self._tables[key])
        return super()._compiled_table(device, dtype)

    def _direct(self, positions: torch.Tensor, dtype: torch.dtype) -> Tables:
        """Exact encodings of any positions, computed without the table."""
        flat = positions.reshape(-1)
        if flat.shape[0] == 0:
            out = torch.zeros((0, self.dim), device=positions.device, dtype=dtype)
        else:
            out = sinusoidal(flat, self.dim, preset=self.spec, dtype=dtype)  # rounded once
        out = out.reshape(*positions.shape, self.dim)
        if self.padding_idx is not None:
            out = out.masked_fill((positions == self.padding_idx)[..., None], 0.0)
        return (out,)

    def encode(
        self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """The encodings alone, ``(*positions.shape, dim)``, on the positions' device.

        Integer positions are rows of the exact table (grown if needed); float
        positions (diffusion timesteps, as diffusers' ``Timesteps``) are
        computed directly with :func:`posenc.sinusoidal`, exactly. Positions
        equal to ``padding_idx`` give zeros.

        Args:
            positions: int or float tensor, ``(seq,)`` or ``(batch, seq)``.
            dtype: output dtype (float32 by default).

        Raises:
            TypeError: ``positions`` not an int or float tensor.
            ValueError: ``positions`` of another rank, or beyond ``2**31``; a result
                of more than :data:`posenc.core.checks.MAX_ELEMENTS` values
                (``positions.numel() * dim``, refused before any work).
        """
        positions = _check_positions(positions, floats=True)
        return self._lookup(positions, positions.device, dtype)[0]

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, offset: Any = 0
    ) -> torch.Tensor:
        """Add the encoding to ``x``.

        Args:
            x: float tensor ``(batch, seq, dim)`` or ``(seq, dim)``.
            positions: ``(seq,)`` or ``(batch, seq)`` int (or float) positions,
                e.g. from :func:`posenc.positions.fairseq_positions`; ``None``
                means ``offset .. offset + seq - 1``.
            offset: the first position when ``positions`` is None: the number of
                tokens already in the KV cache (rotary-embedding-torch #11 was
                this offset forgotten). An int or a 0-d int tensor.

        Returns:
            ``dropout(x * input_scale + pe)``, shaped and typed like ``x``.

        Raises:
            TypeError: ``x`` not a float tensor; bad ``positions``/``offset`` types.
            ValueError: ``x.shape[-1] != dim``, ``positions`` of the wrong shape,
                both ``positions`` and a non-zero ``offset``.
        """
        checks.check_float_tensor(x, "x")
        if x.ndim not in (2, 3) or x.shape[-1] != self.dim:
            raise ValueError(
                f"x must be (batch, seq, dim) or (seq, dim) with dim={self.dim}; "
                f"got shape {tuple(x.shape)}"
            )
        seq = x.shape[-2]
        if positions is None:
            (pe,) = self._range(offset, seq, x.device, x.dtype)
        else:
            if not checks.is_zero(offset):
                raise ValueError("pass positions or offset, not both: positions are absolute")
            positions = _check_positions(positions, floats=True)
            batch_ok = positions.ndim == 1 or (
                x.ndim == 3 and positions.shape[0] in (1, x.shape[0])
            )
            if positions.shape[-1] != seq or not batch_ok:
                raise ValueError(
                    f"positions must be (seq,) or (batch, seq) matching x {tuple(x.shape)}; "
                    f"got shape {tuple(positions.shape)}"
                )
            (pe,) = self._lookup(positions, x.device, x.dtype)
        if self.input_scale is not None:
            x = x * self.input_scale
        return self.dropout(x + pe)


class LearnedPositionalEmbedding(nn.Embedding):
    """A trained table of position vectors, in the BART/OPT or the fairseq convention.

    The paper's learned alternative (Vaswani et al. 2017, section 3.5). Two
    conventions of the reference implementations, exclusive of each other:

    - ``offset`` (HF ``BartLearnedPositionalEmbedding`` and
      ``OPTLearnedPositionalEmbedding`` use 2): position ``p`` reads row
      ``p + offset`` of ``num_positions + offset`` rows, so OPT's pad
      position ``-1`` (see :func:`posenc.positions.opt_positions`) is row 1.
    - ``padding_idx`` (fairseq ``LearnedPositionalEmbedding``): positions are
      numbered from ``padding_idx + 1`` (:func:`posenc.positions.fairseq_positions`),
      pads are ``padding_idx``, whose row is zero and gets no gradient; the
      table has ``num_positions + padding_idx + 1`` rows.

    It is an ``nn.Embedding`` with the same ``weight``, so HF and fairseq
    checkpoints load into it unchanged. Initialisation is ``nn.Embedding``'s.

    Args:
        num_positions: how many real positions the table holds (HF
            ``max_position_embeddings``).
        dim: channels.
        offset: rows before position 0 (BART/OPT: 2).
        padding_idx: the fairseq pad position number.

    Raises:
        TypeError: non-int arguments.
        ValueError: non-positive sizes, negative ``offset``/``padding_idx``, or
            both ``offset`` and ``padding_idx``; ``dim`` above
            :data:`posenc.core.checks.MAX_CHANNELS` or a table of more than
            :data:`posenc.core.checks.MAX_ELEMENTS` values (refused before
            anything is allocated).

    Examples:
        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> emb = posenc.LearnedPositionalEmbedding(2048, 16, offset=2)  # OPT's table
        >>> emb.weight.shape
        torch.Size([2050, 16])
        >>> positions = posenc.opt_positions(torch.tensor([[0, 1, 1, 1]]))  # one left pad
        >>> positions.tolist()
        [[-1, 0, 1, 2]]
        >>> out = emb(positions)
        >>> out.shape
        torch.Size([1, 4, 16])
        >>> torch.equal(out[0, 1], emb.weight[2])  # position 0 reads row 0 + offset
        True
    """

    def __init__(
        self, num_positions: int, dim: int, *, offset: int = 0, padding_idx: int | None = None
    ) -> None:
        num_positions = checks.check_int(num_positions, "num_positions", minimum=1)
        dim = checks.check_channels(dim, "dim")
        offset = checks.check_int(offset, "offset")
        if padding_idx is not None:
            padding_idx = checks.check_int(padding_idx, "padding_idx")
            if offset:
                raise ValueError(
                    "pass offset (BART/OPT convention) or padding_idx (fairseq convention), "
                    "not both"
                )
            rows = num_positions + padding_idx + 1
        else:
            rows = num_positions + offset
        checks.check_elements(
            rows * dim,
            f"the table of {rows} rows (num_positions plus the rows before the first) x dim={dim}",
        )
        super().__init__(rows, dim, padding_idx=padding_idx)
        self.num_positions = num_positions
        self.offset = offset
        # the position number of the first real token
        self.first_position = 0 if padding_idx is None else padding_idx + 1

    def extra_repr(self) -> str:
        extra = f", offset={self.offset}" if self.offset else ""
        return f"{self.num_positions}, {self.embedding_dim}{extra}" + (
            f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        )

    def forward(
        self,
        positions: torch.Tensor | None = None,
        *,
        shape: int | Sequence[int] | None = None,
        past_length: Any = 0,
    ) -> torch.Tensor:
        """Look up position vectors, ``(*positions.shape, dim)``.

        Args:
            positions: int tensor ``(seq,)`` or ``(batch, seq)`` of position
                numbers (cache offsets already included).
            shape: instead of ``positions``: ``seq`` or ``(batch, seq)``; the
                positions are then ``first .. first + seq - 1`` shifted by
                ``past_length`` (``first`` is 0, or ``padding_idx + 1``), as
                BART's ``forward(input_ids, past_key_values_length)`` and
                M2M100's ``inputs_embeds`` path number them.
            past_length: tokens already in the KV cache (with ``shape`` only);
                an int or a 0-d int tensor.

        Raises:
            TypeError: ``positions`` not an int tensor (any int dtype, int8 to
                uint64, is accepted).
            ValueError: both or neither of ``positions``/``shape``; positions
                outside the table (naming its limit) instead of an index error
                or a CUDA device assert; a result of more than
                :data:`posenc.core.checks.MAX_ELEMENTS` values (refused before any
                work).
        """
        if (positions is None) == (shape is None):
            raise ValueError("pass exactly one of positions and shape")
        dim = self.embedding_dim
        if positions is None:
            if isinstance(shape, int):
                batch, seq = None, checks.check_int(shape, "shape")
            elif isinstance(shape, Sequence) and len(shape) == 2:
                batch, seq = (
                    checks.check_int(shape[0], "shape[0]"),
                    checks.check_int(shape[1], "shape[1]"),
                )
            else:
                raise ValueError(f"shape must be seq or (batch, seq); got {shape!r}")
            checks.check_elements(
                (1 if batch is None else batch) * seq * dim,
                f"the position vectors of shape {shape!r} x dim={dim}",
            )
            if isinstance(past_length, torch.Tensor):
                checks.is_int_offset(past_length, "past_length")
                start: Any = past_length.to(self.weight.device) + self.first_position
            else:
                start = self.first_position + checks.check_int(past_length, "past_length")
            positions = torch.arange(seq, device=self.weight.device) + start
            if batch is not None:
                positions = positions.expand(batch, seq)
        else:
            if not checks.is_zero(past_length):
                raise ValueError("past_length applies to shape only: positions are absolute")
            positions = _check_positions(positions, floats=False)
            if not torch.compiler.is_compiling():
                checks.check_elements(
                    positions.numel() * dim,
                    f"the position vectors of positions (shape {tuple(positions.shape)}) x "
                    f"dim={dim}",
                )
        if not torch.compiler.is_compiling() and positions.numel():
            # read in the positions' own dtype, before an offset could wrap them
            lo, hi = checks.tensor_bounds(positions)
            first, last = -self.offset, self.num_embeddings - 1 - self.offset
            if lo < first or hi > last:
                raise ValueError(
                    f"positions must lie in [{first}, {last}] (num_positions="
                    f"{self.num_positions}, offset={self.offset}, padding_idx="
                    f"{self.padding_idx}); got values in [{int(lo)}, {int(hi)}]"
                )
        # int64 indices: embedding takes no int8, int16 or unsigned ones, and int8 + offset
        # could wrap
        index = positions.to(torch.int64)
        return super().forward(index + self.offset if self.offset else index)
