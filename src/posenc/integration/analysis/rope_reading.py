"""How a model's RoPE configuration is read: per layer type, every setting with its source.

:func:`read` turns a loaded config (a ``config.json`` dict or a transformers
config object, as :class:`Loaded`) into one :class:`Reading` per layer type: the
:class:`~posenc.families.rotary.config.RopeSpec` that
:func:`posenc.families.rotary.config.rope_spec` reads, and rows of setting,
value and the config key it came from (rope type, base, head and rotary dims,
layout, the schedule's parameters given, derived or left at their defaults, the
attention scaling), the wavelengths against the trained window, and the M-RoPE
sections. :func:`nope_layers` lists the layers without RoPE and
:func:`layer_settings` what else the layers do with positions (Llama 4's
temperature tuning, chunked attention and QK norm; Cohere 2's sliding windows);
:func:`describe`
gathers it all in the JSON-able document ``posenc rope --json`` prints, with
notes, among them, for a ``config.json`` whose ``model_type`` transformers
knows, any difference from the reading of transformers' own config class.

Nothing here prints, and importing it needs only numpy (transformers is imported
by the cross-check that uses it).
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posenc.families.rotary import model_types
from posenc.families.rotary.config import (
    MULTI_AXIS_KEYS,
    NOT_FREQUENCIES,
    RopeSpec,
    local_global_form,
    raw_parameters,
    rope_layer_types,
    rope_part,
    rope_spec,
    setting,
)
from posenc.families.rotary.schedules import PARAMETERS, RopeFrequencies

__all__ = [
    "Loaded",
    "Reading",
    "describe",
    "read",
]

#: The M-RoPE order of transformers' modules when the config does not say: Qwen3-VL's
#: interleaved sections, Qwen2-VL's contiguous ones (the sections themselves, when the
#: config names none, are the module's own: ``rope_spec`` reads them).
_MROPE_MODULE_ORDER: dict[str, bool] = {
    "qwen2_vl": False,
    "qwen2_5_vl": False,
    "qwen2_5_omni": False,
    "qwen3_vl": True,
    "qwen3_vl_moe": True,
    "qwen3_omni_moe": True,
}
#: Defaults of the schedules' optional parameters (HF ``_compute_*_parameters``), for display.
_OPTIONAL_DEFAULTS: dict[str, dict[str, Any]] = {
    "yarn": {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True},
    "proportional": {"factor": 1.0},
}
#: What an optional schedule parameter with no default value (``None``) means when unset.
_UNSET_DEFAULTS: dict[str, str] = {
    "attention_factor": "default: none (see attention scaling)",
}
#: Keys of a ``rope_parameters`` dict that are not schedule parameters.
_NOT_SCHEDULE = (
    "rope_type", "type", "rope_theta", "partial_rotary_factor", *MULTI_AXIS_KEYS, *NOT_FREQUENCIES,
)  # fmt: skip
#: Keys that list layers without RoPE (layer indices), besides SmolLM3's and Llama 4's mask.
_NOPE_INDEX_KEYS = ("nope_layers", "nope_layer_indices", "no_pe_layers")
#: Config classes that make ``no_rope_layers`` from ``no_rope_layer_interval`` (default 4),
#: by model type: the class, and whether an empty list is replaced too (Llama 4's
#: ``no_rope_layers if no_rope_layers else default``; SmolLM3 replaces only None).
_NOPE_INTERVAL_CLASSES: dict[str, tuple[str, bool]] = {
    "llama4_text": ("Llama4TextConfig", True),
    "smollm3": ("SmolLM3Config", False),
}
#: Llama4TextConfig's defaults of what its layers read besides RoPE (transformers 5.24).
LLAMA4_DEFAULTS: dict[str, Any] = {
    "attn_temperature_tuning": True,
    "floor_scale": 8192,
    "attn_scale": 0.1,
    "attention_chunk_size": 8192,
    "use_qk_norm": True,
}


# --------------------------------------------------------------------------------------
# The loaded config.


@dataclass
class Loaded:
    """A config as the command read it.

    Attributes:
        config: a ``config.json`` dict or a transformers config object.
        label: how the output names it (the file, or ``LlamaConfig()``).
        kind: ``"file"`` or ``"class"``.
        sets: the ``--set`` values applied, as ``(dotted key, value)``.
        notes: what the command did on the way (``'mrope'`` read as ``default`` ...).
        renamed: ``rope_parameters`` paths whose rope type was rewritten, with the
            original name.
        original: for a file, the dict before those rewrites (what transformers reads).

    Examples:
        A ``config.json`` read from disk, as ``posenc rope config.json`` reads it:

        >>> import json, pathlib, tempfile
        >>> from posenc.analysis.rope_reading import Loaded, read
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "config.json"
        >>> _ = path.write_text(json.dumps({"model_type": "llama", "rope_theta": 10000.0,
        ...                                 "hidden_size": 64, "num_attention_heads": 4}))
        >>> loaded = Loaded(json.loads(path.read_text()), str(path.name), "file")
        >>> [(r.spec.rope_type, r.spec.base, r.spec.rotary_dim) for r in read(loaded)]
        [('default', 10000.0, 16)]
    """

    config: Any
    label: str
    kind: str
    sets: list[tuple[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)
    original: dict[str, Any] | None = None


def rewrite_mrope_type(loaded: Loaded) -> None:
    """Note where ``type: "mrope"`` is read as ``default``, as transformers' Qwen2-VL configs do.

    Qwen2-VL's and Qwen2.5-VL's ``config.json`` say ``rope_scaling = {"type":
    "mrope", "mrope_section": [...]}``; transformers' config classes rewrite the
    type to ``default`` (the sections are read by the rotary module).
    """
    config, prefix = _rope_part(loaded.config)
    if not isinstance(config, dict):
        return
    group = _group(config)
    if group is None:
        return
    raw = config[group]
    dicts = [(f"{prefix}{group}", raw)]
    dicts += [(f"{prefix}{group}.{k}", v) for k, v in raw.items() if isinstance(v, dict)]
    for where, d in dicts:
        for key in ("rope_type", "type"):
            if d.get(key) == "mrope":  # posenc.rotary.config reads it as "default"
                loaded.renamed[where] = f"{where}.{key} 'mrope'"
                loaded.notes.append(
                    f"{where}.{key} 'mrope' is read as 'default', as transformers' "
                    "Qwen2-VL config does (the sections are M-RoPE's; the frequencies the default)"
                )


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """transformers' logging and warnings silenced: the command's output is its own."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)


def softmax_scale(config: Mapping[str, Any]) -> tuple[float | None, str]:
    """The factor transformers' attention multiplies ``q . k`` by, and where it was read.

    transformers' own model is built from the config on the meta device (no weights, no
    memory) and the first text attention's ``scaling`` read: ``head_dim ** -0.5``, or
    Gemma's ``query_pre_attn_scalar ** -0.5``, or DeepSeek's ``qk_head_dim ** -0.5``
    times ``get_mscale(factor, mscale_all_dim) ** 2`` (``yarn_apply_mscale``). ``None``
    (and why) when transformers cannot build the model.
    """
    import torch
    import transformers

    try:
        with quiet():
            hf_config = transformers.AutoConfig.for_model(**copy.deepcopy(dict(config)))
            with torch.device("meta"):
                try:
                    model = transformers.AutoModelForCausalLM.from_config(hf_config)
                except ValueError:  # a composite config (Qwen2-VL): its base model
                    model = transformers.AutoModel.from_config(hf_config)
    except Exception as exc:  # transformers' own refusal: said, not raised
        return None, f"transformers cannot build the model: {one_line(exc)}"
    for name, module in model.named_modules():
        scaling = getattr(module, "scaling", None)
        if (
            type(module).__name__.endswith("Attention")
            and isinstance(scaling, float)
            and not any(part in name for part in ("visual", "vision"))
        ):
            return scaling, f"transformers' {type(module).__name__}.scaling ({name})"
    return None, "transformers' model has no attention with a scaling"


def one_line(exc: BaseException) -> str:
    """An exception's message on one line, cut at 300 characters (for a note or an error)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def nested_dict(params: Mapping[str, Any]) -> bool:
    """Whether ``params`` holds one dict (or ``None``) per layer type, as Gemma 3's do."""
    return bool(params) and all(v is None or isinstance(v, Mapping) for v in params.values())


# --------------------------------------------------------------------------------------
# Reading: the spec of each layer type, with where every value came from.


def _rope_part(config: Any) -> tuple[Any, str]:
    """The part of a composite config that posenc reads RoPE from, and its key prefix."""
    part = rope_part(config)
    return part, "" if part is config else "text_config."


def _group(config: Any) -> str | None:
    """``"rope_parameters"`` (v5) or ``"rope_scaling"`` (v4): the dict posenc reads."""
    if setting(config, "rope_parameters"):
        return "rope_parameters"
    if setting(config, "rope_scaling"):
        return "rope_scaling"
    return None


@dataclass
class Row:
    """One setting: its name, value (JSON-able) and where it came from."""

    name: str
    value: Any
    source: str
    shown: str = ""

    def display(self) -> str:
        """The value as ``posenc rope`` prints it (its own wording, if it has one)."""
        return self.shown or show(self.value)


@dataclass
class Reading:
    """One RoPE of a model: the spec posenc reads and the rows that explain it.

    Examples:
        A Gemma 3 config: one RoPE for the sliding-window layers, another for the
        full-attention ones (the config's ``sliding_window_pattern`` defaults to 6).

        >>> from posenc.analysis.rope_reading import Loaded, read
        >>> config = {"model_type": "gemma3_text", "num_hidden_layers": 6, "head_dim": 16,
        ...           "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        ...           "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
        >>> for r in read(Loaded(config, "config.json", "file")):
        ...     print(r.layer_type, r.layers, r.spec.rope_type, r.spec.base, r.layout)
        sliding_attention [0, 1, 2, 3, 4] default 10000.0 half
        full_attention [5] linear 1000000.0 half
    """

    layer_type: str | None
    spec: RopeSpec
    freqs: RopeFrequencies
    layers: list[int] | None
    rows: list[Row]
    scaling: Row
    wavelengths: dict[str, Any]
    mrope: dict[str, Any] | None
    layout: str
    softmax: Row | None = None


def show(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "-"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e16:
            return str(int(value))
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        if len(value) > 6:
            head = ", ".join(show(v) for v in value[:3])
            return f"[{head}, ... {show(value[-1])}] ({len(value)} values)"
        return "[" + ", ".join(show(v) for v in value) + "]"
    return str(value)


def ranges(indices: Sequence[int], limit: int = 8) -> str:
    """``0-4, 6-10, 12`` for a sorted list of ints."""
    spans: list[tuple[int, int]] = []
    for i in indices:
        if spans and i == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], i)
        else:
            spans.append((i, i))
    text = [f"{a}-{b}" if b > a else f"{a}" for a, b in spans[:limit]]
    return ", ".join(text) + (", ..." if len(spans) > limit else "")


def read(loaded: Loaded) -> list[Reading]:
    """The RoPE of every layer type of ``loaded``, each with its provenance.

    Raises:
        ValueError: what :func:`rope_spec` refuses (unknown rope type, missing keys ...).

    Examples:
        A Llama 3 ``config.json`` (one RoPE for every layer):

        >>> from posenc.analysis.rope_reading import Loaded, read
        >>> config = {"model_type": "llama", "rope_theta": 500000.0, "hidden_size": 64,
        ...           "num_attention_heads": 2, "max_position_embeddings": 8192,
        ...           "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
        ...                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        ...                            "original_max_position_embeddings": 8192}}
        >>> (reading,) = read(Loaded(config, "config.json", "file"))
        >>> reading.spec.rope_type, reading.spec.base, reading.spec.rotary_dim
        ('llama3', 500000.0, 32)
        >>> for row in reading.rows[:3]:
        ...     print(f"{row.name}: {row.display()}  <- {row.source}")
        rope type: llama3  <- rope_scaling.rope_type
        base (rope_theta): 500000  <- rope_theta
        head_dim: 32  <- hidden_size // num_attention_heads = 64 // 2
    """
    config = loaded.config
    part, prefix = _rope_part(config)
    try:
        types = rope_layer_types(config)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"{loaded.label}: {exc}") from None
    nope = nope_layers(config)
    count = _num_layers(part)
    attention = _attention_types(part, prefix, count)
    readings = []
    for lt in types or (None,):
        try:
            spec = rope_spec(config, lt)
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"{loaded.label}: {exc}") from None
        if lt is not None and attention is not None:
            layers: list[int] | None = [i for i, t in enumerate(attention[0]) if t == lt]
        elif count is not None:
            skip = set(nope["layers"]) if nope else set()
            layers = [i for i in range(count) if i not in skip]
        else:
            layers = None
        readings.append(_reading(loaded, part, prefix, spec, layers))
    return readings


def _num_layers(part: Any) -> int | None:
    count = setting(part, "num_hidden_layers")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None


def _layout(part: Any, spec: RopeSpec) -> tuple[str, str]:
    model_type = str(setting(part, "model_type") or "")
    if spec.layout == "interleaved":
        return "interleaved", (
            f"transformers' {model_type} model: pairs (2i, 2i + 1) (GPT-J order)"
        )
    given = setting(part, "rope_interleave")
    if given or (given is None and model_type in model_types.ROPE_INTERLEAVE_DEFAULT):
        where = "rope_interleave" if given else f"rope_interleave ({model_type}'s default true)"
        return "half", (
            f"{where}: the model de-interleaves q and k, then applies HF's half tables "
            "(pairs (i, i + rotary_dim / 2)): the checkpoint's channels (2i, 2i + 1) turn together"
        )
    return "half", "HF's rotate_half: pairs (i, i + rotary_dim / 2)"


def checkpoint_layout(reading: Reading) -> str:
    """How the checkpoint's own channels pair up: ``"interleaved"`` for a model that
    de-interleaves q and k (``rope_interleave``) before its half rotation, else the
    reading's layout. Another engine that rotates (2i, 2i + 1) of the same weights agrees."""
    row = next((r for r in reading.rows if r.name == "layout"), None)
    if row is not None and "rope_interleave" in row.source:
        return "interleaved"
    return reading.layout


def _reading(
    loaded: Loaded, part: Any, prefix: str, spec: RopeSpec, layers: list[int] | None
) -> Reading:
    group = _group(part)
    raw = raw_parameters(part)
    lt = spec.layer_type
    where = f"{prefix}{group}" + (f".{lt}" if lt else "")
    d: Mapping[str, Any] = (raw[lt] if lt else raw) or {}
    rows: list[Row] = []
    theta_names: tuple[str, ...] = ("rope_theta", "rotary_emb_base")
    theta_default = f"default (HF's default_theta {spec.base:g})"
    untyped = "default (no rope_type given)"
    form = local_global_form(part)
    if form is not None and lt is not None:
        # the per-type dicts are made from v4 keys (Gemma 3's rope_local_base_freq beside
        # rope_theta and rope_scaling, ModernBERT's ...): the rows name those keys
        sliding = lt == "sliding_attention"
        scaled = not sliding or form.scaling_both
        given = setting(part, group) if group is not None and scaled else None
        d = {k: v for k, v in dict(given or {}).items() if not (sliding and k == "rope_theta")}
        where = f"{prefix}{group}"
        if sliding:
            key, value = form.local_key, form.local_default
        else:
            key, value = form.global_key, form.global_default
        theta_names = (key,)
        theta_default = f"default (the config class's {key}: {show(value)})"
        if not scaled:
            untyped = f"default ({prefix}rope_scaling applies to the full_attention layers only)"

    # rope type
    if where in loaded.renamed:
        type_source = f"{loaded.renamed[where]}, read as 'default'"
    elif d.get("rope_type") is not None or d.get("type") is not None:
        key = "rope_type" if d.get("rope_type") is not None else "type"
        type_source = f"{where}.{key}"
        given = d[key]
        if given != spec.rope_type:
            type_source += f" {given!r}, read as {spec.rope_type!r}"
            if given == "yarn":
                type_source += " (transformers' Phi3Config reads its 'yarn' as longrope)"
    else:
        type_source = untyped
    rows.append(Row("rope type", spec.rope_type, type_source))

    # base and partial factor: inside the dict, else a top-level attribute, else default
    def first(key: str, names: tuple[str, ...], default: str) -> tuple[str, Any]:
        """Where the config gives ``key`` and its value there (``None`` if it does not)."""
        if d.get(key) is not None:
            return f"{where}.{key}", d[key]
        for name in names:
            if setting(part, name) is not None:
                neox = name in ("rotary_emb_base", "rotary_pct")
                source = f"{prefix}{name}" + (" (GPT-NeoX's name)" if neox else "")
                return source, setting(part, name)
        return default, None

    base_source, _ = first("rope_theta", theta_names, theta_default)
    rows.append(Row("base (rope_theta)", spec.base, base_source))
    if setting(part, "head_dim") is not None:
        head_source = f"{prefix}head_dim"
    elif setting(part, "qk_rope_head_dim") is not None:
        head_source = f"{prefix}qk_rope_head_dim (multi-head latent attention: the rotating part)"
    else:
        hidden_key = "hidden_size" if setting(part, "hidden_size") is not None else "n_embd"
        heads_key = "num_attention_heads" if setting(part, "num_attention_heads") else "n_head"
        hidden, heads = setting(part, hidden_key), setting(part, heads_key)
        head_source = f"{prefix}{hidden_key} // {prefix}{heads_key} = {hidden} // {heads}"
    rows.append(Row("head_dim", spec.head_dim, head_source))
    partial_source, given = first(
        "partial_rotary_factor", ("partial_rotary_factor", "rotary_pct"), "default"
    )
    fixed = model_types.lookup(model_types.FIXED_ROPE, setting(part, "model_type"))
    if given is not None and float(given) != spec.partial_rotary_factor:
        partial_row = Row(
            "partial_rotary_factor", given, f"{partial_source}: ignored by the model (note)"
        )
        rows.append(partial_row)
        dim_source = "head_dim (the model's default RoPE covers the whole head)"
    else:
        rows.append(Row("partial_rotary_factor", spec.partial_rotary_factor, partial_source))
        dim_source = "int(head_dim * partial_rotary_factor)"
    if spec.rope_type == "proportional":
        dim_source = "head_dim (proportional covers the whole head; unrotated pairs get 0)"
    elif fixed is not None and setting(part, model_types.FIXED_ROPE[fixed]) is not None:
        dim_source = f"{prefix}{model_types.FIXED_ROPE[fixed]} (transformers' {fixed} model)"
    rows.append(Row("rotary dim", spec.rotary_dim, dim_source))
    for note in spec.notes:
        if note not in loaded.notes:
            loaded.notes.append(note)
    layout, layout_source = _layout(part, spec)
    rows.append(Row("layout", layout, layout_source))

    # the schedule's parameters, then its optional ones left at their defaults
    required, optional = PARAMETERS.get(spec.rope_type, (frozenset(), frozenset()))
    order = sorted(required) + sorted(optional)
    shown = [k for k in order if k in spec.params] + [k for k in spec.params if k not in order]
    for key in shown:
        rows.append(
            Row(
                key,
                _plain(spec.params[key]),
                _param_source(spec, key, d, where, part, prefix, partial_source),
            )
        )
    if spec.rope_type == "default":  # keys transformers' default RoPE reads none of (note)
        for key in sorted(k for k in d if k not in _NOT_SCHEDULE and k not in spec.params):
            rows.append(Row(key, _plain(d[key]), f"{where}.{key}: ignored by 'default' RoPE"))
    freqs = spec.frequencies()
    for key in sorted(optional - set(spec.params)):
        default = _OPTIONAL_DEFAULTS.get(spec.rope_type, {}).get(key)
        if spec.rope_type == "longrope" and key == "factor":
            # HF's longrope: factor = max_position_embeddings / original_max_position_embeddings
            mp = spec.params.get("max_position_embeddings")
            original = spec.params.get("original_max_position_embeddings")
            derived = mp / original if mp and original else None
            rows.append(Row(key, derived, f"default: {prefix}max_position_embeddings / "
                            "original_max_position_embeddings"))  # fmt: skip
        elif default is None:
            rows.append(Row(key, None, _UNSET_DEFAULTS.get(key, "default: none"), "-"))
        else:
            rows.append(Row(key, default, f"default ({spec.rope_type})"))
    scaling = Row("attention scaling", freqs.attention_scaling, _scaling_source(spec))
    rows.append(scaling)
    softmax = _softmax_row(spec)
    if softmax is not None:
        rows.append(softmax)

    wavelengths = _wavelengths(spec, freqs)
    mrope = _mrope(loaded, part, prefix, spec, where, d)
    return Reading(lt, spec, freqs, layers, rows, scaling, wavelengths, mrope, layout, softmax)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's ``get_mscale``: ``0.1 * mscale * ln(scale) + 1``, 1 for ``scale <= 1``.

    transformers' ``yarn_get_mscale`` (DeepSeek-V2/V3's attention), operation for operation.
    """
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _softmax_row(spec: RopeSpec) -> Row | None:
    """The softmax-scale factor a config sets through ``mscale_all_dim``, else ``None``.

    transformers' ``yarn_apply_mscale`` (DeepSeek-V2/V3 and the attention classes copied
    from theirs): when the rope type is not ``default`` and ``mscale_all_dim`` is set and
    non-zero, the attention's ``scaling`` (``qk_head_dim ** -0.5``) is multiplied by
    ``m * m``, ``m = yarn_get_mscale(factor, mscale_all_dim)``.
    """
    all_dim = spec.params.get("mscale_all_dim")
    factor = spec.params.get("factor")
    if spec.rope_type == "default" or not all_dim or factor is None:
        return None
    m = yarn_mscale(float(factor), float(all_dim))
    formula = (
        f"(0.1 * {show(float(all_dim))} * ln({show(float(factor))}) + 1) ** 2"
        if factor > 1
        else "1 (factor <= 1)"
    )
    return Row(
        "softmax scale factor",
        m * m,
        f"get_mscale(factor, mscale_all_dim) ** 2 = {formula}: multiplies the attention's "
        "softmax scale (transformers' yarn_apply_mscale, DeepSeek-V2/V3)",
    )


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _param_source(
    spec: RopeSpec,
    key: str,
    d: Mapping[str, Any],
    where: str,
    part: Any,
    prefix: str,
    partial_source: str,
) -> str:
    given = d.get(key) is not None
    if key == "original_max_position_embeddings":
        top = setting(part, key) if spec.layer_type is None else None
        if top is not None:
            if given and d[key] != top:
                return f"{prefix}{key} (config attribute; wins over {where}.{key} = {d[key]})"
            return f"{prefix}{key} (config attribute)"
        if given:
            return f"{where}.{key}"
        return f"= {prefix}max_position_embeddings (HF's default for {spec.rope_type})"
    if given:
        return f"{where}.{key}"
    if key == "max_position_embeddings":
        return f"{prefix}max_position_embeddings (config attribute)"
    if key == "factor" and key in d:  # null: HF's yarn derives it (DeepSeek-V3's form)
        return (f"= {prefix}max_position_embeddings / original_max_position_embeddings "
                f"({where}.factor is null)")  # fmt: skip
    if key == "partial_rotary_factor" and spec.rope_type == "proportional":
        return partial_source
    return "derived by posenc's reader"


def _scaling_source(spec: RopeSpec) -> str:
    params = spec.params
    if spec.rope_type == "yarn":
        if params.get("attention_factor") is not None:
            return "attention_factor (given: it wins)"
        if params.get("mscale") and params.get("mscale_all_dim"):
            return "get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) (DeepSeek)"
        return f"0.1 ln(factor) + 1 = 0.1 ln({show(float(params['factor']))}) + 1 (YaRN)"
    if spec.rope_type == "longrope":
        if params.get("attention_factor") is not None:
            return "attention_factor (given)"
        return "sqrt(1 + ln(factor) / ln(original_max_position_embeddings)), 1 if factor <= 1"
    return f"none for {spec.rope_type}"


def _wavelengths(spec: RopeSpec, freqs: RopeFrequencies) -> dict[str, Any]:
    omega = freqs.inv_freq
    rotating = np.flatnonzero(omega > 0)
    wave = 2 * math.pi / omega[rotating]
    if spec.original_max_position_embeddings is not None:
        window, window_source = (
            spec.original_max_position_embeddings,
            ("original_max_position_embeddings"),
        )
    elif spec.max_position_embeddings is not None:
        window, window_source = spec.max_position_embeddings, "max_position_embeddings"
    else:
        window, window_source = None, "the config gives no trained length"
    out: dict[str, Any] = {
        "pairs": int(omega.size),
        "rotating_pairs": int(rotating.size),
        "shortest": float(wave.min()) if wave.size else None,
        "shortest_pair": int(rotating[int(np.argmin(wave))]) if wave.size else None,
        "longest": float(wave.max()) if wave.size else None,
        "longest_pair": int(rotating[int(np.argmax(wave))]) if wave.size else None,
        "window": window,
        "window_from": window_source,
        "full_turn_pairs": int(np.sum(wave <= window)) if window is not None else None,
    }
    extended = spec.max_position_embeddings
    if window is not None and extended is not None and extended > window:
        out["max_position_embeddings"] = extended
        out["full_turn_pairs_max"] = int(np.sum(wave <= extended))
    if spec.rope_type in ("dynamic", "longrope"):
        out["note"] = (
            "at seq_len <= the window; dynamic grows the base and longrope switches to "
            "long_factor beyond it"
        )
    return out


def _mrope(
    loaded: Loaded, part: Any, prefix: str, spec: RopeSpec, where: str, d: Mapping[str, Any]
) -> dict[str, Any] | None:
    section, interleaved = spec.mrope_section, spec.mrope_interleaved
    model_type = str(setting(part, "model_type") or "").removesuffix("_text")
    module_order = _MROPE_MODULE_ORDER.get(model_type)
    if section is None:
        return None
    if d.get("mrope_section") is not None:
        source = f"{where}.mrope_section"
    else:
        source = f"transformers' {model_type} module default (none in the config)"
    if interleaved is not None:
        order_source = f"{where}.mrope_interleaved"
    elif module_order is not None:
        interleaved = module_order
        order_source = f"transformers' {model_type} module"
    else:
        order_source = "not given: transformers decides by model class (contiguous shown)"
        interleaved = False
    pairs = spec.rotary_dim // 2
    total = sum(section)
    return {
        "section": list(section),
        "from": source,
        "interleaved": interleaved,
        "order_from": order_source,
        "sums_to_pairs": total == pairs,
        "pairs": pairs,
    }


def nope_layers(config: Any) -> dict[str, Any] | None:
    """The layers without RoPE and the key that says so, or ``None`` if every layer has RoPE.

    Read from ``no_rope_layers`` (SmolLM3's and Llama 4's mask: 1 = RoPE, 0 = NoPE;
    or a list of layer indices), ``no_rope_layer_interval`` (every n-th layer,
    as those configs default it), ``nope_layers``-style index lists, and layer
    types whose ``rope_parameters`` entry is ``None``.
    """
    part, prefix = _rope_part(config)
    count = _num_layers(part)
    mask = setting(part, "no_rope_layers")
    model_type = str(setting(part, "model_type") or "")
    cls = _NOPE_INTERVAL_CLASSES.get(model_type)
    interval = setting(part, "no_rope_layer_interval")
    interval_text = f"{prefix}no_rope_layer_interval = {interval}"
    if cls is not None and (mask is None or (cls[1] and not mask)):
        if interval is None:
            interval, interval_text = 4, f"no_rope_layer_interval 4 ({cls[0]}'s default)"
        mask = None  # the class makes the list from the interval
    if isinstance(mask, (list, tuple)) and mask:
        if all(v in (0, 1) for v in mask) and (count is None or len(mask) >= count):
            n = count or len(mask)
            return {
                "layers": [i for i, v in enumerate(mask[:n]) if not v],
                "from": f"{prefix}no_rope_layers (1 = RoPE, 0 = NoPE, as SmolLM3 and Llama 4 "
                "read it)",
                "of": n,
            }
        return {"layers": sorted(int(i) for i in mask), "from": f"{prefix}no_rope_layers",
                "of": count}  # fmt: skip
    if mask is None and isinstance(interval, int) and interval > 0 and count:
        return {
            "layers": [i for i in range(count) if (i + 1) % interval == 0],
            "from": f"{interval_text} (every {interval}th layer, "
            "as SmolLM3 and Llama 4 default no_rope_layers)",
            "of": count,
        }
    for key in _NOPE_INDEX_KEYS:
        value = setting(part, key)
        if isinstance(value, (list, tuple)) and value:
            return {"layers": sorted(int(i) for i in value), "from": f"{prefix}{key}",
                    "of": count}  # fmt: skip
    sliding = _sliding_only_nope(part, prefix, count)
    if sliding is not None:
        return sliding
    raw = raw_parameters(part)
    layer_types = setting(part, "layer_types")
    none_types = [k for k, v in raw.items() if v is None] if nested_dict(raw) else []
    if none_types and isinstance(layer_types, (list, tuple)):
        return {
            "layers": [i for i, t in enumerate(layer_types) if t in none_types],
            "from": f"{prefix}rope_parameters of layer types {', '.join(none_types)} is None",
            "of": len(layer_types),
        }
    for key in ("use_rope", "use_rotary_embedding"):
        if setting(part, key) is False and count:
            return {"layers": list(range(count)), "from": f"{prefix}{key} = false", "of": count}
    return None


#: Models whose layer types follow ``sliding_window_pattern``, and its default there.
_PATTERN_DEFAULTS = {
    "cohere2": (4, "sliding_window_pattern 4 (Cohere2Config's default)"),
    "cohere2_moe": (4, "sliding_window_pattern 4 (Cohere2Config's default)"),
    "gemma3_text": (6, "sliding_window_pattern 6 (Gemma3TextConfig's default)"),
    "gemma3": (6, "sliding_window_pattern 6 (Gemma3TextConfig's default)"),
}


def _attention_types(part: Any, prefix: str, count: int | None) -> tuple[list[str], str] | None:
    """Each layer's attention type and the key it came from: ``layer_types``, else Cohere 2's
    or Gemma 3's ``sliding_window_pattern`` (every n-th layer full; by default n = 4 for
    ``Cohere2Config``, 6 for ``Gemma3TextConfig``)."""
    types = setting(part, "layer_types")
    if isinstance(types, (list, tuple)) and types:
        return [str(t) for t in types], f"{prefix}layer_types"
    model_type = str(setting(part, "model_type") or "")
    default = _PATTERN_DEFAULTS.get(model_type)
    if default is not None and count:
        n = setting(part, "sliding_window_pattern")
        source = f"{prefix}sliding_window_pattern = {n}"
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            n, source = default
        made = ["full_attention" if (i + 1) % n == 0 else "sliding_attention" for i in range(count)]
        return made, f"{source} (every {n}th layer full attention)"
    return None


def _sliding_only_nope(part: Any, prefix: str, count: int | None) -> dict[str, Any] | None:
    """The full-attention layers of a model that rotates its sliding-window layers only."""
    found = model_types.lookup(model_types.SLIDING_ONLY_ROPE, setting(part, "model_type"))
    types = _attention_types(part, prefix, count) if found else None
    if types is None:
        return None
    layer_types, source = types
    full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    note = ""
    if found == "cohere2_moe" and setting(part, "prefix_dense_sliding_window_pattern", 1) == 1:
        # its force_rope: the dense (MLP) layers rotate whatever their attention
        mlp = setting(part, "mlp_layer_types")
        if isinstance(mlp, (list, tuple)):
            dense = {i for i, t in enumerate(mlp) if t == "dense"}
        else:
            dense = set(range(int(setting(part, "first_k_dense_replace", 0))))
        full = [i for i in full if i not in dense]
        note = " other than the dense ones (force_rope)"
    return {
        "layers": full,
        "from": f"{source}: the full_attention layers{note} (transformers' {found} model "
        "rotates its sliding-window layers only)",
        "of": len(layer_types),
    }


def _given(part: Any, key: str) -> tuple[bool, Any]:
    """Whether the config has ``key`` (``None`` included: a class's "off") and its value."""
    if isinstance(part, Mapping):
        return key in part, part.get(key)
    return hasattr(part, key), getattr(part, key, None)


def layer_settings(config: Any) -> list[dict[str, Any]]:
    """What the layers do with positions besides RoPE, each with its key and its layers.

    Llama 4 (``model_type`` ``llama4_text``, or a config giving its keys): the
    temperature tuning of its NoPE layers (``attn_temperature_tuning``,
    ``floor_scale``, ``attn_scale``: :func:`posenc.attn_temperature`), the chunked
    attention of its RoPE layers (``attention_chunk_size``: ``posenc.attention``'s
    ``chunk_size``) and their QK norm (``use_qk_norm``); a key the config omits is
    Llama4TextConfig's default. Cohere 2 (and the other
    :data:`~posenc.families.rotary.model_types.SLIDING_ONLY_ROPE` models): the
    sliding window of its RoPE layers. Each entry: ``setting``, ``value``,
    ``from``, ``layers`` (the indices it applies to, None when the config gives no
    layer count) and ``means``.
    """
    part, prefix = _rope_part(config)
    count = _num_layers(part)
    model_type = str(setting(part, "model_type") or "")
    nope = nope_layers(config)
    no_rope = set(nope["layers"]) if nope else set()
    every = list(range(count)) if count else None
    rope_layers = None if every is None else [i for i in every if i not in no_rope]
    nope_list = None if every is None else [i for i in every if i in no_rope]
    llama4 = model_type == "llama4_text"
    out: list[dict[str, Any]] = []

    def read_key(key: str) -> tuple[bool, Any, str]:
        present, value = _given(part, key)
        if present:
            return True, value, f"{prefix}{key}"
        if llama4:
            return True, LLAMA4_DEFAULTS[key], f"default (Llama4TextConfig's {key})"
        return False, None, ""

    has, tuning, source = read_key("attn_temperature_tuning")
    if has:
        layers = nope_list if tuning else []
        out.append({"setting": "attn_temperature_tuning", "value": tuning, "from": source,
                    "layers": layers,
                    "means": "q times posenc.attn_temperature(cache_position, floor_scale, "
                    "attn_scale)" if tuning else "off: no query scale"})  # fmt: skip
        for key, means in (
            ("floor_scale", "positions per step of the query scale"),
            ("attn_scale", "the query scale's strength"),
        ):
            if read_key(key)[0]:
                _, value, source = read_key(key)
                out.append({"setting": key, "value": value, "from": source, "layers": layers,
                            "means": means})  # fmt: skip
    has, chunk, source = read_key("attention_chunk_size")
    if has:
        types = setting(part, "layer_types")
        if chunk is None:
            layers, means = [], "off: every layer attends to all earlier keys"
        else:
            if isinstance(types, (list, tuple)) and types:
                layers = [i for i, t in enumerate(types) if t == "chunked_attention"]
            else:
                layers = rope_layers
            means = f"keys of the query's chunk only (posenc.attention(chunk_size={chunk}))"
        out.append({"setting": "attention_chunk_size", "value": chunk, "from": source,
                    "layers": layers, "means": means})  # fmt: skip
    if llama4:
        _, norm, source = read_key("use_qk_norm")
        out.append({"setting": "use_qk_norm", "value": norm, "from": source,
                    "layers": rope_layers if norm else [],
                    "means": "weightless RMS norm of q and k after RoPE (eps rms_norm_eps)"
                    if norm else "off"})  # fmt: skip
    if model_types.lookup(model_types.SLIDING_ONLY_ROPE, model_type):
        types_read = _attention_types(part, prefix, count)
        window = setting(part, "sliding_window")
        if types_read is not None:
            sliding = [i for i, t in enumerate(types_read[0]) if t == "sliding_attention"]
            out.append({"setting": "sliding_window", "value": window,
                        "from": f"{prefix}sliding_window; layers from {types_read[1]}",
                        "layers": sliding,
                        "means": "RoPE and the last sliding_window keys; the other layers: "
                        "every key, no RoPE"})  # fmt: skip
    return out


# --------------------------------------------------------------------------------------
# The description: what ``posenc rope`` prints, as a JSON-able document.


def describe(loaded: Loaded, readings: list[Reading] | None = None) -> dict[str, Any]:
    """The reading of ``loaded`` as a JSON-able dict (what ``--json`` prints).

    Examples:
        >>> from posenc.analysis.rope_reading import Loaded, describe
        >>> config = {"model_type": "llama", "rope_theta": 500000.0, "hidden_size": 64,
        ...           "num_attention_heads": 2, "max_position_embeddings": 8192,
        ...           "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
        ...                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        ...                            "original_max_position_embeddings": 8192}}
        >>> doc = describe(Loaded(config, "config.json", "file"))
        >>> doc["model_type"], len(doc["ropes"]), doc["nope_layers"]
        ('llama', 1, None)
        >>> rope = doc["ropes"][0]
        >>> rope["base"], rope["parameters"]["factor"]
        ({'value': 500000.0, 'from': 'rope_theta'}, {'value': 8.0, 'from': 'rope_scaling.factor'})
        >>> rope["wavelengths"]["window"], round(rope["wavelengths"]["longest"])
        (8192, 11067620)
    """
    readings = read(loaded) if readings is None else readings
    part, prefix = _rope_part(loaded.config)
    notes = list(loaded.notes)
    scaled = setting(part, "rope_scaling_layers")
    count = _num_layers(part)
    if isinstance(scaled, (list, tuple)) and count and len(scaled) < count:
        notes.append(
            f"{prefix}rope_scaling_layers: the scaling applies to layers {ranges(list(scaled))} "
            "only; the other layers use the unscaled default with the same base"
        )
    if loaded.kind == "file" and loaded.original is not None:
        notes.extend(_transformers_check(loaded, readings))
    notes.extend(_softmax_check(loaded, readings))
    for r in readings:
        if r.mrope and not r.mrope["sums_to_pairs"]:
            notes.append(
                f"mrope_section {r.mrope['section']} sums to {sum(r.mrope['section'])}, "
                f"not rotary_dim / 2 = {r.mrope['pairs']}"
            )
    return {
        "config": loaded.label,
        "kind": loaded.kind,
        "sets": dict(loaded.sets),
        "model_type": setting(loaded.config, "model_type"),
        "rope_model_type": setting(part, "model_type"),
        "num_hidden_layers": count,
        "per_layer_type": readings[0].layer_type is not None,
        "ropes": [_reading_json(r) for r in readings],
        "nope_layers": nope_layers(loaded.config),
        "layer_settings": layer_settings(loaded.config),
        "notes": notes,
    }


def _reading_json(r: Reading) -> dict[str, Any]:
    spec = r.spec
    fixed = {row.name: row for row in r.rows}
    params = {
        row.name: {"value": row.value, "from": row.source}
        for row in r.rows
        if row.name not in ("rope type", "base (rope_theta)", "head_dim", "partial_rotary_factor",
                            "rotary dim", "layout", "attention scaling", "softmax scale factor")
    }  # fmt: skip
    softmax = None if r.softmax is None else {"value": r.softmax.value, "from": r.softmax.source}
    return {
        "layer_type": r.layer_type,
        "layers": r.layers,
        "rope_type": {"value": spec.rope_type, "from": fixed["rope type"].source},
        "base": {"value": spec.base, "from": fixed["base (rope_theta)"].source},
        "head_dim": {"value": spec.head_dim, "from": fixed["head_dim"].source},
        "partial_rotary_factor": {
            "value": fixed["partial_rotary_factor"].value,
            "from": fixed["partial_rotary_factor"].source,
        },
        "rotary_dim": {"value": spec.rotary_dim, "from": fixed["rotary dim"].source},
        "layout": {"value": r.layout, "from": fixed["layout"].source},
        "parameters": params,
        "attention_scaling": {"value": r.scaling.value, "from": r.scaling.source},
        "softmax_scale_factor": softmax,
        "wavelengths": r.wavelengths,
        "mrope": r.mrope,
    }


def _transformers_check(loaded: Loaded, readings: list[Reading]) -> list[str]:
    """Differences between posenc's reading of a config.json and transformers' class's."""
    assert loaded.original is not None
    model_type = setting(loaded.original, "model_type")
    if not isinstance(model_type, str):
        return []
    try:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        return []
    if model_type not in CONFIG_MAPPING:
        return [f"transformers {transformers.__version__} does not know model_type "
                f"{model_type!r}: no cross-check"]  # fmt: skip
    cls = CONFIG_MAPPING[model_type]
    with quiet():
        try:
            theirs_config = cls.from_dict(copy.deepcopy(loaded.original))
        except Exception as exc:
            return [f"transformers' {cls.__name__} refuses this config: {one_line(exc)}"]
    who = f"transformers {transformers.__version__} ({cls.__name__})"
    try:
        types = rope_layer_types(theirs_config)
        theirs = [rope_spec(theirs_config, lt) for lt in types or (None,)]
    except (ValueError, TypeError) as exc:
        return [f"{who}: posenc cannot read its config object: {exc}"]
    ours = {r.layer_type: r for r in readings}
    diffs = []
    if set(types or (None,)) != set(ours):
        names = ", ".join(types) if types else "one RoPE for all layers"
        mine = ", ".join(str(k) for k in ours) if None not in ours else "one RoPE for all layers"
        diffs.append(f"layer types: {names} (posenc reads the file as: {mine})")
    for spec in theirs:
        mine_r = ours.get(spec.layer_type) or (ours.get(None) if None in ours else None)
        if mine_r is None:
            continue
        label = f"{spec.layer_type}: " if spec.layer_type else ""
        diffs += [label + d for d in _spec_differences(spec, mine_r.spec)]
    nope_theirs, nope_ours = nope_layers(theirs_config), nope_layers(loaded.config)
    layers_t = nope_theirs["layers"] if nope_theirs else []
    layers_o = nope_ours["layers"] if nope_ours else []
    if layers_t != layers_o:
        t_text, o_text = ranges(layers_t) or "none", ranges(layers_o) or "none"
        diffs.append(f"NoPE layers: {t_text} (posenc reads: {o_text})")
    if not diffs:
        return [f"{who} reads the same RoPE from this file"]
    return [f"WARNING: {who} reads this file differently: {d}" for d in diffs]


#: How far transformers' attention ``scaling`` may lie from posenc's ``qk_head_dim ** -0.5 *
#: m * m`` (``m = yarn_get_mscale(factor, mscale_all_dim)``) and still be that product: both
#: are float64. ``m`` carries at most 3 roundings (a product, the log's last-bit error
#: scaled by ``0.1 a ln f / m <= 1``, the sum), each within ``eps`` relative, doubled by the
#: square; the power and the two products add 3 more: <= 9 ``eps`` a side, 18 between
#: two orders of the same operations. 32 ``eps`` (7e-15) stays far below ``m * m - 1``,
#: what tells "applied" from "not applied" (``0.2 a ln f``: 1e-5 at factor 1.0001 and
#: ``mscale_all_dim`` 0.5).
SOFTMAX_RTOL = 32 * sys.float_info.epsilon


def softmax_verdict(theirs: float, base: float, factor: float) -> str:
    """Whether transformers' attention ``scaling`` applies the softmax-scale factor.

    ``"applied"`` when ``theirs`` is ``base * factor`` within :data:`SOFTMAX_RTOL`,
    ``"not applied"`` when it is ``base``, else ``"other"``.

    Examples:
        >>> from posenc.analysis.rope_reading import softmax_verdict
        >>> base = 192 ** -0.5
        >>> [softmax_verdict(v, base, 1.5) for v in (base * 1.5, base, base * 1.4)]
        ['applied', 'not applied', 'other']
    """
    if math.isclose(theirs, base * factor, rel_tol=SOFTMAX_RTOL, abs_tol=0.0):
        return "applied"
    if math.isclose(theirs, base, rel_tol=SOFTMAX_RTOL, abs_tol=0.0):
        return "not applied"
    return "other"


def _softmax_check(loaded: Loaded, readings: list[Reading]) -> list[str]:
    """Whether transformers' own attention applies the softmax-scale factor the config sets.

    transformers builds the model on the meta device (:func:`softmax_scale`); its first
    attention's ``scaling`` is compared with ``qk_head_dim ** -0.5`` (DeepSeek's
    ``qk_nope_head_dim + qk_rope_head_dim``, else the head dim) with and without the factor.
    """
    row = next((r.softmax for r in readings if r.softmax is not None), None)
    if row is None:
        return []
    config = loaded.original if loaded.original is not None else loaded.config
    if not isinstance(config, Mapping):
        config = config.to_dict() if hasattr(config, "to_dict") else None
    if config is None:
        return []
    try:
        theirs, where = softmax_scale(config)
    except ImportError as exc:  # transformers or torch missing: the row stands unchecked
        missing = exc.name or str(exc)
        return [f"softmax scale factor not checked against transformers ({missing} missing)"]
    if theirs is None:
        return [f"softmax scale factor not checked against transformers: {where}"]
    part, prefix = _rope_part(config)
    nope, rope = setting(part, "qk_nope_head_dim"), setting(part, "qk_rope_head_dim")
    if nope is not None and rope is not None:
        dim, dim_text = int(nope) + int(rope), f"{prefix}qk_nope_head_dim + qk_rope_head_dim"
    else:
        dim, dim_text = readings[0].spec.head_dim, "head_dim"
    base = dim ** (-0.5)
    verdict = softmax_verdict(theirs, base, float(row.value))
    if verdict == "applied":
        return [f"{where} = ({dim_text} = {dim}) ** -0.5 x {row.display()}: transformers "
                "applies the softmax scale factor"]  # fmt: skip
    if verdict == "not applied":
        return [f"WARNING: {where} = ({dim_text} = {dim}) ** -0.5: transformers' model does "
                f"not apply the softmax scale factor {row.display()} this config sets"]  # fmt: skip
    return [f"WARNING: {where} = {theirs:.6g}, neither ({dim_text} = {dim}) ** -0.5 = "
            f"{base:.6g} nor that times the softmax scale factor {row.display()}"]  # fmt: skip


def _spec_differences(theirs: RopeSpec, ours: RopeSpec) -> list[str]:
    out = []
    for name in ("rope_type", "base", "head_dim", "rotary_dim", "mrope_section"):
        a, b = getattr(theirs, name), getattr(ours, name)
        if a != b:
            out.append(f"{name} {show(a)} (posenc reads {show(b)})")
    if not out:
        ft, fo = theirs.frequencies(), ours.frequencies()
        if not np.allclose(ft.inv_freq, fo.inv_freq, rtol=1e-12, atol=0):
            out.append("frequencies differ (same type, base and dims: the parameters differ)")
        if not math.isclose(ft.attention_scaling, fo.attention_scaling, rel_tol=1e-12):
            out.append(f"attention scaling {ft.attention_scaling:.6g} "
                       f"(posenc reads {fo.attention_scaling:.6g})")  # fmt: skip
    return out
