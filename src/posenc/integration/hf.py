"""HF transformers integration: read RoPE configs, patch models with exact cos/sin.

- :func:`rope_spec` reads the rotary settings of a transformers config object or
  a plain ``config.json`` dict, in either form transformers has used:

  - v5: ``rope_parameters = {"rope_type": ..., "rope_theta": ..., ...}``, or,
    for models whose layer types use different RoPE (Gemma 3: sliding and
    full attention), one such dict per layer type
    (``rope_parameters = {"sliding_attention": {...}, "full_attention": {...}}``
    with ``layer_types`` naming them);
  - v4: ``rope_scaling = {"rope_type" or "type": ..., "factor": ...}`` next to a
    top-level ``rope_theta`` (and ``partial_rotary_factor``).

  It returns a frozen :class:`RopeSpec` whose :meth:`RopeSpec.frequencies`
  calls :func:`posenc.rotary.schedules.frequencies`.
- :func:`patch_model` swaps the rotary modules of a loaded model for
  :class:`HFRotaryEmbedding`, which has the same ``forward(x, position_ids)
  -> (cos, sin)`` contract but computes the tables exactly
  (:func:`posenc.rotary.tables.cos_sin`) instead of from float32 angles
  (shared/ANCHORS.md section 6: HF's float32 angles err by about
  ``position * omega * 2**-23``).

How each config attribute reaches the schedules (HF ``modeling_rope_utils``,
transformers 5.x, ``standardize_rope_params`` and the ``_compute_*``
functions):

- ``base`` is ``rope_theta`` (inside ``rope_parameters``, else top level, else
  GPT-NeoX's ``rotary_emb_base``, else HF's ``default_theta`` 10000).
- ``head_dim = config.head_dim or hidden_size // num_attention_heads``;
  ``rotary_dim = int(head_dim * partial_rotary_factor)`` (GPT-NeoX spells the
  factor ``rotary_pct``), except for ``proportional``, which covers the whole
  head and reads the factor itself.
- ``max_position_embeddings`` (a config attribute) is passed to the schedules
  that take it (``dynamic``, ``longrope``); ``original_max_position_embeddings``
  defaults to ``max_position_embeddings`` for ``llama3``, ``yarn`` and
  ``longrope``, and a top-level ``original_max_position_embeddings`` wins over
  the one in ``rope_parameters`` (Phi-3, as HF does). A ``yarn`` ``factor`` of
  ``None`` means ``max_position_embeddings / original_max_position_embeddings``
  (DeepSeek-V3, as HF does).
- Every other key goes to the schedule unchanged, which rejects unknown and
  missing keys with a ``ValueError`` (HF only logs a warning).

Multi-axis RoPE (M-RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL): ``mrope_section``
(and Qwen3-VL's ``mrope_interleaved``) in ``rope_parameters`` are read into
:attr:`RopeSpec.mrope_section` and :attr:`RopeSpec.mrope_interleaved`; the
patched module then takes ``(3, batch, seq)`` positions and computes
:func:`posenc.rotary.multiaxis.mrope_cos_sin`. Whether a module interleaves
(transformers decides it by model class, not by config) is read from the
config when it says, and always checked against the module's own output.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from posenc.families.rotary.schedules import PARAMETERS, RopeFrequencies, frequencies

# HFRotaryEmbedding is defined on first access (module __getattr__), so that rope_spec
# and this module import without torch
__all__ = ["RopeSpec", "patch_model", "rope_layer_types", "rope_spec"]

#: HF's ``RotaryEmbeddingConfigMixin.default_theta``: the base when a config names none.
DEFAULT_THETA = 10_000.0
#: Old names of rope types: ``su`` is Phi-3's first name for ``longrope``.
_TYPE_ALIASES = {"su": "longrope"}
#: Types that read ``original_max_position_embeddings`` (HF ``standardize_rope_params``).
_ORIGINAL_MAX_TYPES = ("llama3", "yarn", "longrope")
#: Keys of ``rope_parameters`` that are not schedule parameters.
_GENERAL_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
#: Keys that mark a multi-axis RoPE.
_MULTI_AXIS_KEYS = ("mrope_section", "mrope_interleaved")
#: M-RoPE position axes: temporal, height, width.
_MROPE_AXES = 3


@dataclass(frozen=True)
class RopeSpec:
    """The rotary settings of one model (or one layer type), ready for the schedules.

    Attributes:
        rope_type: a key of :data:`posenc.rotary.schedules.SCHEDULES`.
        base: ``rope_theta``.
        params: the schedule's parameters (HF key names, without ``rope_type``
            and ``rope_theta``), including the config attributes the schedule
            reads (``max_position_embeddings`` ...); lists are stored as tuples.
        head_dim: channels per attention head.
        rotary_dim: channels that rotate (``head_dim`` for ``proportional``,
            whose partial factor is in ``params``).
        partial_rotary_factor: the fraction of ``head_dim`` that rotates.
        max_position_embeddings: the config's value, ``None`` if it has none.
        original_max_position_embeddings: the pretraining length, for the types
            that use one (``llama3``, ``yarn``, ``longrope``), else ``None``.
        layer_type: the layer type the spec was read for, ``None`` for models
            with one RoPE.
        mrope_section: M-RoPE's frequencies per section (summing to
            ``rotary_dim / 2``), ``None`` for one-axis RoPE.
        mrope_interleaved: Qwen3-VL's interleaved M-RoPE (``True``),
            Qwen2-VL's contiguous sections (``False``), or ``None`` when the
            config does not say (transformers decides by model class;
            :func:`patch_model` reads it from the module).
    """

    rope_type: str
    base: float
    params: Mapping[str, Any] = field(hash=False)
    head_dim: int
    rotary_dim: int
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int | None = None
    original_max_position_embeddings: int | None = None
    layer_type: str | None = None
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool | None = None

    def frequencies(self, seq_len: int | None = None) -> RopeFrequencies:
        """The schedule's frequencies, for a sequence of ``seq_len`` positions.

        ``seq_len`` matters to ``dynamic`` (NTK base grows past
        ``max_position_embeddings``) and ``longrope`` (long factors past
        ``original_max_position_embeddings``); HF's value is ``max(position_ids) + 1``.
        """
        return frequencies(
            self.rope_type,
            self.rotary_dim,
            self.base,
            dict(self.params),
            head_dim=self.head_dim,
            seq_len=seq_len,
        )


# --------------------------------------------------------------------------------------
# Reading configs.


def _get(config: Any, key: str, default: Any = None) -> Any:
    """``config[key]`` for a dict, ``config.key`` for a config object; ``None`` means absent."""
    if isinstance(config, Mapping):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


def _has(config: Any, key: str) -> bool:
    if isinstance(config, Mapping):
        return config.get(key) is not None
    return getattr(config, key, None) is not None


def _text_config(config: Any) -> Any:
    """The part of a composite config (``text_config``) that holds the RoPE settings."""
    if any(_has(config, k) for k in ("rope_parameters", "rope_scaling", "rope_theta")):
        return config
    text = _get(config, "text_config")
    return config if text is None else text


def _raw_parameters(config: Any) -> dict[str, Any]:
    """``rope_parameters`` (v5) or ``rope_scaling`` (v4), copied; ``{}`` if neither."""
    v5 = _get(config, "rope_parameters")
    v4 = _get(config, "rope_scaling")
    if v5 is not None and not isinstance(v5, Mapping):
        raise TypeError(f"rope_parameters must be a dict; got {v5!r}")
    if v4 is not None and not isinstance(v4, Mapping):
        raise TypeError(f"rope_scaling must be a dict; got {v4!r}")
    if v5 and v4 and dict(v5) != dict(v4):
        # transformers copies rope_scaling into rope_parameters: both set and different is ambiguous
        raise ValueError(
            "config has both rope_parameters (v5) and rope_scaling (v4) and they differ; "
            "keep one of them"
        )
    return dict(v5 or v4 or {})


def _nested_keys(config: Any, raw: Mapping[str, Any]) -> list[str]:
    """The layer types ``raw`` is nested under (HF ``nested_rope_parameter_keys``)."""
    labels = _get(config, "_rope_type_labels") or _get(config, "layer_types") or ()
    keys = [k for k in raw if k in set(labels)]
    if not keys and raw and all(v is None or isinstance(v, Mapping) for v in raw.values()):
        keys = list(raw)  # a plain dict without layer_types: nested if every value is a dict
    return keys


def rope_layer_types(config: Any) -> tuple[str, ...]:
    """The layer types with their own RoPE settings; ``()`` for a model with one RoPE.

    Layer types whose entry is ``None`` (layers without RoPE) are left out.
    """
    config = _text_config(config)
    raw = _raw_parameters(config)
    return tuple(k for k in _nested_keys(config, raw) if raw[k] is not None)


def _head_dim(config: Any) -> int:
    head_dim = _get(config, "head_dim")
    if head_dim is not None:
        return _positive_int(head_dim, "head_dim")
    hidden, heads = _get(config, "hidden_size"), _get(config, "num_attention_heads")
    if hidden is None or heads is None:
        raise ValueError(
            "config gives no head dim: it needs head_dim, or hidden_size and num_attention_heads"
        )
    return _positive_int(hidden, "hidden_size") // _positive_int(heads, "num_attention_heads")


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
    return value


def _rope_type(parameters: Mapping[str, Any], where: str) -> str:
    rope_type = parameters.get("rope_type")
    alias = parameters.get("type")
    if rope_type is not None and alias is not None and rope_type != alias:
        raise ValueError(
            f"{where} names two rope types: rope_type={rope_type!r} and type={alias!r} "
            "(type is the old name of rope_type)"
        )
    name = rope_type if rope_type is not None else alias if alias is not None else "default"
    if not isinstance(name, str):
        raise TypeError(f"rope_type must be a str; got {name!r}")
    return _TYPE_ALIASES.get(name, name)


def rope_spec(config: Any, layer_type: str | None = None) -> RopeSpec:
    """Read the RoPE settings of a transformers config or a ``config.json`` dict.

    Args:
        config: a ``transformers.PretrainedConfig`` (its ``text_config`` for
            composite models) or a plain dict as in ``config.json``, v5
            (``rope_parameters``) or v4 (``rope_scaling`` + ``rope_theta``).
        layer_type: for configs with one RoPE per layer type (see
            :func:`rope_layer_types`), which one to read: required for those,
            rejected for the others.

    Returns:
        The spec; its parameters have been checked by computing the
        frequencies once.

    Raises:
        ValueError: no head dim, unknown rope type (the valid ones are listed),
            missing or unknown parameters (as the schedule reports them),
            a missing or unknown ``layer_type``, an ``mrope_section`` that
            does not sum to ``rotary_dim / 2``.
        TypeError: ``rope_parameters`` or ``rope_scaling`` is not a dict.
    """
    config = _text_config(config)
    raw = _raw_parameters(config)
    nested = _nested_keys(config, raw)
    if nested:
        if layer_type is None:
            raise ValueError(
                "config has one RoPE per layer type; pass layer_type= one of "
                f"{', '.join(repr(k) for k in nested)}"
            )
        if layer_type not in nested:
            raise ValueError(
                f"unknown layer_type {layer_type!r}; this config's layer types with RoPE "
                f"settings: {', '.join(repr(k) for k in nested)}"
            )
        if raw[layer_type] is None:
            raise ValueError(f"layer type {layer_type!r} has no RoPE (its rope_parameters is None)")
        parameters = dict(raw[layer_type])
        where = f"rope_parameters[{layer_type!r}]"
    else:
        if layer_type is not None:
            raise ValueError(
                f"layer_type={layer_type!r} given, but this config has one RoPE for all layers"
            )
        parameters = raw
        where = "rope_parameters" if _has(config, "rope_parameters") else "rope_scaling"

    section = parameters.pop("mrope_section", None)
    interleaved = parameters.pop("mrope_interleaved", None)
    if interleaved is not None and not isinstance(interleaved, bool):
        raise TypeError(f"{where}['mrope_interleaved'] must be a bool; got {interleaved!r}")
    if interleaved is not None and section is None:
        raise ValueError(f"{where} has mrope_interleaved but no mrope_section")
    if section is not None and not isinstance(section, (list, tuple)):
        raise TypeError(f"{where}['mrope_section'] must be a list of ints; got {section!r}")

    rope_type = _rope_type(parameters, where)
    if _get(config, "model_type") == "phi3" and rope_type == "yarn":
        rope_type = "longrope"  # transformers' Phi3Config renames its legacy "yarn" to longrope

    base = parameters.get("rope_theta")
    if base is None:
        base = _get(config, "rope_theta", _get(config, "rotary_emb_base", DEFAULT_THETA))
    partial = parameters.get("partial_rotary_factor")
    if partial is None:
        partial = _get(config, "partial_rotary_factor", _get(config, "rotary_pct", 1.0))
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise ValueError(f"partial_rotary_factor must lie in (0, 1]; got {partial!r}")

    head_dim = _head_dim(config)
    max_pos = _get(config, "max_position_embeddings")
    params = {k: v for k, v in parameters.items() if k not in _GENERAL_KEYS}
    known = PARAMETERS.get(rope_type)
    takes = set(known[0] | known[1]) if known is not None else set()

    original = None
    if rope_type in _ORIGINAL_MAX_TYPES:
        top = None if nested else _get(config, "original_max_position_embeddings")
        original = top if top is not None else params.get("original_max_position_embeddings")
        if original is None:
            original = max_pos
        if original is not None:
            params["original_max_position_embeddings"] = original
    if rope_type == "yarn" and params.get("factor") is None and max_pos and original:
        params["factor"] = max_pos / original
    if "max_position_embeddings" in takes and max_pos is not None:
        params.setdefault("max_position_embeddings", max_pos)
    if rope_type == "proportional":
        params["partial_rotary_factor"] = partial
        rotary_dim = head_dim
    else:
        rotary_dim = int(head_dim * partial)
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
    if section is not None:
        section = tuple(section)
        _check_mrope(section, rotary_dim, interleaved)

    spec = RopeSpec(
        rope_type=rope_type,
        base=float(base),
        params=types.MappingProxyType(params),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        partial_rotary_factor=float(partial),
        max_position_embeddings=max_pos,
        original_max_position_embeddings=original,
        layer_type=layer_type,
        mrope_section=section,
        mrope_interleaved=interleaved,
    )
    spec.frequencies()  # the schedule reports unknown types, missing and unknown keys
    return spec


def _check_mrope(section: tuple[int, ...], rotary_dim: int, interleaved: bool | None) -> None:
    """Raise unless ``section`` splits the ``rotary_dim / 2`` frequencies (either order if None)."""
    from posenc.families.rotary.multiaxis import mrope_axes

    modes = (False,) if interleaved is None else (interleaved,)
    for mode in modes:
        mrope_axes(section, rotary_dim // 2, _MROPE_AXES, mode)


# --------------------------------------------------------------------------------------
# Patching models.

#: Types whose frequencies depend on the sequence length (HF ``dynamic_rope_update``).
_LENGTH_DEPENDENT = ("dynamic", "longrope")


@functools.cache
def _module_class() -> type:
    """Define :class:`HFRotaryEmbedding` on first use: ``posenc.hf`` imports without torch."""
    import torch
    from torch import nn

    from posenc.families.rotary.multiaxis import mrope_cos_sin
    from posenc.families.rotary.tables import cos_sin

    class HFRotaryEmbedding(nn.Module):
        """Drop-in for HF's ``*RotaryEmbedding`` modules, with exact cos/sin tables.

        ``forward(x, position_ids, layer_type=None) -> (cos, sin)``, each of
        shape ``position_ids.shape + (rotary_dim,)`` in HF's half layout
        (``cat(theta, theta)``), times the attention scaling, in ``x.dtype`` on
        ``x.device``: the contract of ``LlamaRotaryEmbedding.forward`` (and of
        Gemma 3's, which takes ``layer_type``).

        Sequence-length-dependent types follow HF with ``seq_len =
        max(position_ids) + 1``: ``longrope`` uses its long factors when
        ``seq_len > original_max_position_embeddings``, its short ones
        otherwise; ``dynamic`` recomputes the NTK base for ``seq_len >
        max_position_embeddings`` and uses the original frequencies otherwise.
        Unlike HF, which keeps the largest base it has grown to until a
        sequence falls strictly below ``max_position_embeddings``, the choice
        depends on the current call only, so the same positions always get the
        same tables. (Keys cached under another base stay stale in both:
        transformers #25104.)

        M-RoPE specs (``mrope_section`` set; Qwen2-VL, Qwen3-VL) take
        ``position_ids`` of ``(3, batch, seq)``, or ``(batch, seq)`` broadcast
        to the three axes as HF does, and return
        :func:`posenc.rotary.multiaxis.mrope_cos_sin` (``(batch, seq,
        rotary_dim)``).

        Args:
            specs: ``{None: spec}`` for a model with one RoPE, ``{layer_type:
                spec}`` for one RoPE per layer type.
            config: the HF config, kept as ``self.config`` for code that reads it.
        """

        def __init__(self, specs: Mapping[str | None, RopeSpec], config: Any = None) -> None:
            super().__init__()
            if not specs:
                raise ValueError("specs must hold at least one RopeSpec")
            self.specs = dict(specs)
            self.config = config
            self.per_layer_type = None not in self.specs
            self._fixed = {k: s.frequencies() for k, s in self.specs.items()}
            self._long = {
                k: s.frequencies(seq_len=s.original_max_position_embeddings + 1)
                for k, s in self.specs.items()
                if s.rope_type == "longrope" and s.original_max_position_embeddings is not None
            }
            self._grown: dict[str | None, tuple[int, RopeFrequencies]] = {}
            if self.per_layer_type:
                self.layer_types = sorted(k for k in self.specs if k is not None)
                self.rope_type: Any = {k: s.rope_type for k, s in self.specs.items()}
                for k, f in self._fixed.items():
                    self.register_buffer(f"{k}_inv_freq", _inv_freq(f), persistent=False)
                    setattr(self, f"{k}_attention_scaling", f.attention_scaling)
            else:
                fixed = self._fixed[None]
                self.rope_type = self.specs[None].rope_type
                section = self.specs[None].mrope_section
                if section is not None:
                    if self.specs[None].mrope_interleaved is None:
                        raise ValueError("an M-RoPE spec must say whether it is interleaved")
                    self.mrope_section = list(section)  # HF's attribute
                self.attention_scaling = fixed.attention_scaling
                # HF's attribute, float32 like HF's, for code that reads it; forward does not
                self.register_buffer("inv_freq", _inv_freq(fixed), persistent=False)

        def frequencies(
            self, seq_len: int | None, layer_type: str | None = None
        ) -> RopeFrequencies:
            """The frequencies used for a sequence of ``seq_len`` positions."""
            spec = self._spec(layer_type)
            if spec.rope_type == "longrope" and layer_type in self._long:
                original = spec.original_max_position_embeddings
                assert original is not None  # _long holds only specs that have one
                if seq_len is not None and seq_len > original:
                    return self._long[layer_type]
                return self._fixed[layer_type]
            if spec.rope_type == "dynamic":
                max_pos = spec.max_position_embeddings
                if seq_len is None or max_pos is None or seq_len <= max_pos:
                    return self._fixed[layer_type]
                grown = self._grown.get(layer_type)
                if grown is None or grown[0] != seq_len:
                    grown = (seq_len, spec.frequencies(seq_len=seq_len))
                    self._grown[layer_type] = grown  # one atomic store: safe across threads
                return grown[1]
            return self._fixed[layer_type]

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
        ) -> tuple[torch.Tensor, torch.Tensor]:
            spec = self._spec(layer_type)
            seq_len = None
            if spec.rope_type in _LENGTH_DEPENDENT:
                seq_len = int(position_ids.max()) + 1
            freqs = self.frequencies(seq_len, layer_type)
            if spec.mrope_section is not None:
                if position_ids.ndim == 2:
                    position_ids = position_ids.expand(_MROPE_AXES, -1, -1)
                if position_ids.ndim != 3 or position_ids.shape[0] != _MROPE_AXES:
                    raise ValueError(
                        f"M-RoPE position_ids must be (3, batch, seq) or (batch, seq); got "
                        f"shape {tuple(position_ids.shape)}"
                    )
                return mrope_cos_sin(
                    position_ids.to(x.device),
                    freqs,
                    spec.mrope_section,
                    interleaved=bool(spec.mrope_interleaved),
                    dtype=x.dtype,
                )
            return cos_sin(position_ids.to(x.device), freqs, layout="half", dtype=x.dtype)

        def extra_repr(self) -> str:
            return ", ".join(
                f"{k or 'rope'}: {s.rope_type}, base={s.base:g}, rotary_dim={s.rotary_dim}"
                + (
                    ""
                    if s.mrope_section is None
                    else f", mrope_section={list(s.mrope_section)}, "
                    f"interleaved={s.mrope_interleaved}"
                )
                for k, s in self.specs.items()
            )

    def _inv_freq(freqs: RopeFrequencies) -> torch.Tensor:
        return torch.tensor(freqs.inv_freq, dtype=torch.float32)

    HFRotaryEmbedding.__module__ = __name__
    return HFRotaryEmbedding


def __getattr__(name: str) -> Any:
    """``posenc.hf.HFRotaryEmbedding``, created on first access (it needs torch)."""
    if name == "HFRotaryEmbedding":
        return _module_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_multi_axis(module: Any) -> bool:
    if hasattr(module, "mrope_section") or "mrope" in type(module).__name__.lower():
        return True
    config = getattr(module, "config", None)
    raw = _raw_parameters(config) if config is not None else {}
    dicts = [raw, *(v for v in raw.values() if isinstance(v, Mapping))]
    return any(k in d for d in dicts for k in _MULTI_AXIS_KEYS)


def _inv_freq_rtol(spec: RopeSpec) -> float:
    """Bound on the relative error of HF's float32 ``inv_freq`` (see ``_check_against_module``)."""
    factor = spec.params.get("factor")
    factor = factor if isinstance(factor, (int, float)) and factor > 1 else 1.0
    return (4 + abs(math.log(spec.base)) + factor) * 2.0**-23


def _check_against_module(module: Any, spec: RopeSpec, name: str, prefix: str = "") -> None:
    """Refuse to patch when HF's own float32 frequencies disagree with the spec's."""
    import torch

    theirs = getattr(module, f"{prefix}original_inv_freq", None)
    if theirs is None:
        theirs = getattr(module, f"{prefix}inv_freq", None)
    if not isinstance(theirs, torch.Tensor):
        return
    ours = spec.frequencies().inv_freq
    theirs_np = theirs.detach().to("cpu", torch.float64).numpy()
    # HF's float32 inv_freq (tests/test_rotary_schedules.py derives it): the exponent's
    # rounding costs ln(base) ulps, pow and the divisions a few more, and the blends of
    # yarn and llama3 amplify the ramp's rounding up to (factor - 1) times
    rtol = _inv_freq_rtol(spec)
    if theirs_np.shape != ours.shape or not all(
        abs(t - o) <= rtol * abs(o) for t, o in zip(theirs_np.tolist(), ours.tolist(), strict=True)
    ):
        raise ValueError(
            f"{name}: posenc's {spec.rope_type!r} frequencies (rotary_dim={spec.rotary_dim}) do "
            f"not match the module's own {prefix}inv_freq (shape {tuple(theirs.shape)}); "
            "this model computes RoPE in a way posenc.hf does not recognise, so it is not patched"
        )


def _mrope_spec(module: Any, spec: RopeSpec, name: str) -> RopeSpec:
    """The spec of an HF M-RoPE module, its section order read from the module's own output.

    transformers picks contiguous (Qwen2-VL) or interleaved (Qwen3-VL) sections
    by model class, and a section list from the module (``mrope_section``, with
    a per-class default when the config has none). Both candidates are tried
    on a probe with distinct axes; the one matching the module's tables within
    HF's float32 error is kept, and a module matching neither is refused.
    """
    import dataclasses

    import torch

    from posenc.families.rotary.multiaxis import mrope_cos_sin

    section = getattr(module, "mrope_section", None)
    section = tuple(section) if section is not None else spec.mrope_section
    if section is None:
        raise ValueError(f"{name}: an M-RoPE module without mrope_section; cannot patch it")
    candidates = (False, True) if spec.mrope_interleaved is None else (spec.mrope_interleaved,)
    inv_freq = getattr(module, "inv_freq", None)
    device = inv_freq.device if isinstance(inv_freq, torch.Tensor) else torch.device("cpu")
    steps = torch.arange(16, device=device)
    probe = torch.stack([steps, 2 * steps + 1, 3 * steps + 2])[:, None, :]  # (3, 1, 16)
    with torch.no_grad():
        theirs = module(torch.zeros(1, device=device), probe)
    freqs = spec.frequencies(seq_len=int(probe.max()) + 1)
    # HF's table error over positions up to P: s (P max(omega) (rtol + 2**-24) + 2**-22)
    top = float(probe.max()) * float(max(freqs.inv_freq, default=0.0))
    tol = freqs.attention_scaling * (top * (_inv_freq_rtol(spec) + 2.0**-24) + 2.0**-22)
    for interleaved in candidates:
        try:
            ours = mrope_cos_sin(probe, freqs, section, interleaved=interleaved)
        except ValueError:
            continue
        if all(
            t.shape == o.shape and float((t.float().cpu() - o.cpu()).abs().max()) <= tol
            for t, o in zip(theirs, ours, strict=True)
        ):
            return dataclasses.replace(spec, mrope_section=section, mrope_interleaved=interleaved)
    raise ValueError(
        f"{name}: the module's M-RoPE tables match neither posenc's contiguous nor its "
        f"interleaved order for mrope_section={list(section)}; "
        "this model computes RoPE in a way posenc.hf does not recognise, so it is not patched"
    )


def patch_model(model: Any) -> Any:
    """Replace every HF rotary module of ``model`` with an exact :class:`HFRotaryEmbedding`.

    The rotary modules are found by their shape, not by model class: modules
    whose class name ends with ``RotaryEmbedding`` and that carry HF's
    ``config``, ``rope_type`` and ``inv_freq`` (or ``{layer_type}_inv_freq``
    for per-layer-type modules such as Gemma 3's, whose ``forward`` takes a
    ``layer_type``). Each is checked against its own float32 ``inv_freq``
    before it is replaced, so a model computing RoPE some other way is
    refused instead of silently changed. M-RoPE modules (Qwen2-VL,
    Qwen3-VL text models) are also checked against their own tables on a
    probe, which settles their section order.

    Args:
        model: a loaded ``transformers`` model (any ``nn.Module``).

    Returns:
        ``model``, patched in place.

    Raises:
        ValueError: a rotary module that does not follow HF's contract
            (vision rotary modules of full VL models among them), frequencies
            or M-RoPE tables that do not match, or no rotary module at all.
    """
    found = [
        (name, module)
        for name, module in model.named_modules()
        if type(module).__name__.endswith("RotaryEmbedding")
    ]
    if not found:
        raise ValueError("model has no module whose class name ends with 'RotaryEmbedding'")
    replacements = []
    for name, module in found:
        label = f"{name or 'model'} ({type(module).__name__})"
        config = getattr(module, "config", None)
        rope_type = getattr(module, "rope_type", None)
        if config is None or rope_type is None:
            raise ValueError(
                f"{label} lacks HF's config/rope_type attributes and forward(x, position_ids) "
                "contract; posenc.hf cannot patch it"
            )
        takes_layer_type = "layer_type" in inspect.signature(module.forward).parameters
        specs: dict[str | None, RopeSpec] = {}
        multi_axis = _is_multi_axis(module)
        if multi_axis and (takes_layer_type or isinstance(rope_type, Mapping)):
            raise ValueError(f"{label}: M-RoPE with one RoPE per layer type is not supported")
        if takes_layer_type or isinstance(rope_type, Mapping):
            types_ = list(rope_type) if isinstance(rope_type, Mapping) else []
            if not types_:
                raise ValueError(f"{label} takes a layer_type but names no layer types")
            for lt in types_:
                specs[lt] = rope_spec(config, layer_type=lt)
                _check_type(label, specs[lt], rope_type[lt])
                _check_against_module(module, specs[lt], label, prefix=f"{lt}_")
        else:
            spec = rope_spec(config)
            _check_type(label, spec, rope_type)
            _check_against_module(module, spec, label)
            if multi_axis:
                spec = _mrope_spec(module, spec, label)
            elif spec.mrope_section is not None:
                raise ValueError(
                    f"{label}: its config has mrope_section but the module is not an M-RoPE "
                    "module; posenc.hf cannot tell how it uses the sections"
                )
            specs[None] = spec
        replacements.append((name, module, specs, config))

    cls = _module_class()
    for name, module, specs, config in replacements:
        new = cls(specs, config=config)
        buffers = list(module.buffers())
        if buffers:
            new.to(buffers[0].device)
        if name:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, new)
        else:
            raise ValueError("patch_model takes a model that contains a rotary module, not one")
    return model


def _check_type(label: str, spec: RopeSpec, module_type: Any) -> None:
    if _TYPE_ALIASES.get(module_type, module_type) != spec.rope_type:
        raise ValueError(
            f"{label} uses rope type {module_type!r} but its config reads as {spec.rope_type!r}"
        )
