"""``Rotary``: the ``torch.nn.Module`` shell of rotary embeddings (RoPE).

Shapes: ``q`` and ``k`` are ``(batch, heads, seq, head_dim)`` (``seq_dim=-2``,
HF's order) or ``(batch, seq, heads, head_dim)`` (``seq_dim=-3``, flash-attn's
and rotary-embedding-torch's ``seq_before_head_dim``); with ``cu_seqlens``
they are packed, ``(total_tokens, heads, head_dim)``. ``q`` and ``k`` may have
different head counts (grouped-query attention).

The module holds the frequencies of one schedule (:mod:`posenc.rotary.schedules`),
their float32 ``inv_freq`` (a non-persistent buffer that stays float32 under
``model.to(torch.bfloat16)``: transformers #25681, #30709, and is rebuilt by
``to_empty`` after meta-device initialisation: :mod:`posenc.core.buffers`), and a cache of
exact cos/sin tables (:func:`posenc.rotary.tables.cos_sin`) for positions
``0 .. n - 1`` per device and dtype, grown by doubling under a lock. The
rotation itself is :func:`posenc.rotary.apply.apply_rotary`'s (both q and k in
one Triton launch on CUDA).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from posenc.core import checks
from posenc.core.buffers import DerivedBuffers
from posenc.core.tables import LOCK, ExactTables, Tables
from posenc.families.rotary.apply import rotate_all
from posenc.families.rotary.config import has_rope_settings, parse_rope_type, rope_spec
from posenc.families.rotary.dynamic import LENGTH_DEPENDENT, LengthPolicy
from posenc.families.rotary.rerotate import rerotate_keys
from posenc.families.rotary.schedules import RopeFrequencies, frequencies
from posenc.families.rotary.tables import LAYOUTS, Layout, cos_sin

#: Tables start with this many positions and double when a longer one is needed.
INITIAL_LENGTH = 2048


def _resolve_scaling(
    scaling: Mapping[str, Any] | None, max_position_embeddings: int | None
) -> tuple[str, dict[str, Any]]:
    """``(rope_type, params)`` from an HF-style ``rope_parameters`` dict without ``rope_theta``."""
    if scaling is None:
        return "default", {}
    if not isinstance(scaling, Mapping):
        raise TypeError(f"scaling must be None or a dict; got {type(scaling).__name__}")
    params = dict(scaling)
    if "rope_theta" in params:
        raise ValueError("scaling must not hold rope_theta: pass it as base")
    rope_type = parse_rope_type(params, "scaling", default=None)
    params.pop("rope_type", None)
    params.pop("type", None)
    if (
        rope_type in ("dynamic", "longrope")
        and "max_position_embeddings" not in params
        and max_position_embeddings is not None
    ):
        # a config attribute in HF, a constructor argument here
        params["max_position_embeddings"] = max_position_embeddings
    return rope_type, params


class Rotary(ExactTables, DerivedBuffers):
    """Rotary position embeddings for queries and keys (Su et al. 2021, RoFormer).

    ``rope(q, k)`` returns ``q`` and ``k`` with channel pairs rotated by
    ``position * omega_k``, as HF's ``LlamaRotaryEmbedding`` plus
    ``apply_rotary_pos_emb`` do (``layout="half"``) or Meta's llama and
    rotary-embedding-torch (``layout="interleaved"``), with the angles exact
    (:mod:`posenc.core.angles`) instead of float32 products, and bf16/fp16 inputs
    rotated in float32.

    Tables of integer positions ``0 .. n - 1`` are cached per (device, dtype)
    and doubled when a longer one is needed, built whole before they are
    published (fairseq #5555). Negative or float positions, and tables beyond
    ``max_table_elements`` (64 MiB of float32 per table), are computed directly.

    ``dynamic`` scaling follows HF's ``dynamic_rope_update``: when a call needs
    more than the longest length seen so far (initially
    ``max_position_embeddings``), the frequencies are recomputed for that
    length; when it needs less than ``max_position_embeddings`` again, the
    original frequencies are restored (transformers #25104). Keys already in a
    KV cache keep the frequencies they were rotated with. ``longrope`` switches
    between its short and long factors at ``original_max_position_embeddings``
    (strictly above it: long).

    ``torch.compile(fullgraph=True)`` traces ``rope`` with an int ``offset``
    or explicit positions as long as the table already covers them (the first
    :data:`INITIAL_LENGTH` positions are built at construction); nothing is
    recomputed while tracing.

    Args:
        head_dim: channels per head (even).
        base: ``rope_theta``.
        rotary_dim: channels that rotate (even, <= ``head_dim``; GPT-NeoX's
            partial rotary: ``int(head_dim * partial_rotary_factor)``); the
            rest pass through. ``head_dim`` by default.
        layout: ``"half"`` (GPT-NeoX, HF) or ``"interleaved"`` (GPT-J, Meta).
        scaling: None, or an HF ``rope_parameters`` dict without ``rope_theta``:
            ``{"rope_type": "linear", "factor": 2.0}`` (``"type"`` is accepted
            as the old alias of ``"rope_type"``).
        max_position_embeddings: the model's ``max_position_embeddings``, which
            ``dynamic`` (and ``longrope``) read when ``scaling`` does not hold it.
        seq_dim: ``-2`` for ``(batch, heads, seq, head_dim)``, ``-3`` for
            ``(batch, seq, heads, head_dim)``.

    Attributes:
        inv_freq: float32 ``(rotary_dim // 2,)`` frequencies (HF's ``inv_freq``).
        attention_scaling: multiplies cos and sin (YaRN's mscale ...).

    Raises:
        TypeError: non-int sizes, non-numeric ``base``, ``scaling`` not a dict.
        ValueError: odd ``head_dim`` or ``rotary_dim``, ``rotary_dim > head_dim``,
            either above :data:`posenc.core.checks.MAX_CHANNELS` (refused before any
            frequency is computed), unknown ``layout``, ``seq_dim`` or rope type, bad
            schedule parameters (``factor < 1`` ...).

    Examples:
        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> rope = posenc.Rotary(64)
        >>> q, k = torch.randn(1, 4, 8, 64), torch.randn(1, 4, 8, 64)  # (batch, heads, seq, dim)
        >>> q1, k1 = rope(q, k)
        >>> q1.shape, k1.shape
        (torch.Size([1, 4, 8, 64]), torch.Size([1, 4, 8, 64]))
        >>> q2, k2 = rope(q, k, offset=100)  # every position shifted by 100
        >>> torch.allclose(q1 @ k1.mT, q2 @ k2.mT, atol=1e-4)  # scores see the distance only
        True
    """

    inv_freq: torch.Tensor
    width_name = "rotary_dim"

    @classmethod
    def from_hf_config(
        cls,
        config: Any,
        *,
        layer_type: str | None = None,
        layout: Layout | None = None,
        seq_dim: int = -2,
    ) -> Rotary:
        """The rotary embedding an HF model's config describes.

        Args:
            config: a transformers config object or a plain ``config.json`` dict,
                in the v5 ``rope_parameters`` form (per layer type too) or the v4
                ``rope_scaling`` + ``rope_theta`` form (see :func:`posenc.rotary.config.rope_spec`).
            layer_type: which layer type's RoPE, for per-layer-type configs.
            layout: as in the constructor; by default the pairing the model's own
                attention applies (:attr:`~posenc.rotary.config.RopeSpec.layout`:
                ``"interleaved"`` for GPT-J, Cohere, GLM-4 ..., ``"half"`` for Llama and
                most others).
            seq_dim: as in the constructor.

        The config is read as the model's own code reads it (see
        :func:`posenc.rotary.config.rope_spec`): a ``partial_rotary_factor`` that the
        model's default RoPE ignores (Llama, Qwen2, Mistral ...) is ignored here too.

        Raises:
            ValueError: unknown rope type, missing or extra keys (named), no
                head dim information; a config with no RoPE settings at all (no
                base is guessed); an M-RoPE config (one RoPE per position axis:
                the error names what to call instead); a model type whose RoPE
                module is of another kind (EoMT-DINOv3's patch coordinates,
                MusicFlamingo's timestamps: the error names the model type and what
                its module does, :data:`posenc.rotary.model_types.OTHER_KIND`).
        """
        spec = rope_spec(config, layer_type)  # names any bad value first
        if not has_rope_settings(config):
            raise ValueError(
                "config has no RoPE settings (none of rope_parameters, rope_scaling, rope_theta, "
                "rotary_emb_base, also under text_config): posenc does not guess a base; for "
                "RoPE with the RoFormer defaults say so, posenc.Rotary(head_dim, base=10000.0)"
            )
        section = spec.mrope_section or spec.mrope_default
        if spec.mrope_permuted:
            raise ValueError(
                f"config describes M-RoPE (mrope_section={list(section or ())}) whose model "
                "permutes the frequencies before the sections take them (ERNIE-4.5-VL); "
                "posenc does not reproduce that order, and patch_model refuses it"
            )
        if section is not None:
            raise ValueError(
                f"config describes M-RoPE (mrope_section={list(section)}): one "
                "rotation per position axis, which Rotary (one axis) cannot apply; use "
                "posenc.rotary.multiaxis.mrope_cos_sin(position_ids, rope_spec(config)."
                "frequencies(), ...) or posenc.hf.patch_model(model)"
            )
        scaling = None
        if spec.rope_type != "default":
            scaling = {"rope_type": spec.rope_type, **spec.params}
        return cls(
            spec.head_dim,
            base=spec.base,
            rotary_dim=spec.rotary_dim,
            layout=layout if layout is not None else spec.layout,
            scaling=scaling,
            max_position_embeddings=spec.max_position_embeddings,
            seq_dim=seq_dim,
        )

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: Layout = "half",
        scaling: Mapping[str, Any] | None = None,
        max_position_embeddings: int | None = None,
        seq_dim: int = -2,
    ) -> None:
        super().__init__()
        self.head_dim = checks.check_channels(head_dim, "head_dim", minimum=2)
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even; got {head_dim}")
        rd = self.head_dim if rotary_dim is None else rotary_dim
        self.rotary_dim = checks.check_channels(rd, "rotary_dim", minimum=2)
        if self.rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even; got {rotary_dim}")
        if self.rotary_dim > self.head_dim:
            raise ValueError(f"rotary_dim ({rotary_dim}) must be <= head_dim ({head_dim})")
        checks.check_choice(layout, "layout", LAYOUTS)
        self.layout: Layout = layout
        if isinstance(seq_dim, bool) or seq_dim not in (-2, -3):
            raise ValueError(
                f"seq_dim must be -2 (batch, heads, seq, head_dim) or -3 "
                f"(batch, seq, heads, head_dim); got {seq_dim!r}"
            )
        self.seq_dim = seq_dim
        self.base = checks.check_number(base, "base", positive=True)
        self.max_position_embeddings = (
            None
            if max_position_embeddings is None
            else checks.check_int(max_position_embeddings, "max_position_embeddings", minimum=1)
        )
        self.rope_type, self.params = _resolve_scaling(scaling, self.max_position_embeddings)
        self._policy = LengthPolicy(
            self.rope_type,
            self._frequencies,
            max_position_embeddings=self.params.get("max_position_embeddings"),
            original_max_position_embeddings=self.params.get("original_max_position_embeddings"),
        )
        self.width, self.initial_length = self.rotary_dim, INITIAL_LENGTH
        self.reset_parameters()  # inv_freq
        self._table_for(INITIAL_LENGTH, torch.device("cpu"), torch.float32)

    def extra_repr(self) -> str:
        parts = [f"{self.head_dim}", f"base={self.base:g}", f"layout={self.layout!r}"]
        if self.rotary_dim != self.head_dim:
            parts.append(f"rotary_dim={self.rotary_dim}")
        if self.rope_type != "default":
            parts.append(f"rope_type={self.rope_type!r}")
        if self.seq_dim != -2:
            parts.append(f"seq_dim={self.seq_dim}")
        return ", ".join(parts)

    # ------------------------------------------------------------------ frequencies

    def _frequencies(self, seq_len: int | None) -> RopeFrequencies:
        return frequencies(
            self.rope_type,
            self.rotary_dim,
            self.base,
            self.params,
            head_dim=self.head_dim,
            seq_len=seq_len,
        )

    @property
    def _freqs(self) -> RopeFrequencies:
        """The frequencies in use (a length-dependent schedule changes them per call)."""
        return self._policy.current

    @property
    def attention_scaling(self) -> float:
        """The factor on cos and sin of the current frequencies."""
        return self._freqs.attention_scaling

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        return {"inv_freq": torch.tensor(self._freqs.inv_freq, dtype=torch.float32)}

    def _prepare(self, needed: int) -> None:
        """HF's ``dynamic_rope_update`` for a call that needs ``needed`` positions."""
        if self.rope_type in LENGTH_DEPENDENT:
            with LOCK:  # tables are built under the same lock: never from stale frequencies
                if self._policy.update(needed):
                    self.clear_tables()
                    self.reset_parameters()

    # ------------------------------------------------------------------ tables

    def _build(self, n: int, device: torch.device, dtype: torch.dtype) -> Tables:
        positions = torch.arange(n, device=device)
        return cos_sin(positions, self._freqs, layout=self.layout, dtype=dtype)

    def _direct(self, positions: torch.Tensor, dtype: torch.dtype) -> Tables:
        if positions.numel() == 0:
            empty = positions.new_zeros((*positions.shape, self.rotary_dim), dtype=dtype)
            return empty, empty
        return cos_sin(positions, self._freqs, layout=self.layout, dtype=dtype)

    def cos_sin(
        self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of ``positions``, ``positions.shape + (rotary_dim,)``, in layout order.

        The values of :func:`posenc.rotary.tables.cos_sin` (through the cached
        table for integer positions), times the attention scaling; HF's
        ``LlamaRotaryEmbedding.forward`` returns the same pair (``half``).

        Args:
            positions: int or float tensor of any shape, on any device.
            dtype: result dtype (float32 by default).

        Raises:
            TypeError: ``positions`` not an int or float tensor.
            ValueError: positions beyond ``2**31`` in magnitude; tables of more than
                :data:`posenc.core.checks.MAX_ELEMENTS` values (``positions.numel()
                * rotary_dim``, refused before any work).
        """
        positions = checks.check_position_tensor(positions, "positions")
        c, s = self._lookup(positions, positions.device, checks.work_dtype(dtype))
        return c.to(dtype), s.to(dtype)

    def rotate(
        self, xs: Sequence[torch.Tensor], positions: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Every ``x`` ``(batch, heads, seq, head_dim)`` of ``xs`` rotated at ``positions``.

        The :class:`posenc.rotary.rotation.Rotation` protocol that
        :func:`posenc.attention` reads: ``positions`` ``(seq,)`` for every row or
        ``(rows, seq)`` per row; on CUDA one launch rotates them all.

        Raises:
            ValueError: a tensor without ``head_dim`` channels.
        """
        for x in xs:
            if x.shape[-1] != self.head_dim:
                raise ValueError(
                    f"rotary has head_dim={self.head_dim}; q and k have {x.shape[-1]} channels"
                )
        c, s = self.cos_sin(positions)
        if positions.ndim == 2:  # per row: broadcast over the heads
            c, s = c[:, None], s[:, None]
        return rotate_all(xs, c, s, layout=self.layout, rotary_dim=self.rotary_dim)

    # ------------------------------------------------------------------ KV-cache re-rotation

    def rerotate(
        self,
        keys: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        old_len: int,
        new_len: int,
    ) -> torch.Tensor:
        """Cached keys rotated with the tables for ``old_len`` positions, moved to ``new_len``'s.

        For the length-dependent schedules: ``dynamic`` (the base for a sequence of
        that many positions; below ``max_position_embeddings`` the original one) and
        ``longrope`` (the long factors above ``original_max_position_embeddings``).
        The lengths are HF's ``seq_len``, ``max(position_ids) + 1`` of the call that
        built the tables. The module's own state is not changed. The result equals
        the unrotated keys rotated with ``new_len``'s tables within float32 rounding
        (:func:`posenc.rotary.rerotate.rerotate_keys`); channels past ``rotary_dim``
        pass through.

        ``dynamic`` keeps a grown base while calls stay between
        ``max_position_embeddings`` and the longest length seen (HF's
        ``dynamic_rope_update``): ``new_len`` is the length whose tables the next call
        uses, that longest length in such a case.

        Args:
            keys: ``(batch, kv_heads, seq, head_dim)`` (``seq_dim=-2``) or ``(batch,
                seq, kv_heads, head_dim)`` (``seq_dim=-3``).
            positions: ``(seq,)`` or ``(batch, seq)`` positions of the keys; ``None``
                means ``0 .. seq - 1`` (a cache holding a whole sequence).
            old_len: the length the keys' tables were made for.
            new_len: the length whose tables they should carry.

        Raises:
            ValueError: a rope type whose frequencies do not depend on the length
                (nothing to re-rotate), lengths below 1, ``keys`` without
                ``head_dim`` channels, ``positions`` not matching ``keys``.
            TypeError: non-int lengths, non-float ``keys``, non-tensor ``positions``.
        """
        if self.rope_type not in LENGTH_DEPENDENT:
            raise ValueError(
                f"rope type {self.rope_type!r} has the same frequencies at every length: "
                f"cached keys never need re-rotation (only {', '.join(LENGTH_DEPENDENT)} do)"
            )
        old = self._frequencies(checks.check_int(old_len, "old_len", minimum=1))
        new = self._frequencies(checks.check_int(new_len, "new_len", minimum=1))
        keys = checks.check_float_tensor(keys, "keys")
        if keys.ndim < -self.seq_dim or keys.shape[-1] != self.head_dim:
            raise ValueError(
                f"keys must have at least {-self.seq_dim} dims (seq_dim={self.seq_dim}) and "
                f"head_dim={self.head_dim} channels; got shape {tuple(keys.shape)}"
            )
        if positions is None:
            positions = torch.arange(keys.shape[self.seq_dim], device=keys.device)
        return rerotate_keys(keys, positions, old, new, layout=self.layout, seq_dim=self.seq_dim)

    # ------------------------------------------------------------------ rotation

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None = None,
        offset: Any = 0,
        *,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` and ``k`` by their positions.

        Args:
            q: ``(batch, heads, seq, head_dim)`` (``seq_dim=-2``) or ``(batch, seq,
                heads, head_dim)`` (``seq_dim=-3``); a batch-less form drops the
                first dim; ``(total_tokens, heads, head_dim)`` with ``cu_seqlens``.
            k: like ``q``, possibly with another head count (GQA).
            positions: ``(seq,)`` or ``(batch, seq)`` int (or float) positions;
                ``None`` means ``offset .. offset + seq - 1``.
            offset: the first position when ``positions`` is None: the number
                of tokens already in the KV cache (rotary-embedding-torch #11).
                An int or a 0-d int tensor.
            cu_seqlens: ``(n + 1,)`` int cumulative lengths of ``n`` packed
                sequences (flash-attn's ``varlen``); positions restart at 0 in
                each.

        Returns:
            ``(q', k')``, shaped and typed like ``q`` and ``k``.

        Raises:
            TypeError: non-float ``q``/``k``, or of different dtypes; bad
                ``positions``/``offset``/``cu_seqlens`` types.
            ValueError: wrong ``head_dim``, shapes, devices; ``positions`` and a
                non-zero ``offset``; positions beyond ``2**31``.
        """
        q = checks.check_float_tensor(q, "q")
        k = checks.check_float_tensor(k, "k")
        if q.dtype != k.dtype:
            raise TypeError(f"q and k must have the same dtype; got {q.dtype} and {k.dtype}")
        if q.device != k.device:
            raise ValueError(f"q and k must be on the same device; got {q.device} and {k.device}")
        for name, t in (("q", q), ("k", k)):
            if t.shape[-1] != self.head_dim:
                raise ValueError(
                    f"{name} must have head_dim={self.head_dim} channels; got shape "
                    f"{tuple(t.shape)}"
                )
        device, work = q.device, checks.work_dtype(q.dtype)
        offset_zero = checks.is_zero(offset)
        if cu_seqlens is not None:
            if positions is not None or not offset_zero:
                raise ValueError("cu_seqlens numbers positions itself: pass no positions or offset")
            for name, t in (("q", q), ("k", k)):
                if t.ndim != 3:
                    raise ValueError(
                        f"with cu_seqlens, {name} must be (total_tokens, heads, head_dim); "
                        f"got shape {tuple(t.shape)}"
                    )
            if q.shape[0] != k.shape[0]:
                raise ValueError(
                    f"q and k must hold the same tokens; got {q.shape[0]} and {k.shape[0]}"
                )
            packed = self._packed_positions(cu_seqlens, q.shape[0], device)
            c, s = self._lookup(packed, device, work)
            c, s = c.unsqueeze(-2), s.unsqueeze(-2)
        else:
            dim = self.seq_dim
            for name, t in (("q", q), ("k", k)):
                if t.ndim < -dim:
                    raise ValueError(
                        f"{name} must have at least {-dim} dims (seq_dim={dim}); got shape "
                        f"{tuple(t.shape)}"
                    )
            seq = q.shape[dim]
            if k.shape[dim] != seq:
                raise ValueError(
                    f"q and k must have the same sequence length (dim {dim}); got "
                    f"{seq} and {k.shape[dim]}"
                )
            if positions is None:
                c, s = self._range(offset, seq, device, work)
            else:
                if not offset_zero:
                    raise ValueError("pass positions or offset, not both: positions are absolute")
                positions = checks.check_position_tensor(positions, "positions")
                batched = positions.ndim == 2
                ok = positions.ndim in (1, 2) and positions.shape[-1] == seq
                if batched:
                    ok = ok and q.ndim == k.ndim == 4 and k.shape[0] == q.shape[0]
                    ok = ok and positions.shape[0] in (1, q.shape[0])
                if not ok:
                    raise ValueError(
                        f"positions must be (seq,) or (batch, seq) matching q "
                        f"{tuple(q.shape)} (seq_dim={dim}); got shape {tuple(positions.shape)}"
                    )
                c, s = self._lookup(positions, device, work)
                if batched:
                    # (batch, seq, r) -> (batch, 1, seq, r) for heads before seq
                    c, s = (c.unsqueeze(1), s.unsqueeze(1)) if dim == -2 else (c, s)
            if dim == -3:
                c, s = c.unsqueeze(-2), s.unsqueeze(-2)
        # c and s are this module's own tables, shaped for q and k above: no checks
        # again, and on CUDA one launch rotates both
        q, k = rotate_all((q, k), c, s, layout=self.layout, rotary_dim=self.rotary_dim)
        return q, k

    @staticmethod
    def _packed_positions(cu_seqlens: Any, total: int, device: torch.device) -> torch.Tensor:
        """:func:`posenc.positions.packed_positions` of ``cu_seqlens`` (a tensor) on ``device``."""
        from posenc.core.positions import packed_positions

        cu = checks.check_position_tensor(cu_seqlens, "cu_seqlens", floats=False)
        positions: torch.Tensor = packed_positions(cu.to(device), total)
        return positions
