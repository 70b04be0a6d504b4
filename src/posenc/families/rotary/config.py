"""Reading the RoPE settings of a transformers config: the schedules' input, beside them.

:func:`rope_spec` reads the rotary settings of a transformers config object or a
plain ``config.json`` dict, in either form transformers has used, as HF keeps
``modeling_rope_utils`` beside ``ROPE_INIT_FUNCTIONS``:

- v5: ``rope_parameters = {"rope_type": ..., "rope_theta": ..., ...}``, or, for
  models whose layer types use different RoPE (Gemma 3: sliding and full
  attention), one such dict per layer type (``rope_parameters =
  {"sliding_attention": {...}, "full_attention": {...}}`` with ``layer_types``
  naming them);
- v4: ``rope_scaling = {"rope_type" or "type": ..., "factor": ...}`` next to a
  top-level ``rope_theta`` (and ``partial_rotary_factor``).

It returns a frozen :class:`RopeSpec` whose :meth:`RopeSpec.frequencies` calls
:func:`posenc.rotary.schedules.frequencies`. :func:`parse_rope_type` is the one
reader of ``rope_type`` and its old alias ``type`` (``Rotary(scaling=...)`` uses
it too). Importable without torch. ``posenc.hf`` re-exports these names.

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
  defaults to ``max_position_embeddings`` for ``llama3``, ``yarn``,
  ``resonance_yarn`` and ``longrope``, and a top-level
  ``original_max_position_embeddings`` wins over the one in ``rope_parameters``
  (Phi-3, as HF does). A ``yarn`` (or ``resonance_yarn``) ``factor`` given as
  ``null`` means ``max_position_embeddings / original_max_position_embeddings``
  (DeepSeek-V3, as HF's ``_compute_yarn_parameters`` does); a ``factor`` left
  out is refused, as HF refuses it.
- A key transformers requires for the rope type (:data:`HF_REQUIRED`) and does
  not fill in itself (:func:`hf_fills`) is refused when missing, with
  transformers' own reason (its ``KeyError``: ``Missing required keys in
  `rope_parameters` for 'rope_type'='yarn': {'factor'}``); a key it leaves
  optional keeps its default.
- A dict without ``rope_type`` (nor ``type``) is ``default`` RoPE, as HF reads
  it; the keys a ``default`` dict has besides ``rope_theta`` and
  ``partial_rotary_factor`` are ignored, with a note, as HF's default RoPE
  ignores them (HF only logs "Unrecognized keys").
- Every other key goes to the schedule unchanged, which rejects unknown and
  missing keys with a ``ValueError`` (HF only logs a warning).

Multi-axis RoPE (M-RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL): ``mrope_section``
(and Qwen3-VL's ``mrope_interleaved``) in ``rope_parameters`` are read into
:attr:`RopeSpec.mrope_section` and :attr:`RopeSpec.mrope_interleaved` (``None``
when the config does not say: transformers decides it by model class).

Where a model's own code reads a key differently, the config is read as that code
does (:mod:`posenc.rotary.model_types`, one table per difference), and
:attr:`RopeSpec.notes` says what was read so:

- ``partial_rotary_factor`` is ignored by the default RoPE of the models whose
  ``compute_default_rope_parameters`` ignores it (Llama, Qwen2, Mistral, ...);
- a DeepSeek-style config without ``head_dim`` rotates ``qk_rope_head_dim``
  channels (MLA: the rest of each head does not rotate);
- GPT-J and CodeGen apply base-10000 RoPE over ``rotary_dim`` (64 when the config
  omits it, as their config classes default) with no RoPE key;
- Gemma 3's v4 ``rope_local_base_freq`` is its sliding layers' base (one RoPE
  per layer type, as transformers converts it);
- a model whose rotary module falls back on its own ``mrope_section`` is M-RoPE
  even when the config names none;
- :attr:`RopeSpec.layout` is the pairing the model's attention applies;
- a model type whose RoPE settings feed a rotary module of another kind (patch
  coordinates, timestamps, atom coordinates: EoMT-DINOv3, MusicFlamingo ...) is
  refused with what its module does instead: its settings give no frequencies the
  model uses.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from posenc.core import checks
from posenc.families.rotary import model_types
from posenc.families.rotary.schedules import PARAMETERS, RopeFrequencies, frequencies

#: HF's ``RotaryEmbeddingConfigMixin.default_theta``: the base when a config names none.
DEFAULT_THETA = 10_000.0
#: Old names of rope types: ``su`` is Phi-3's first name for ``longrope``; Qwen2-VL's and
#: Qwen2.5-VL's config.json say ``mrope``, which their transformers config classes read as
#: ``default`` (the sections are M-RoPE's, the frequencies the default ones).
TYPE_ALIASES = {"su": "longrope", "mrope": "default"}
#: Types that read ``original_max_position_embeddings`` (HF ``standardize_rope_params``).
_ORIGINAL_MAX_TYPES = ("llama3", "yarn", "longrope", "resonance_yarn")
#: Types that read YaRN's parameters (a ``factor`` of ``None`` defaults as HF's yarn).
_YARN_TYPES = ("yarn", "resonance_yarn")
#: The keys of ``rope_parameters`` transformers (5.x) requires for each of its rope types:
#: the ``required_keys`` of ``RotaryEmbeddingConfigMixin._validate_<type>_rope_parameters``,
#: whose ``_check_received_keys`` raises ``KeyError`` naming the missing ones. A key that is
#: present counts, ``null`` included (HF tests ``set(rope_parameters.keys())``).
#: ``tests/test_rope_required.py`` checks this table against the installed transformers.
HF_REQUIRED: dict[str, frozenset[str]] = {
    "default": frozenset({"rope_type"}),
    "axial": frozenset({"rope_type"}),
    "linear": frozenset({"rope_type", "factor"}),
    "dynamic": frozenset({"rope_type", "factor"}),
    "yarn": frozenset({"rope_type", "factor", "original_max_position_embeddings"}),
    "longrope": frozenset(
        {"rope_type", "short_factor", "long_factor", "original_max_position_embeddings"}
    ),
    "llama3": frozenset(
        {
            "rope_type",
            "factor",
            "original_max_position_embeddings",
            "low_freq_factor",
            "high_freq_factor",
            "rope_theta",
        }
    ),
    "proportional": frozenset({"rope_type", "rope_theta"}),
}
#: The rope types whose ``original_max_position_embeddings`` HF's ``standardize_rope_params``
#: fills in (from a top-level ``original_max_position_embeddings``, else
#: ``max_position_embeddings``) before it checks the required keys.
HF_ORIGINAL_MAX_TYPES = ("llama3", "yarn", "longrope")
#: Keys of ``rope_parameters`` that are not schedule parameters.
_GENERAL_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
#: Keys of ``rope_parameters`` that transformers reads elsewhere, never for the frequencies:
#: Ministral 3 and Mistral 4 scale the queries by ``llama_4_scaling_beta`` in attention.
NOT_FREQUENCIES = ("llama_4_scaling_beta",)
#: Keys that mark a multi-axis RoPE.
MULTI_AXIS_KEYS = ("mrope_section", "mrope_interleaved")
#: M-RoPE position axes: temporal, height, width.
MROPE_AXES = 3


class FrozenParams(Mapping[str, Any]):
    """A read-only dict of schedule parameters that pickles and copies.

    :attr:`RopeSpec.params` is one: frozen like the spec (``params["factor"] = 2``
    raises ``TypeError``), and, unlike a ``types.MappingProxyType``, it survives
    ``pickle``, ``copy.deepcopy`` and ``torch.save`` (of a patched model holding
    specs, too). Equal to any mapping with the same items.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        self._items = dict(items or {})

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._items!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._items,))


@dataclass(frozen=True)
class RopeSpec:
    """The rotary settings of one model (or one layer type), ready for the schedules.

    Attributes:
        rope_type: a key of :data:`posenc.rotary.schedules.SCHEDULES`.
        base: ``rope_theta``.
        params: the schedule's parameters (HF key names, without ``rope_type``
            and ``rope_theta``), including the config attributes the schedule
            reads (``max_position_embeddings`` ...); lists are stored as tuples.
            A read-only :class:`FrozenParams` (any mapping given is copied into
            one), not part of the hash.
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
            :func:`posenc.hf.patch_model` reads it from the module).
        layout: which channels the model rotates together: ``"half"`` (HF's
            ``rotate_half``, pairs (i, i + rotary_dim / 2)) or ``"interleaved"``
            (pairs (2i, 2i + 1), GPT-J's order), as the model's attention applies it.
        mrope_permuted: the model permutes the frequencies before the M-RoPE sections
            take them (ERNIE-4.5-VL), an order posenc does not reproduce.
        mrope_default: the sections the model's rotary module falls back on when the
            config names none (M-RoPE models: Qwen2-VL, GLM-4V ...), else ``None``.
        notes: where the model's code reads a key otherwise than documented, what
            was read (e.g. a ``partial_rotary_factor`` the model ignores).

    Examples:
        >>> import posenc.hf
        >>> spec = posenc.hf.rope_spec({"hidden_size": 64, "num_attention_heads": 4,
        ...                             "max_position_embeddings": 16, "rope_theta": 10000.0,
        ...                             "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
        >>> spec.rope_type, spec.head_dim, dict(spec.params)
        ('dynamic', 16, {'factor': 2.0, 'max_position_embeddings': 16})
        >>> [round(float(spec.frequencies(n).inv_freq[-1]), 6) for n in (16, 32)]  # base grows
        [0.000316, 0.000105]
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
    layout: Literal["half", "interleaved"] = "half"
    mrope_permuted: bool = False
    mrope_default: tuple[int, ...] | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.params, FrozenParams):
            if not isinstance(self.params, Mapping):
                raise TypeError(f"params must be a dict; got {type(self.params).__name__}")
            object.__setattr__(self, "params", FrozenParams(self.params))

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


def setting(config: Any, key: str, default: Any = None) -> Any:
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


def rope_part(config: Any) -> Any:
    """The part of a composite config (``text_config``) that holds the RoPE settings."""
    if any(_has(config, k) for k in ("rope_parameters", "rope_scaling", "rope_theta")):
        return config
    text = setting(config, "text_config")
    return config if text is None else text


#: Where a config can say anything about its RoPE (v5, v4, GPT-NeoX's base).
ROPE_KEYS = (
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "rotary_emb_base",
    *model_types.LOCAL_GLOBAL_KEYS,
)


def has_rope_settings(config: Any) -> bool:
    """Whether ``config`` (or its ``text_config``) names any RoPE setting at all.

    A model type that applies RoPE with no RoPE key (GPT-J, CodeGen) counts as named.
    """
    if fixed_rope(config) is not None:
        return True
    return any(_has(c, k) for c in (config, setting(config, "text_config")) if c is not None
               for k in ROPE_KEYS)  # fmt: skip


def _model_types(config: Any) -> tuple[str | None, str | None]:
    """The ``model_type`` of the part holding the RoPE settings, and of ``config`` around it."""
    part = rope_part(config)
    inner = setting(part, "model_type")
    outer = setting(config, "model_type") if part is not config else None
    return inner, outer


def fixed_rope(config: Any) -> str | None:
    """The model type of ``config`` if it applies RoPE with no RoPE key (GPT-J, CodeGen).

    Such a model rotates interleaved pairs over base-10000 frequencies of its
    :data:`~posenc.rotary.model_types.FIXED_ROPE` key's channels; ``None`` for any other.
    """
    return model_types.lookup(model_types.FIXED_ROPE, *_model_types(config))


def _other_kind(config: Any, inner: str | None) -> None:
    """Refuse a config whose RoPE settings feed a rotary module of another kind."""
    found = model_types.lookup(model_types.OTHER_KIND, inner)
    if found is None:
        return
    hint = ""
    if setting(config, "text_config") is not None:
        hint = "; for its language model's RoPE, read config.text_config"
    raise ValueError(
        f"model_type {inner!r}: transformers' {found} model does not rotate by token "
        f"positions (its RoPE module: {model_types.OTHER_KIND[found]}). Its RoPE settings "
        f"give no frequencies the model uses, so posenc does not read them{hint}"
    )


def raw_parameters(config: Any) -> dict[str, Any]:
    """``rope_parameters`` (v5) or ``rope_scaling`` (v4), copied; ``{}`` if neither.

    A v4 local/global config (:func:`local_global_form`) comes back as transformers
    converts it: one dict per layer type.
    """
    raw = _given_parameters(config)
    local = _local_global(config, raw)
    return raw if local is None else local


def local_global_form(config: Any) -> model_types.LocalGlobal | None:
    """The v4 local/global form :func:`raw_parameters` reads ``config`` through, else ``None``.

    When it is not ``None``, the per-layer-type dicts :func:`raw_parameters` returns are
    made from the config's keys (:class:`~posenc.rotary.model_types.LocalGlobal`: the
    local and global bases, ``rope_scaling`` for the full layers or both), not found in
    it: a reader naming where a value came from names those keys.
    """
    found = _local_global_found(config, _given_parameters(config))
    return None if found is None else model_types.LOCAL_GLOBAL[found]


def _given_parameters(config: Any) -> dict[str, Any]:
    """``rope_parameters`` (v5) or ``rope_scaling`` (v4) as the config gives it, copied."""
    v5 = setting(config, "rope_parameters")
    v4 = setting(config, "rope_scaling")
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


def _local_global(config: Any, raw: dict[str, Any]) -> dict[str, Any] | None:
    """A v4 local/global form as transformers converts it: one RoPE per layer type, else None.

    The sliding layers take the local base, the full ones the global base and
    ``rope_scaling`` (:data:`~posenc.rotary.model_types.LOCAL_GLOBAL`: Gemma 3's
    ``rope_local_base_freq`` and ``rope_theta``; ModernBERT's ``local_rope_theta`` and
    ``global_rope_theta``, whose ``rope_scaling`` applies to both), each defaulting to
    the model's own bases.
    """
    found = _local_global_found(config, raw)
    if found is None:
        return None
    form = model_types.LOCAL_GLOBAL[found]
    full = {"rope_type": "default", **raw}
    if full.get("rope_theta") is None:
        full["rope_theta"] = setting(config, form.global_key, form.global_default)
    sliding = {"rope_type": "default", **(raw if form.scaling_both else {})}
    sliding["rope_theta"] = setting(config, form.local_key, form.local_default)
    return {"sliding_attention": sliding, "full_attention": full}


def _local_global_found(config: Any, raw: Mapping[str, Any]) -> str | None:
    """The :data:`~posenc.rotary.model_types.LOCAL_GLOBAL` key of a v4 local/global config."""
    found = model_types.lookup(model_types.LOCAL_GLOBAL, setting(config, "model_type"))
    if found is None:
        local_key = next(
            (
                k
                for k in ("rope_local_base_freq", "local_rope_theta")
                if setting(config, k) is not None
            ),
            None,
        )
        if local_key is None:
            return None
        found = "gemma3" if local_key == "rope_local_base_freq" else "modernbert"
    if raw and all(v is None or isinstance(v, Mapping) for v in raw.values()):
        return None  # already one dict per layer type (v5)
    return found


def _nested_keys(config: Any, raw: Mapping[str, Any]) -> list[str]:
    """The layer types ``raw`` is nested under (HF ``nested_rope_parameter_keys``)."""
    labels = setting(config, "_rope_type_labels") or setting(config, "layer_types") or ()
    keys = [k for k in raw if k in set(labels)]
    if not keys and raw and all(v is None or isinstance(v, Mapping) for v in raw.values()):
        keys = list(raw)  # a plain dict without layer_types: nested if every value is a dict
    return keys


def rope_layer_types(config: Any) -> tuple[str, ...]:
    """The layer types with their own RoPE settings; ``()`` for a model with one RoPE.

    Layer types whose entry is ``None`` (layers without RoPE) are left out.

    Examples:
        >>> import posenc.hf
        >>> config = {"hidden_size": 64, "num_attention_heads": 4,  # Gemma 3's form
        ...           "layer_types": ["sliding_attention", "full_attention"],
        ...           "rope_parameters": {
        ...               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        ...               "full_attention": {"rope_type": "linear", "factor": 8.0,
        ...                                  "rope_theta": 1000000.0}}}
        >>> posenc.hf.rope_layer_types(config)
        ('sliding_attention', 'full_attention')
        >>> [posenc.hf.rope_spec(config, t).base for t in posenc.hf.rope_layer_types(config)]
        [10000.0, 1000000.0]
    """
    config = rope_part(config)
    raw = raw_parameters(config)
    return tuple(k for k in _nested_keys(config, raw) if raw[k] is not None)


def _config_int(value: Any, name: str) -> int:
    """A size from a config: an int, or a float holding a whole number (MusicFlamingo's 1200.0)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return checks.check_int(value, name, minimum=1)


def _head_dim(config: Any, notes: list[str]) -> int:
    head_dim = setting(config, "head_dim")
    if head_dim is not None:
        return checks.check_channels(head_dim, "head_dim")
    rope_dim = setting(config, "qk_rope_head_dim")
    if rope_dim is not None:
        # DeepSeek's MLA: transformers' config sets head_dim = qk_rope_head_dim, the part of
        # each query and key head that rotates (a config.json does not spell it out)
        notes.append(
            f"head_dim is qk_rope_head_dim = {rope_dim}: with multi-head latent attention "
            "only that part of each query and key head rotates"
        )
        return checks.check_channels(rope_dim, "qk_rope_head_dim")
    hidden_key = next((k for k in ("hidden_size", "n_embd") if _has(config, k)), "hidden_size")
    heads_key = next((k for k in ("num_attention_heads", "n_head") if _has(config, k)), "")
    hidden, heads = setting(config, hidden_key), setting(config, heads_key or "n_head")
    if hidden is None or heads is None:
        raise ValueError(
            "config gives no head dim: it needs head_dim, or hidden_size and num_attention_heads"
        )
    head_dim = _config_int(hidden, hidden_key) // _config_int(heads, heads_key)
    return checks.check_channels(head_dim, f"head_dim ({hidden_key} // {heads_key})")


def hf_fills(rope_type: str) -> frozenset[str]:
    """The required keys transformers fills in itself before it checks them.

    HF's ``standardize_rope_params`` (and ``convert_rope_params_to_dict``) set
    ``rope_type`` (``"default"``, or the old ``type``), ``rope_theta`` (the top-level
    one, else the class's ``default_theta``) and, for :data:`HF_ORIGINAL_MAX_TYPES`,
    ``original_max_position_embeddings`` (a top-level one, else
    ``max_position_embeddings``): a config never lacks them.
    """
    filled = {"rope_type", "rope_theta"}
    if rope_type in HF_ORIGINAL_MAX_TYPES:
        filled.add("original_max_position_embeddings")
    return frozenset(filled)


def missing_required(parameters: Mapping[str, Any], rope_type: str) -> list[str]:
    """The keys transformers requires for ``rope_type`` that ``parameters`` lacks, sorted.

    Only keys transformers neither finds (present counts, ``null`` included) nor fills
    in itself (:func:`hf_fills`); ``[]`` for a rope type transformers does not know.

    Examples:
        >>> from posenc.rotary.config import missing_required
        >>> missing_required({"rope_type": "linear"}, "linear")
        ['factor']
        >>> missing_required({"rope_type": "yarn", "factor": None}, "yarn")  # HF fills the other
        []
    """
    required = HF_REQUIRED.get(rope_type, frozenset())
    return sorted(required - hf_fills(rope_type) - set(parameters))


def parse_rope_type(
    parameters: Mapping[str, Any], where: str, default: str | None = "default"
) -> str:
    """The rope type a ``rope_parameters``-style dict names, old aliases resolved.

    Reads ``rope_type`` and its old name ``type`` (both may be present if equal) and
    maps old type names to current ones (``"su"``, Phi-3's first name for
    ``longrope``).

    Args:
        parameters: the dict.
        where: how the error messages name it (``"rope_parameters"``, ``"scaling"``).
        default: the type when neither key is present; ``None`` makes one required.

    Raises:
        ValueError: two different names, or none when one is required.
        TypeError: a name that is not a str.
    """
    rope_type = parameters.get("rope_type")
    alias = parameters.get("type")
    if rope_type is not None and alias is not None and rope_type != alias:
        raise ValueError(
            f"{where} names two rope types: rope_type={rope_type!r} and its old alias "
            f"type={alias!r}; keep one"
        )
    name = rope_type if rope_type is not None else alias if alias is not None else default
    if name is None:
        raise ValueError(f"{where} needs rope_type (or its old alias type)")
    if not isinstance(name, str):
        raise TypeError(f"{where}['rope_type'] must be a str; got {name!r}")
    return TYPE_ALIASES.get(name, name)


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
            does not sum to ``rotary_dim / 2``; a model type whose RoPE module is
            of another kind (:data:`~posenc.rotary.model_types.OTHER_KIND`: the
            message names it and what its module does).
        TypeError: ``rope_parameters`` or ``rope_scaling`` is not a dict.

    Examples:
        >>> import posenc.hf
        >>> config = {  # Llama 3.1 8B's config.json, its RoPE part
        ...     "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
        ...     "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
        ...     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        ...     "original_max_position_embeddings": 8192}}
        >>> spec = posenc.hf.rope_spec(config)
        >>> spec.rope_type, spec.base, spec.head_dim, spec.rotary_dim, spec.layout
        ('llama3', 500000.0, 128, 128, 'half')
        >>> len(spec.frequencies().omega)
        64
    """
    inner, outer = _model_types(config)
    _other_kind(rope_part(config), inner)
    fixed = fixed_rope(config)
    config = rope_part(config)
    notes: list[str] = []
    raw = raw_parameters(config)
    for local_key, global_key in (
        ("rope_local_base_freq", "rope_theta"),
        ("local_rope_theta", "global_rope_theta"),
    ):
        if setting(config, local_key) is not None:
            notes.append(
                f"{local_key} is the sliding layers' base, {global_key} the full layers' "
                "(one RoPE per layer type, as transformers reads this config)"
            )
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
        if local_global_form(config) is not None:  # made from v4 keys: name those
            where = f"rope_scaling (read for the {layer_type} layers)"
        else:
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
    if interleaved is not None:
        checks.check_bool(interleaved, f"{where}['mrope_interleaved']")
    if interleaved is not None and section is None:
        raise ValueError(f"{where} has mrope_interleaved but no mrope_section")
    if section is not None and not isinstance(section, (list, tuple)):
        raise TypeError(f"{where}['mrope_section'] must be a list of ints; got {section!r}")

    found = model_types.lookup(model_types.MROPE_DEFAULT_SECTIONS, inner, outer)
    mrope_default = None if found is None else model_types.MROPE_DEFAULT_SECTIONS[found]
    permuted = model_types.lookup(model_types.PERMUTED_MROPE, inner, outer) is not None
    if permuted:
        notes.append(
            "the model's rotary module permutes the frequencies before the M-RoPE sections "
            "take them (height and width take the even, then the odd ones)"
        )

    rope_type = parse_rope_type(parameters, where)
    if setting(config, "model_type") == "phi3" and rope_type == "yarn":
        rope_type = "longrope"  # transformers' Phi3Config renames its legacy "yarn" to longrope
    missing = missing_required(parameters, rope_type)
    if missing:
        # transformers' _check_received_keys raises KeyError on these: refused as it refuses
        keys = "{" + ", ".join(repr(k) for k in missing) + "}"
        raise ValueError(
            f"{where} lacks what transformers requires: Missing required keys in "
            f"`rope_parameters` for 'rope_type'='{rope_type}': {keys}"
        )

    base_keys = ("rope_theta", "rotary_emb_base")  # GPT-NeoX's name
    type_theta = model_types.DEFAULT_THETA_BY_TYPE.get(inner or "")
    base_key, base = _first(
        config,
        parameters,
        where,
        "rope_theta",
        base_keys,
        DEFAULT_THETA if type_theta is None else type_theta,
    )
    if type_theta is not None and parameters.get("rope_theta") is None:
        if all(setting(config, k) is None for k in base_keys):
            notes.append(
                f"rope_theta = {type_theta:g}: the config omits it, and transformers' {inner} "
                f"config defaults rope_theta to {type_theta:g} (default_theta)"
            )
    base = checks.check_number(base, base_key, positive=True)
    fixed_key = None if fixed is None else model_types.FIXED_ROPE[fixed]
    if fixed_key is not None and not any(_has(config, k) for k in ROPE_KEYS):
        notes.append(
            f"transformers' {inner} model applies RoPE with base {DEFAULT_THETA:g} over "
            f"{fixed_key} channels in interleaved pairs; its config has no RoPE key"
        )
    partial_key, partial = _first(
        config,
        parameters,
        where,
        "partial_rotary_factor",
        ("partial_rotary_factor", "rotary_pct"),  # GPT-NeoX's name
        1.0,
    )
    partial = checks.check_number(partial, partial_key)
    if not 0 < partial <= 1:
        raise ValueError(f"{partial_key} must lie in (0, 1]; got {partial!r}")

    head_dim = _head_dim(config, notes)
    max_pos = setting(config, "max_position_embeddings")
    if max_pos is not None:
        max_pos = _config_int(max_pos, "max_position_embeddings")
    params = {
        k: v for k, v in parameters.items() if k not in _GENERAL_KEYS and k not in NOT_FREQUENCIES
    }
    known = PARAMETERS.get(rope_type)
    takes = set(known[0] | known[1]) if known is not None else set()
    if "max_position_embeddings" not in takes:
        # a copy of the config attribute that this type's HF init function never reads
        params.pop("max_position_embeddings", None)
    if rope_type == "default" and params:
        # HF's default RoPE reads none of them, and its validation only logs "Unrecognized
        # keys"; a dict without rope_type is "default" (standardize_rope_params sets it)
        typed = any(parameters.get(k) is not None for k in ("rope_type", "type"))
        what = "rope type 'default'" if typed else "no rope_type: transformers reads 'default',"
        notes.append(
            f"{where} names {what} whose RoPE ignores {', '.join(sorted(params))} "
            "(transformers only logs 'Unrecognized keys')"
        )
        params = {}

    original = None
    if rope_type in _ORIGINAL_MAX_TYPES:
        top = None if nested else setting(config, "original_max_position_embeddings")
        original = top if top is not None else params.get("original_max_position_embeddings")
        if original is None:
            original = max_pos
        if original is not None:
            params["original_max_position_embeddings"] = original
    if rope_type in _YARN_TYPES and "factor" in params and params["factor"] is None:
        # a null factor (DeepSeek-V3's form): HF's _compute_yarn_parameters derives it; a
        # factor left out is refused above, as HF refuses it
        if max_pos and original:
            params["factor"] = max_pos / original
    if "max_position_embeddings" in takes and max_pos is not None:
        params.setdefault("max_position_embeddings", max_pos)
    ignores = model_types.lookup(model_types.DEFAULT_IGNORES_PARTIAL, inner, outer)
    if rope_type == "proportional":
        params["partial_rotary_factor"] = partial
        rotary_dim = head_dim
    elif fixed is not None and fixed_key is not None:
        rotary_dim = setting(config, fixed_key)
        if rotary_dim is None:
            rotary_dim = model_types.FIXED_ROPE_DIM[fixed]
            notes.append(
                f"{fixed_key} = {rotary_dim}: the config omits it, and transformers' {fixed} "
                "config class defaults to it"
            )
        rotary_dim = checks.check_channels(rotary_dim, fixed_key)
    elif rope_type == "default" and ignores is not None and partial != 1.0:
        notes.append(
            f"{partial_key} = {partial:g} is ignored: transformers' {ignores} computes its "
            "default RoPE over the whole head (compute_default_rope_parameters)"
        )
        partial = 1.0
        rotary_dim = head_dim
    else:
        rotary_dim = int(head_dim * partial)
    interleaved_model = model_types.lookup(model_types.INTERLEAVED, inner, outer)
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
    if section is None and mrope_default is not None:
        if sum(mrope_default) == rotary_dim // 2:
            section = mrope_default
            notes.append(
                f"mrope_section {list(section)}: transformers' {found} rotary module's own, "
                "as the config names none"
            )
        else:
            notes.append(
                f"M-RoPE: transformers' {found} rotary module falls back on mrope_section "
                f"{list(mrope_default)}, which does not split this head's {rotary_dim // 2} "
                "frequencies"
            )
    if section is not None:
        section = tuple(section)
        _check_mrope(section, rotary_dim, interleaved)

    spec = RopeSpec(
        rope_type=rope_type,
        base=base,
        params=FrozenParams(params),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        partial_rotary_factor=partial,
        max_position_embeddings=max_pos,
        original_max_position_embeddings=original,
        layer_type=layer_type,
        mrope_section=section,
        mrope_interleaved=interleaved,
        layout="interleaved" if interleaved_model else "half",
        mrope_permuted=permuted,
        mrope_default=mrope_default,
        notes=tuple(notes),
    )
    spec.frequencies()  # the schedule reports unknown types, missing and unknown keys
    return spec


def _first(
    config: Any,
    parameters: Mapping[str, Any],
    where: str,
    key: str,
    top_level: tuple[str, ...],
    default: float,
) -> tuple[str, Any]:
    """``(name, value)`` of a setting: ``parameters[key]``, else the first top-level key set.

    The name is how an error names the value: ``rope_parameters['rope_theta']``,
    ``rope_theta``, ``rotary_emb_base`` ...; the default is named by ``key``.
    """
    value = parameters.get(key)
    if value is not None:
        return f"{where}[{key!r}]", value
    for name in top_level:
        value = setting(config, name)
        if value is not None:
            return name, value
    return key, default


def _check_mrope(section: tuple[int, ...], rotary_dim: int, interleaved: bool | None) -> None:
    """Raise unless ``section`` splits the ``rotary_dim / 2`` frequencies (either order if None)."""
    from posenc.families.rotary.multiaxis.sections import mrope_axes

    modes = (False,) if interleaved is None else (interleaved,)
    for mode in modes:
        mrope_axes(section, rotary_dim // 2, MROPE_AXES, mode)
