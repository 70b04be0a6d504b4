"""The rotary module that :func:`posenc.hf.patch_model` puts into HF models.

:class:`HFRotaryEmbedding` lives here, at module level, so that patched models pickle,
deepcopy and ``torch.save`` like any other (a class defined inside a function cannot
be pickled). This module imports torch; :mod:`posenc.hf` does not, and serves
``posenc.hf.HFRotaryEmbedding`` from here on first access.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from posenc.core.buffers import DerivedBuffers
from posenc.core.tables import ExactTables, Tables
from posenc.families.rotary.config import MROPE_AXES, RopeSpec
from posenc.families.rotary.dynamic import LENGTH_DEPENDENT, LengthPolicy
from posenc.families.rotary.multiaxis import mrope_cos_sin
from posenc.families.rotary.schedules import RopeFrequencies
from posenc.families.rotary.tables import cos_sin

#: How an HF rotary module returns its tables, as :func:`posenc.hf.patch_model` reads them
#: from the module's own output: ``(cos, sin)`` in the half layout (``cat(theta, theta)``:
#: Llama and most), interleaved (``theta0, theta0, theta1, ...``: Cohere, BLT), half-width
#: (``theta`` once; the model widens it: gpt-oss, DeepSeek-V4), one complex tensor
#: ``scaling * exp(i theta)`` (DeepSeek-V2, Llama 4), or half-width with the sine first,
#: ``(sin, cos)`` (GPT-J, CodeGen: the model repeats each angle for its pair).
FORMS = ("half", "interleaved", "half_width", "complex", "half_width_sin_first")


class _CosSinTables(ExactTables):
    """Exact ``(cos, sin)`` of one set of frequencies in one layout, from cached tables.

    A decode step asks for one position: an index into the table instead of the
    exact angle computation (:func:`posenc.rotary.tables.cos_sin`), same values.
    """

    initial_length = 256
    width_name = "rotary_dim"

    def __init__(self, freqs: RopeFrequencies, layout: str) -> None:
        super().__init__()
        self.freqs, self.layout = freqs, layout
        self.width = 2 * len(freqs.omega)

    def _build(self, n: int, device: torch.device, dtype: torch.dtype) -> Tables:
        return self._direct(torch.arange(n, device=device), dtype)

    def _direct(self, positions: torch.Tensor, dtype: torch.dtype) -> Tables:
        return cos_sin(positions, self.freqs, layout=self.layout, dtype=dtype)  # type: ignore[arg-type]


class HFRotaryEmbedding(DerivedBuffers):
    """Drop-in for HF's ``*RotaryEmbedding`` modules, with exact cos/sin tables.

    ``forward(x, position_ids, layer_type=None) -> (cos, sin)``, each of
    shape ``position_ids.shape + (rotary_dim,)`` in HF's half layout
    (``cat(theta, theta)``), times the attention scaling, in ``x.dtype`` on
    ``x.device``: the contract of ``LlamaRotaryEmbedding.forward`` (and of
    Gemma 3's, which takes ``layer_type``). ``form`` gives the other forms
    HF's modules use (:data:`FORMS`): interleaved ``(cos, sin)`` (Cohere),
    half-width ones (gpt-oss, DeepSeek-V4), one complex64 tensor
    (DeepSeek-V2, Llama 4), or half-width ``(sin, cos)`` (GPT-J, CodeGen).

    Sequence-length-dependent types (``dynamic``, ``longrope``) follow HF's
    ``dynamic_rope_update`` with ``seq_len = max(position_ids) + 1``, through
    the policy :class:`posenc.rotary.dynamic.LengthPolicy` that
    :class:`posenc.Rotary` uses too: ``dynamic`` keeps the largest base it has
    grown to until a call falls strictly below ``max_position_embeddings``;
    ``longrope`` takes its long factors above ``original_max_position_embeddings``.
    (Keys cached under another base stay stale, as in HF: transformers #25104.)

    M-RoPE specs (``mrope_section`` set; Qwen2-VL, Qwen3-VL) take
    ``position_ids`` of ``(3, batch, seq)``, or ``(batch, seq)`` broadcast
    to the three axes as HF does, and return
    :func:`posenc.rotary.multiaxis.mrope_cos_sin` (``(batch, seq,
    rotary_dim)``).

    HF's ``inv_freq`` (``{layer_type}_inv_freq`` per layer type) is kept for code
    that reads it (``forward`` does not): float32, the original frequencies, a
    non-persistent buffer rebuilt exact by every move, cast and ``to_empty``
    (:mod:`posenc.core.buffers`).

    Args:
        specs: ``{None: spec}`` for a model with one RoPE, ``{layer_type:
            spec}`` for one RoPE per layer type.
        config: the HF config, kept as ``self.config`` for code that reads it.
        form: what ``forward`` returns, one of :data:`FORMS` (the module it
            replaces decides): ``(cos, sin)`` in the half or interleaved layout,
            half-width ``(cos, sin)`` of ``rotary_dim / 2``, one complex64
            tensor ``scaling * exp(i theta)`` of ``rotary_dim / 2``, or half-width
            ``(sin, cos)``.
        table_dtype: ``None`` (the default): the tables come in ``x.dtype``, as HF's
            modules return them. A dtype: they come in that dtype whatever ``x``
            is, as from a module that returns a table it holds (CodeGen); like such
            a table, it follows the module's casts (``model.to(torch.bfloat16)``).
    """

    def __init__(
        self,
        specs: Mapping[str | None, RopeSpec],
        config: Any = None,
        form: str = "half",
        table_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if not specs:
            raise ValueError("specs must hold at least one RopeSpec")
        if form not in FORMS:
            raise ValueError(f"form must be one of {', '.join(FORMS)}; got {form!r}")
        if table_dtype is not None and not (
            isinstance(table_dtype, torch.dtype) and table_dtype.is_floating_point
        ):
            raise ValueError(
                f"table_dtype must be a floating torch dtype or None; got {table_dtype!r}"
            )
        self.form = form
        # an empty buffer holding the tables' dtype: a cast of the module casts it too
        marker = None if table_dtype is None else torch.empty(0, dtype=table_dtype)
        self.register_buffer("table_dtype_marker", marker, persistent=False)
        self.specs = dict(specs)
        self.config = config
        self.per_layer_type = None not in self.specs
        self._policies = {
            k: LengthPolicy(
                s.rope_type,
                s.frequencies,
                max_position_embeddings=s.max_position_embeddings,
                original_max_position_embeddings=s.original_max_position_embeddings,
            )
            for k, s in self.specs.items()
        }
        if self.per_layer_type:
            self.layer_types = sorted(k for k in self.specs if k is not None)
            self.rope_type: Any = {k: s.rope_type for k, s in self.specs.items()}
            for k, policy in self._policies.items():
                setattr(self, f"{k}_attention_scaling", policy.original.attention_scaling)
        else:
            fixed = self._policies[None].original
            self.rope_type = self.specs[None].rope_type
            section = self.specs[None].mrope_section
            if section is not None:
                if self.specs[None].mrope_interleaved is None:
                    raise ValueError("an M-RoPE spec must say whether it is interleaved")
                self.mrope_section = list(section)  # HF's attribute
            self.attention_scaling = fixed.attention_scaling
        self.reset_parameters()  # the inv_freq buffers

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        # HF's attribute names, float32 like HF's, for code that reads them
        return {
            f"{k}_inv_freq" if self.per_layer_type else "inv_freq": torch.tensor(
                policy.original.inv_freq, dtype=torch.float32
            )
            for k, policy in self._policies.items()
        }

    @property
    def table_dtype(self) -> torch.dtype | None:
        """The dtype of the tables whatever ``x`` is, or ``None``: ``x.dtype``."""
        marker = self._buffers.get("table_dtype_marker")
        return None if marker is None else marker.dtype

    def frequencies(self, seq_len: int | None, layer_type: str | None = None) -> RopeFrequencies:
        """The frequencies for a call reaching ``seq_len`` (HF's ``dynamic_rope_update``).

        Length-dependent schedules update their state (as HF's module does);
        ``seq_len=None`` returns the frequencies in use without a change.
        """
        self._spec(layer_type)
        policy = self._policies[layer_type]
        if seq_len is not None:
            policy.update(seq_len)
        return policy.current

    def _spec(self, layer_type: str | None) -> RopeSpec:
        if layer_type not in self.specs:
            if self.per_layer_type:
                raise ValueError(
                    f"layer_type must be one of {self.layer_types}; got {layer_type!r}"
                )
            raise ValueError(f"this rotary module has one RoPE; got layer_type={layer_type!r}")
        return self.specs[layer_type]

    @torch.no_grad()
    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
    ) -> Any:
        """``(cos, sin)`` for ``position_ids`` in the replaced module's own form and dtype
        (``x``'s), from posenc's exact tables; ``layer_type`` picks a per-layer-type spec."""
        spec = self._spec(layer_type)
        seq_len = None
        if spec.rope_type in LENGTH_DEPENDENT:
            seq_len = int(position_ids.max()) + 1
        freqs = self.frequencies(seq_len, layer_type)
        fixed = self.table_dtype
        dtype = x.dtype if fixed is None else fixed
        if spec.mrope_section is not None:
            if position_ids.ndim == 2:
                position_ids = position_ids.expand(MROPE_AXES, -1, -1)
            if position_ids.ndim != 3 or position_ids.shape[0] != MROPE_AXES:
                raise ValueError(
                    f"M-RoPE position_ids must be (3, batch, seq) or (batch, seq); got "
                    f"shape {tuple(position_ids.shape)}"
                )
            return mrope_cos_sin(
                position_ids.to(x.device),
                freqs,
                spec.mrope_section,
                interleaved=bool(spec.mrope_interleaved),
                dtype=dtype,
            )
        positions = position_ids.to(x.device)
        if self.form in ("half", "interleaved"):
            return self._cos_sin(positions, freqs, layer_type, self.form, dtype)
        # half-width and complex: each angle once (the first half of the half layout)
        wide = torch.float32 if self.form == "complex" else dtype
        c, s = self._cos_sin(positions, freqs, layer_type, "half", wide)
        half = c.shape[-1] // 2
        c, s = c[..., :half], s[..., :half]
        if self.form == "half_width":
            return c, s
        if self.form == "half_width_sin_first":
            return s, c
        # HF builds its complex table from float32 angles whatever x's dtype: complex64
        return torch.complex(c, s)

    def _cos_sin(
        self,
        positions: torch.Tensor,
        freqs: RopeFrequencies,
        layer_type: str | None,
        layout: str,
        dtype: torch.dtype,
    ) -> Tables:
        """:func:`cos_sin` of ``positions``, through a cached table outside torch.compile.

        Inside a graph the exact computation is traced (nothing is built there). The
        table is replaced when the frequencies are (a length-dependent schedule).
        """
        if torch.compiler.is_compiling():
            return cos_sin(positions, freqs, layout=layout, dtype=dtype)  # type: ignore[arg-type]
        caches: dict[str | None, _CosSinTables] = self.__dict__.setdefault("_cos_sin_tables", {})
        tables = caches.get(layer_type)
        if tables is None or tables.freqs is not freqs or tables.layout != layout:
            tables = caches[layer_type] = _CosSinTables(freqs, layout)
        return tables._lookup(positions, positions.device, dtype)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state.pop("_cos_sin_tables", None)  # a cache: rebuilt on demand
        return state

    def extra_repr(self) -> str:
        fixed = self.table_dtype
        head = (f"form={self.form}, " if self.form != "half" else "") + (
            f"table_dtype={fixed}, " if fixed is not None else ""
        )
        return head + ", ".join(
            f"{k or 'rope'}: {s.rope_type}, base={s.base:g}, rotary_dim={s.rotary_dim}"
            + (
                ""
                if s.mrope_section is None
                else f", mrope_section={list(s.mrope_section)}, interleaved={s.mrope_interleaved}"
            )
            for k, s in self.specs.items()
        )


class HFGatheredRotaryEmbedding(DerivedBuffers):
    """Drop-in for HF's multi-axis rotary modules (vision towers' axial RoPE), exact.

    ``forward(x, position_ids) -> (cos, sin)``: ``position_ids`` is ``(axes,
    *rest)``, or ``(*rest, axes)`` with ``axis_last`` (a patch's row and column,
    or its time, row and column); output
    channel ``c`` of both tables is ``scaling * cos(position_ids[axis[c]] *
    omega[freq[c]])`` (and ``sin``), shape ``rest + (channels,)``, in
    ``x.dtype``. The frequencies are the unscaled ``base ** (-2k / rotary_dim)``
    of the module it replaces; which axis and frequency each output channel
    carries is read by :func:`posenc.hf.patch_model` from that module's own
    output (each family of HF vision tower recombines rows and columns in its
    own order: halves, interleaved, sections), and checked on a second probe.

    Args:
        base: ``rope_theta``.
        rotary_dim: twice the number of frequencies.
        axis, freq: per output channel, its position axis and frequency index.
        axes: how many position axes ``position_ids`` has.
        axis_last: the axes are ``position_ids``' last dim (``(patches, axes)``)
            rather than its first.
        broadcast: ``(batch, seq)`` positions are the same on every axis (a text
            model's M-RoPE, called with ``(axes, batch, seq)`` positions otherwise).
        leading: the tables get a leading dim of 1 (SAM 2's memory attention returns
            ``(1, patches, channels)`` for ``(patches, axes)`` positions).
        attention_scaling: multiplies cos and sin.
        config: the HF config, kept as ``self.config``.
    """

    def __init__(
        self,
        base: float,
        rotary_dim: int,
        axis: Any,
        freq: Any,
        axes: int,
        attention_scaling: float = 1.0,
        config: Any = None,
        axis_last: bool = False,
        broadcast: bool = False,
        leading: bool = False,
    ) -> None:
        super().__init__()
        from posenc.families.rotary.schedules import frequencies

        self.base = float(base)
        self.rotary_dim = int(rotary_dim)
        self.freqs = frequencies("default", self.rotary_dim, self.base)
        self.axis = [int(a) for a in axis]
        self.freq = [int(f) for f in freq]
        if len(self.axis) != len(self.freq):
            raise ValueError("axis and freq must give one entry per output channel")
        self.axes = int(axes)
        if any(not 0 <= a < self.axes for a in self.axis):
            raise ValueError(f"axis entries must lie in [0, {self.axes})")
        if any(not 0 <= f < self.rotary_dim // 2 for f in self.freq):
            raise ValueError(f"freq entries must lie in [0, {self.rotary_dim // 2})")
        self.attention_scaling = float(attention_scaling)
        self.config = config
        self.axis_last = bool(axis_last)
        self.broadcast = bool(broadcast)
        self.leading = bool(leading)
        self.rope_type = "axial"
        self.reset_parameters()

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        return {"inv_freq": torch.tensor(self.freqs.inv_freq, dtype=torch.float32)}

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[Any, Any]:
        """The replaced axial or M-RoPE module's output for ``position_ids`` (one row per
        axis), read channel by channel from posenc's exact tables."""
        if self.broadcast and position_ids.ndim == 2:
            # a text model's M-RoPE takes (batch, seq) positions as the same on every axis
            position_ids = position_ids.expand(self.axes, -1, -1)
        if self.axis_last and position_ids.ndim >= 1:
            position_ids = position_ids.movedim(-1, 0)
        if position_ids.ndim < 1 or position_ids.shape[0] != self.axes:
            shape = f"(..., {self.axes})" if self.axis_last else f"({self.axes}, ...)"
            raise ValueError(
                f"position_ids must be {shape}, one entry per axis; got shape "
                f"{tuple(position_ids.shape)}"
            )
        # (axes, *rest, K) exact tables, then each output channel's (axis, frequency)
        c, s = cos_sin(position_ids.to(x.device), self.freqs, layout="half", dtype=torch.float64)
        k = self.rotary_dim // 2
        c, s = c[..., :k], s[..., :k]
        axis = torch.tensor(self.axis, device=c.device)
        freq = torch.tensor(self.freq, device=c.device)
        rest = tuple(range(1, c.ndim - 1))
        c = c.permute(*rest, 0, -1)[..., axis, freq]  # (*rest, channels)
        s = s.permute(*rest, 0, -1)[..., axis, freq]
        if self.attention_scaling != 1.0:
            c, s = c * self.attention_scaling, s * self.attention_scaling
        if self.leading:
            c, s = c[None], s[None]
        return c.to(x.dtype), s.to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"axial: base={self.base:g}, rotary_dim={self.rotary_dim}, axes={self.axes}, "
            f"channels={len(self.axis)}"
        )


class HFLayerTypes(torch.nn.Module):
    """One exact rotary module per layer type, behind HF's ``forward(x, position_ids, layer_type)``.

    For models whose per-layer-type RoPE is multi-axis (Cohere Compass, NeoMME):
    each type's :class:`HFGatheredRotaryEmbedding` was read from the module it
    replaces. ``{layer_type}_inv_freq`` gives each type's frequencies, as HF names them.

    Args:
        per_type: layer type -> its rotary module.
        config: the HF config, kept as ``self.config``.
    """

    def __init__(self, per_type: Mapping[str, torch.nn.Module], config: Any = None) -> None:
        super().__init__()
        if not per_type:
            raise ValueError("per_type must hold at least one layer type")
        self.per_type = torch.nn.ModuleDict(dict(per_type))
        self.config = config
        self.layer_types = sorted(per_type)
        self.rope_type = {k: getattr(m, "rope_type", "default") for k, m in per_type.items()}

    def __getattr__(self, name: str) -> Any:
        per_type = self._modules.get("per_type")
        kind = name[: -len("_inv_freq")] if name.endswith("_inv_freq") else None
        if isinstance(per_type, torch.nn.ModuleDict) and kind is not None and kind in per_type:
            return per_type[kind].inv_freq
        return super().__getattr__(name)

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
    ) -> Any:
        """The output of ``layer_type``'s module (one per layer type of the config)."""
        if layer_type is None or layer_type not in self.per_type:
            raise ValueError(f"layer_type must be one of {self.layer_types}; got {layer_type!r}")
        return self.per_type[layer_type](x, position_ids)
