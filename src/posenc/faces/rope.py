"""The ``posenc rope`` command: how posenc reads a model's RoPE configuration.

``posenc rope CONFIG`` reads a ``config.json`` (or a directory holding one, or a
transformers config class instantiated with its defaults) with
:func:`posenc.families.rotary.config.rope_spec`, and prints, per layer type, every
setting the rotary embedding depends on with the config key it came from: rope
type, base, head and rotary dims, layout, the schedule's parameters (given,
derived from another attribute, or the schedule's default), the attention
scaling, and the wavelengths against the trained window. NoPE layers and M-RoPE
sections are listed when the config has them. For a ``config.json`` whose
``model_type`` transformers knows, the reading is checked against the one of
transformers' own config class, and any difference is printed.

``--golden FILE.npz`` writes posenc's exact tables (``inv_freq``, ``cos``,
``sin`` in the half and the interleaved layouts, in float64) for checking another
engine; ``--compare FILE.npz`` checks another engine's tables against posenc's and
names the likely misreading when they diverge (layout, a missing attention factor,
float32 angles, a scaling not applied or applied twice, a wrong base).

Tolerances (see :func:`_value_tolerance`): a value may differ from the exact one by
the rounding of the stored dtype and by what a float64 computation of the
frequencies and of ``position * omega`` costs; float32 angles, which err by about
``position * omega * 2**-24``, do not agree.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import decimal
import difflib
import functools
import json
import math
import re
import shutil
import sys
import warnings
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from posenc.core import checks
from posenc.faces.files import atomic_write
from posenc.families.rotary import model_types
from posenc.families.rotary.config import (
    DEFAULT_THETA,
    RopeSpec,
    raw_parameters,
    rope_layer_types,
    rope_part,
    rope_spec,
    setting,
)
from posenc.families.rotary.schedules import PARAMETERS, RopeFrequencies

__all__ = [
    "Loaded",
    "compare",
    "describe",
    "load_config",
    "parse_positions",
    "parse_set",
    "run",
    "write_golden",
]

#: Positions the exact angle engine evaluates within its error budget (|position| < 2**31).
MAX_POSITION = 2**31 - 1
#: Names of the arrays of a golden file (each prefixed ``<layer_type>/`` for per-type RoPE).
ARRAYS = ("inv_freq", "positions", "cos", "sin", "cos_interleaved", "sin_interleaved")
#: posenc's own error on a float64 table value (the exact engine: about 1e-15, before scaling).
_POSENC_ERROR = 2.0**-49
_UNIT_ROUNDOFF = {
    np.dtype(np.float16): 2.0**-11,
    np.dtype(np.float32): 2.0**-24,
    np.dtype(np.float64): 2.0**-53,
}
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
#: Keys that list layers without RoPE (layer indices), besides SmolLM3's and Llama 4's mask.
_NOPE_INDEX_KEYS = ("nope_layers", "nope_layer_indices", "no_pe_layers")


# --------------------------------------------------------------------------------------
# Command-line values.


def parse_set(text: str) -> tuple[tuple[str, ...], Any]:
    """Parse one ``--set key=value``: a dotted key path and a JSON value (else the string).

    Raises:
        ValueError: no ``=``, an empty key, or an empty part of a dotted key.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"--set must look like key=value (key may be dotted: a.b=1); got {text!r}")
    path = tuple(part.strip() for part in key.split("."))
    if any(not part for part in path):
        raise ValueError(f"--set {key!r}: an empty part in the dotted key")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return path, value


def parse_positions(text: str) -> npt.NDArray[np.int64]:
    """Positions from ``start:stop`` or ``start:stop:step`` (like ``range``) or ``p0,p1,...``.

    Raises:
        ValueError: not of these forms, no positions, a negative position or one
            of ``2**31`` or more.
    """
    what = f"--positions {text!r}"
    form = (
        f"{what}: must be start:stop, start:stop:step or a comma list of ints "
        "(e.g. 0:4096, 0:131072:1024, 0,1,100000)"
    )
    spec = text.strip()
    try:
        parts = [int(p) for p in spec.split(":" if ":" in spec else ",")]
    except ValueError:
        raise ValueError(form) from None
    if ":" in spec:
        if len(parts) not in (2, 3):
            raise ValueError(form)
        start, stop, step = (*parts, 1) if len(parts) == 2 else parts
        if step < 1:
            raise ValueError(f"{what}: the step must be >= 1; got {step}")
        if max(abs(start), abs(stop)) > MAX_POSITION + 1:
            raise ValueError(f"{what}: positions must lie in 0 .. 2**31 - 1")
        positions = np.arange(start, stop, step, dtype=np.int64)
    else:
        if any(abs(p) > MAX_POSITION + 1 for p in parts):
            raise ValueError(f"{what}: positions must lie in 0 .. 2**31 - 1")
        positions = np.array(parts, dtype=np.int64)
    if positions.size == 0:
        raise ValueError(f"{what}: no positions (stop must exceed start)")
    if positions.min() < 0 or positions.max() > MAX_POSITION:
        raise ValueError(f"{what}: positions must lie in 0 .. 2**31 - 1")
    return positions


# --------------------------------------------------------------------------------------
# Loading a config.


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
    """

    config: Any
    label: str
    kind: str
    sets: list[tuple[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)
    original: dict[str, Any] | None = None


def load_config(source: str, sets: Sequence[str] = ()) -> Loaded:
    """Read ``source``: a ``config.json``, a directory holding one, or a config class name.

    Args:
        source: a path, or a transformers config class name (``LlamaConfig``).
        sets: ``key=value`` strings (see :func:`parse_set`), applied before reading.

    Raises:
        ValueError: no such file or class, malformed JSON, a bad ``--set``.
        OSError: the file cannot be read.
    """
    parsed = [parse_set(s) for s in sets]
    path = Path(source)
    if path.exists():
        return _load_file(path, parsed)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", source):
        return _load_class(source, parsed)
    raise ValueError(
        f"CONFIG {source!r}: no such file or directory (give a config.json, a directory "
        "holding one, or a transformers config class name such as LlamaConfig)"
    )


def _load_file(path: Path, sets: list[tuple[tuple[str, ...], Any]]) -> Loaded:
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"CONFIG {str(path)!r}: a directory without a config.json")
        path = path / "config.json"
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except ValueError as exc:
        raise ValueError(f"CONFIG {str(path)!r}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"CONFIG {str(path)!r}: a config.json holds a JSON object; got a "
                         f"{type(data).__name__}")  # fmt: skip
    for keys, value in sets:
        _set_in_dict(data, keys, value)
    loaded = Loaded(
        config=data,
        label=str(path),
        kind="file",
        sets=[(".".join(k), v) for k, v in sets],
        original=copy.deepcopy(data),
    )
    _rewrite_mrope_type(loaded)
    return loaded


def _set_in_dict(data: dict[str, Any], keys: tuple[str, ...], value: Any) -> None:
    where = data
    for i, key in enumerate(keys[:-1]):
        nxt = where.get(key)
        if nxt is None:
            nxt = where[key] = {}
        if not isinstance(nxt, dict):
            raise ValueError(
                f"--set {'.'.join(keys)}: {'.'.join(keys[: i + 1])} is not a dict "
                f"(it is {type(nxt).__name__} {nxt!r})"
            )
        where = nxt
    where[keys[-1]] = value


def _rewrite_mrope_type(loaded: Loaded) -> None:
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
def _quiet() -> Iterator[None]:
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


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ValueError(
            "a config class name needs transformers (pip install transformers); "
            "or give a config.json"
        ) from None
    return transformers


def _load_class(name: str, sets: list[tuple[tuple[str, ...], Any]]) -> Loaded:
    transformers = _transformers()
    base = transformers.PretrainedConfig
    try:
        cls = getattr(transformers, name)
    except Exception:  # the lazy module raises AttributeError, or an import error of a model
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        names = [n for n in dir(transformers) if n.endswith("Config")]
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(
            f"CONFIG {name!r}: no such file, and transformers {transformers.__version__} has "
            f"no config class of that name{hint}"
        )
    with _quiet():
        try:
            default = cls()
        except Exception as exc:
            raise ValueError(f"{name}() fails with its defaults: {_one_line(exc)}") from None
        kwargs = _class_kwargs(name, default, sets)
        try:
            config = cls(**kwargs)
        except Exception as exc:
            raise ValueError(f"{name}(**--set values) fails: {_one_line(exc)}") from None
    notes = _apply_after(config, sets)
    label = f"{name}() (transformers {transformers.__version__} defaults)"
    return Loaded(config, label, "class", [(".".join(k), v) for k, v in sets], notes)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _is_config(value: Any) -> bool:
    return hasattr(value, "to_dict") and hasattr(value, "model_type")


def _class_kwargs(
    name: str, default: Any, sets: list[tuple[tuple[str, ...], Any]], where: str = ""
) -> dict[str, Any]:
    """Keyword arguments that apply ``sets`` at instantiation.

    A top-level key is passed as is; a dotted key into a dict attribute
    (``rope_parameters.factor``) passes the default dict with the value set; into a
    sub-config (``text_config.rope_theta``), a dict of the sub-config's own kwargs.
    """
    kwargs: dict[str, Any] = {}
    subs: dict[str, list[tuple[tuple[str, ...], Any]]] = {}
    v4_names = ("rope_scaling", "rope_theta", "partial_rotary_factor")
    for keys, value in sets:
        head = keys[0]
        dotted = where + ".".join(keys)
        if not hasattr(default, head) and head not in v4_names:
            fields = list(default.to_dict())
            close = difflib.get_close_matches(head, fields, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"--set {dotted}: {name} has no attribute {head!r}{hint}")
        if len(keys) == 1:
            kwargs[head] = value
            continue
        current = getattr(default, head, None)
        if _is_config(current):
            subs.setdefault(head, []).append((keys[1:], value))
        elif current is None or isinstance(current, Mapping):
            target = kwargs.get(head)
            if not isinstance(target, dict):
                target = kwargs[head] = copy.deepcopy(dict(current or {}))
            _set_in_dict(target, keys[1:], value)
        else:
            raise ValueError(
                f"--set {dotted}: {head} is not a dict or a sub-config "
                f"(it is {type(current).__name__} {current!r})"
            )
    for head, sub_sets in subs.items():
        sub = getattr(default, head)
        kwargs[head] = _class_kwargs(type(sub).__name__, sub, sub_sets, f"{where}{head}.")
    # v5 keeps rope_theta inside rope_parameters: a top-level rope_theta is only read when
    # rope_parameters has none, so with both given it goes inside
    params = kwargs.get("rope_parameters")
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in kwargs and isinstance(params, dict) and not _nested_dict(params):
            params[key] = kwargs.pop(key)
    return kwargs


def _nested_dict(params: Mapping[str, Any]) -> bool:
    return bool(params) and all(v is None or isinstance(v, Mapping) for v in params.values())


def _apply_after(config: Any, sets: list[tuple[tuple[str, ...], Any]]) -> list[str]:
    """Set what instantiation did not keep (``setattr`` after), and say so."""
    notes = []
    for keys, value in sets:
        found, current = _lookup(config, keys)
        if found and current == value:
            continue
        if keys[-1] in ("rope_theta", "partial_rotary_factor"):
            # v5 moved these into rope_parameters: the class put them there (or not)
            owner_found, owner = _lookup(config, keys[:-1]) if len(keys) > 1 else (True, config)
            params = setting(owner, "rope_parameters") if owner_found else None
            if isinstance(params, Mapping) and params.get(keys[-1]) == value:
                continue
        target_found, target = _lookup(config, keys[:-1]) if len(keys) > 1 else (True, config)
        if not target_found:
            continue
        if isinstance(target, dict):
            target[keys[-1]] = value
        else:
            setattr(target, keys[-1], value)
        notes.append(f"--set {'.'.join(keys)}: set after instantiation (the class did not keep it)")
    return notes


def _lookup(config: Any, keys: Sequence[str]) -> tuple[bool, Any]:
    current = config
    for key in keys:
        if isinstance(current, Mapping):
            if key not in current:
                return False, None
            current = current[key]
        elif hasattr(current, key):
            current = getattr(current, key)
        else:
            return False, None
    return True, current


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
        return self.shown or _show(self.value)


@dataclass
class Reading:
    """One RoPE of a model: the spec posenc reads and the rows that explain it."""

    layer_type: str | None
    spec: RopeSpec
    freqs: RopeFrequencies
    layers: list[int] | None
    rows: list[Row]
    scaling: Row
    wavelengths: dict[str, Any]
    mrope: dict[str, Any] | None
    layout: str


def _show(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "-"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e16:
            return str(int(value))
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        if len(value) > 6:
            head = ", ".join(_show(v) for v in value[:3])
            return f"[{head}, ... {_show(value[-1])}] ({len(value)} values)"
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def _ranges(indices: Sequence[int], limit: int = 8) -> str:
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
    """
    config = loaded.config
    part, prefix = _rope_part(config)
    try:
        types = rope_layer_types(config)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"{loaded.label}: {exc}") from None
    nope = nope_layers(config)
    layer_types = setting(part, "layer_types")
    count = _num_layers(part)
    readings = []
    for lt in types or (None,):
        try:
            spec = rope_spec(config, lt)
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"{loaded.label}: {exc}") from None
        if lt is not None and isinstance(layer_types, (list, tuple)):
            layers: list[int] | None = [i for i, t in enumerate(layer_types) if t == lt]
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
    if setting(part, "rope_interleave"):
        return "half", (
            "rope_interleave: the model de-interleaves q and k, then applies HF's half "
            "tables (pairs (i, i + rotary_dim / 2))"
        )
    return "half", "HF's rotate_half: pairs (i, i + rotary_dim / 2)"


def _reading(
    loaded: Loaded, part: Any, prefix: str, spec: RopeSpec, layers: list[int] | None
) -> Reading:
    group = _group(part)
    raw = raw_parameters(part)
    lt = spec.layer_type
    where = f"{prefix}{group}" + (f".{lt}" if lt else "")
    d: Mapping[str, Any] = (raw[lt] if lt else raw) or {}
    rows: list[Row] = []

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
        type_source = "default (no rope_type given)"
    rows.append(Row("rope type", spec.rope_type, type_source))

    # base and partial factor: inside the dict, else a top-level attribute, else default
    def first(key: str, names: tuple[str, ...], default: str) -> str:
        if d.get(key) is not None:
            return f"{where}.{key}"
        for name in names:
            if setting(part, name) is not None:
                return f"{prefix}{name}" + (" (GPT-NeoX's name)" if name != key else "")
        return default

    rows.append(Row("base (rope_theta)", spec.base, first(
        "rope_theta", ("rope_theta", "rotary_emb_base"),
        f"default (HF's default_theta {DEFAULT_THETA:g})",
    )))  # fmt: skip
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
    partial_source = first(
        "partial_rotary_factor", ("partial_rotary_factor", "rotary_pct"), "default"
    )
    given = next(
        (v for v in (d.get("partial_rotary_factor"), setting(part, "partial_rotary_factor"),
                     setting(part, "rotary_pct")) if v is not None),
        None,
    )  # fmt: skip
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
    freqs = spec.frequencies()
    for key in sorted(optional - set(spec.params)):
        default = _OPTIONAL_DEFAULTS.get(spec.rope_type, {}).get(key)
        if spec.rope_type == "longrope" and key == "factor":
            continue  # longrope's factor comes from max_position_embeddings (a row above)
        if default is None:
            rows.append(Row(key, None, "not set", "-"))
        else:
            rows.append(Row(key, default, f"default ({spec.rope_type})"))
    scaling = Row("attention scaling", freqs.attention_scaling, _scaling_source(spec))
    rows.append(scaling)

    wavelengths = _wavelengths(spec, freqs)
    mrope = _mrope(loaded, part, prefix, spec, where, d)
    return Reading(lt, spec, freqs, layers, rows, scaling, wavelengths, mrope, layout)


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
    if key == "factor" and spec.rope_type == "yarn":
        return "= max_position_embeddings / original_max_position_embeddings (factor is None)"
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
        return f"0.1 ln(factor) + 1 = 0.1 ln({_show(float(params['factor']))}) + 1 (YaRN)"
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
    interval = setting(part, "no_rope_layer_interval")
    if mask is None and isinstance(interval, int) and interval > 0 and count:
        return {
            "layers": [i for i in range(count) if (i + 1) % interval == 0],
            "from": f"{prefix}no_rope_layer_interval = {interval} (every {interval}th layer, "
            "as SmolLM3 and Llama 4 default no_rope_layers)",
            "of": count,
        }
    for key in _NOPE_INDEX_KEYS:
        value = setting(part, key)
        if isinstance(value, (list, tuple)) and value:
            return {"layers": sorted(int(i) for i in value), "from": f"{prefix}{key}",
                    "of": count}  # fmt: skip
    raw = raw_parameters(part)
    layer_types = setting(part, "layer_types")
    none_types = [k for k, v in raw.items() if v is None] if _nested_dict(raw) else []
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


# --------------------------------------------------------------------------------------
# The description (printed as tables or JSON).


def describe(loaded: Loaded, readings: list[Reading] | None = None) -> dict[str, Any]:
    """The reading of ``loaded`` as a JSON-able dict (what ``--json`` prints)."""
    readings = read(loaded) if readings is None else readings
    part, prefix = _rope_part(loaded.config)
    notes = list(loaded.notes)
    scaled = setting(part, "rope_scaling_layers")
    count = _num_layers(part)
    if isinstance(scaled, (list, tuple)) and count and len(scaled) < count:
        notes.append(
            f"{prefix}rope_scaling_layers: the scaling applies to layers {_ranges(list(scaled))} "
            "only; the other layers use the unscaled default with the same base"
        )
    if loaded.kind == "file" and loaded.original is not None:
        notes.extend(_transformers_check(loaded, readings))
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
        "notes": notes,
    }


def _reading_json(r: Reading) -> dict[str, Any]:
    spec = r.spec
    fixed = {row.name: row for row in r.rows}
    params = {
        row.name: {"value": row.value, "from": row.source}
        for row in r.rows
        if row.name not in ("rope type", "base (rope_theta)", "head_dim", "partial_rotary_factor",
                            "rotary dim", "layout", "attention scaling")
    }  # fmt: skip
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
    with _quiet():
        try:
            theirs_config = cls.from_dict(copy.deepcopy(loaded.original))
        except Exception as exc:
            return [f"transformers' {cls.__name__} refuses this config: {_one_line(exc)}"]
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
        t_text, o_text = _ranges(layers_t) or "none", _ranges(layers_o) or "none"
        diffs.append(f"NoPE layers: {t_text} (posenc reads: {o_text})")
    if not diffs:
        return [f"{who} reads the same RoPE from this file"]
    return [f"WARNING: {who} reads this file differently: {d}" for d in diffs]


def _spec_differences(theirs: RopeSpec, ours: RopeSpec) -> list[str]:
    out = []
    for name in ("rope_type", "base", "head_dim", "rotary_dim", "mrope_section"):
        a, b = getattr(theirs, name), getattr(ours, name)
        if a != b:
            out.append(f"{name} {_show(a)} (posenc reads {_show(b)})")
    if not out:
        ft, fo = theirs.frequencies(), ours.frequencies()
        if not np.allclose(ft.inv_freq, fo.inv_freq, rtol=1e-12, atol=0):
            out.append("frequencies differ (same type, base and dims: the parameters differ)")
        if not math.isclose(ft.attention_scaling, fo.attention_scaling, rel_tol=1e-12):
            out.append(f"attention scaling {ft.attention_scaling:.6g} "
                       f"(posenc reads {fo.attention_scaling:.6g})")  # fmt: skip
    return out


# --------------------------------------------------------------------------------------
# Printing.


def _title(r: Reading, doc: Mapping[str, Any]) -> str:
    name = f"RoPE of {r.layer_type} layers" if r.layer_type else "RoPE"
    total = doc["num_hidden_layers"]
    if r.layer_type is None and r.layers is not None and len(r.layers) == total:
        name += f" (all {total} layers)"
    elif r.layers is not None:
        name += f" ({len(r.layers)} of {total or len(r.layers)} layers: {_ranges(r.layers)})"
    elif r.layer_type is None:
        name += " (all layers)"
    return name


def _extra_rows(r: Reading) -> list[tuple[str, str, str]]:
    w = r.wavelengths
    rows = []
    if w["shortest"] is not None:
        rows.append((
            "wavelengths",
            f"{_show(w['shortest'])} .. {_show(w['longest'])}",
            f"2 pi / omega in positions, pairs {w['shortest_pair']} .. {w['longest_pair']}",
        ))  # fmt: skip
    if w["rotating_pairs"] < w["pairs"]:
        rows.append(("not rotating", f"{w['pairs'] - w['rotating_pairs']} pairs", "omega = 0"))
    if w["window"] is not None:
        rows.append(("trained window", _show(w["window"]), w["window_from"]))
        rows.append((
            "full turns in window",
            f"{w['full_turn_pairs']} of {w['pairs']} pairs",
            f"pairs with wavelength <= {_show(w['window'])}",
        ))  # fmt: skip
    if "max_position_embeddings" in w:
        rows.append((
            "full turns in max_pos",
            f"{w['full_turn_pairs_max']} of {w['pairs']} pairs",
            f"wavelength <= max_position_embeddings ({_show(w['max_position_embeddings'])})",
        ))  # fmt: skip
    if "note" in w:
        rows.append(("frequencies shown", "at seq_len <= window", w["note"]))
    if r.mrope:
        m = r.mrope
        rows.append(("mrope_section", _show(m["section"]), m["from"]))
        order = "interleaved (Qwen3-VL)" if m["interleaved"] else "contiguous sections (Qwen2-VL)"
        rows.append(("mrope order", order, m["order_from"]))
        axes = "equal for text tokens: then one-axis RoPE"
        rows.append(("mrope axes", "temporal, height, width", axes))
    return rows


def _header(doc: Mapping[str, Any]) -> list[str]:
    lines = [f"posenc rope: {doc['config']}"]
    facts = []
    if doc["model_type"]:
        facts.append(f"model_type {doc['model_type']}")
        if doc["rope_model_type"] and doc["rope_model_type"] != doc["model_type"]:
            facts[-1] += f" (RoPE in text_config: {doc['rope_model_type']})"
    if doc["num_hidden_layers"]:
        facts.append(f"{doc['num_hidden_layers']} layers")
    n = len(doc["ropes"])
    facts.append(f"one RoPE per layer type ({n})" if doc["per_layer_type"] else "one RoPE")
    lines.append(", ".join(facts))
    if doc["sets"]:
        lines.append("--set " + ", ".join(f"{k}={json.dumps(v)}" for k, v in doc["sets"].items()))
    return lines


def _footer(doc: Mapping[str, Any]) -> list[str]:
    lines = []
    nope = doc["nope_layers"]
    if nope:
        total = f" of {nope['of']}" if nope.get("of") else ""
        lines.append(
            f"NoPE layers ({len(nope['layers'])}{total}): {_ranges(nope['layers'], 16)}; "
            f"from {nope['from']}"
        )
    else:
        lines.append("NoPE layers: none (every layer rotates)")
    lines += [f"note: {n}" for n in doc["notes"]]
    return lines


def print_description(
    doc: Mapping[str, Any], readings: list[Reading], out: IO[str] | None = None
) -> None:
    """Print the reading: rich tables when rich is importable, else aligned text."""
    out = sys.stdout if out is None else out
    tables = []
    for r in readings:
        rows = [(row.name, row.display(), row.source) for row in r.rows] + _extra_rows(r)
        tables.append((_title(r, doc), rows))
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print("\n".join(_header(doc)), file=out)
        for title, rows in tables:
            print(f"\n{title}", file=out)
            widths = [max(len(row[c]) for row in rows) for c in range(2)]
            for name, value, source in rows:
                print(f"  {name.ljust(widths[0])}  {value.ljust(widths[1])}  {source}".rstrip(),
                      file=out)  # fmt: skip
        print("", file=out)
        print("\n".join(_footer(doc)), file=out)
        return
    console = Console(file=out, width=max(120, _width()), highlight=False, soft_wrap=False)
    console.print("\n".join(_header(doc)), markup=False)
    for title, rows in tables:
        table = Table(title=title, title_justify="left")
        for head in ("setting", "value", "from"):
            table.add_column(head, overflow="fold")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    console.print("\n".join(_footer(doc)), markup=False)


def _width() -> int:
    return shutil.get_terminal_size((0, 0)).columns


# --------------------------------------------------------------------------------------
# Golden tables.


def _tables(
    spec: RopeSpec, positions: npt.NDArray[np.int64], layout: str, freqs: RopeFrequencies
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    import torch

    from posenc.families.rotary.tables import cos_sin

    c, s = cos_sin(torch.as_tensor(positions), freqs, layout=layout, dtype=torch.float64)  # type: ignore[arg-type]
    return c.numpy(), s.numpy()


def _seq_len(positions: npt.NDArray[np.int64]) -> int:
    return int(positions.max()) + 1  # HF's value: max(position_ids) + 1


def write_golden(
    readings: list[Reading], out: str | Path, positions: npt.NDArray[np.int64]
) -> dict[str, Any]:
    """Write posenc's exact tables to ``out`` (``.npz``), atomically; return a summary.

    Per RoPE (names prefixed ``<layer_type>/`` for per-type RoPE): ``inv_freq``
    (float64, at ``seq_len = max(positions) + 1``), ``positions`` (int64), ``cos``,
    ``sin`` (float64, ``(len(positions), rotary_dim)``, half layout, times the
    attention scaling), ``cos_interleaved``, ``sin_interleaved`` and
    ``attention_scaling`` (a float64 scalar).

    Raises:
        ValueError: ``out`` does not end in ``.npz``, or the tables are too large.
        OSError: ``out`` cannot be written.
    """
    path = Path(out)
    if path.suffix.lower() != ".npz":
        raise ValueError(f"--golden must end in .npz; got {str(out)!r}")
    total = sum(4 * positions.size * r.spec.rotary_dim for r in readings)
    checks.check_elements(total, f"--golden tables of {positions.size} positions")
    arrays: dict[str, npt.NDArray[Any]] = {}
    for r in readings:
        pre = f"{r.layer_type}/" if r.layer_type else ""
        freqs = r.spec.frequencies(seq_len=_seq_len(positions))
        c, s = _tables(r.spec, positions, "half", freqs)
        ci, si = _tables(r.spec, positions, "interleaved", freqs)
        arrays.update({
            f"{pre}inv_freq": freqs.inv_freq.astype(np.float64),
            f"{pre}positions": positions.astype(np.int64),
            f"{pre}cos": c, f"{pre}sin": s,
            f"{pre}cos_interleaved": ci, f"{pre}sin_interleaved": si,
            f"{pre}attention_scaling": np.float64(freqs.attention_scaling),
        })  # fmt: skip
    with atomic_write(path) as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    return {
        "file": str(path),
        "arrays": sorted(arrays),
        "positions": {"count": int(positions.size), "first": int(positions[0]),
                      "last": int(positions[-1])},
    }  # fmt: skip


# --------------------------------------------------------------------------------------
# Comparing another engine's tables.


@dataclass
class Verdict:
    """One comparison: ``agree``, and if not, where, by how much and the likely cause."""

    what: str
    layer_type: str | None
    agree: bool
    summary: str
    layout: str | None = None
    first: dict[str, Any] | None = None
    cause: str | None = None
    score: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "layer_type": self.layer_type,
            "agree": self.agree,
            "summary": self.summary,
            "layout": self.layout,
            "first_divergence": self.first,
            "cause": self.cause,
        }


def _unit_roundoff(dtype: np.dtype[Any]) -> float:
    if dtype not in _UNIT_ROUNDOFF:
        raise ValueError(f"arrays must be float16, float32 or float64; got {dtype}")
    return _UNIT_ROUNDOFF[dtype]


def _factor(spec: RopeSpec) -> float:
    factor = spec.params.get("factor")
    return float(factor) if isinstance(factor, (int, float)) and factor > 1 else 1.0


def _frequency_rtol(spec: RopeSpec, u: float) -> float:
    """Relative error of frequencies computed with unit roundoff ``u``.

    The bound posenc.hf checks HF's float32 ``inv_freq`` with, at any precision: the
    exponent's rounding costs ``ln(base)`` ulps, the power and divisions a few more,
    and the blends of yarn and llama3 amplify the ramp's rounding up to ``factor``.
    """
    return (4 + abs(math.log(spec.base)) + _factor(spec)) * 2 * u


def _value_tolerance(
    spec: RopeSpec, scale: float, angle: npt.NDArray[np.float64], u: float
) -> npt.NDArray[np.float64]:
    """Allowed ``|theirs - posenc|`` of a table value whose exact angle is ``angle``.

    ``scale * (4 u + 2**-49 + |angle| * rho64)``: their dtype's rounding of cos, sin
    and the product with the scaling (``u``, 4 ulps), posenc's own error, and what
    float64 frequencies and a float64 product ``position * omega`` cost
    (``rho64``, :func:`_frequency_rtol` at float64 plus the product's rounding).
    """
    rho64 = _frequency_rtol(spec, 2.0**-53) + 2.0**-52
    return abs(scale) * (4 * u + _POSENC_ERROR + np.abs(angle) * rho64)


def _channel_pairs(channels: int, pairs: int, layout: str) -> npt.NDArray[np.int64]:
    """The frequency index of each channel in ``layout`` (``"pair"``: one channel per pair)."""
    idx = np.arange(channels)
    if layout == "half":
        return idx % pairs
    if layout == "interleaved":
        return idx // 2
    return idx


@dataclass
class _Theirs:
    """One group of arrays of the file (one layer type, or unprefixed)."""

    prefix: str
    inv_freq: npt.NDArray[Any] | None = None
    positions: npt.NDArray[np.int64] | None = None
    tables: dict[str, tuple[npt.NDArray[Any], npt.NDArray[Any]]] = field(default_factory=dict)


def _load_theirs(path: Path) -> dict[str, _Theirs]:
    """The arrays of ``path`` grouped by ``<layer_type>/`` prefix ('' for none)."""
    if not path.exists():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    if path.is_file() and not zipfile.is_zipfile(path):
        raise ValueError(f"--compare {str(path)!r}: not a .npz file (numpy's zip of arrays)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (ValueError, zipfile.BadZipFile, EOFError, KeyError) as exc:
        raise ValueError(
            f"--compare {str(path)!r}: not a .npz file numpy can read ({exc})"
        ) from None
    if not isinstance(arrays, dict) or not arrays:
        raise ValueError(f"--compare {str(path)!r}: no arrays")
    groups: dict[str, _Theirs] = {}
    for name, array in arrays.items():
        prefix, _, base = name.rpartition("/")
        g = groups.setdefault(prefix, _Theirs(prefix))
        if base == "inv_freq":
            g.inv_freq = _float_array(array, name, path, ndim=1)
        elif base == "positions":
            g.positions = _position_array(array, name, path)
    for prefix, g in groups.items():
        pre = f"{prefix}/" if prefix else ""
        names = {"auto": ("cos", "sin"), "interleaved": ("cos_interleaved", "sin_interleaved")}
        for layout, (cn, sn) in names.items():
            have = [n for n in (cn, sn) if pre + n in arrays]
            if len(have) == 1:
                raise ValueError(f"--compare {str(path)!r}: {pre}{have[0]} without its partner "
                                 f"({pre}{cn} and {pre}{sn} go together)")  # fmt: skip
            if have:
                c = _float_array(arrays[pre + cn], pre + cn, path, ndim=2)
                s = _float_array(arrays[pre + sn], pre + sn, path, ndim=2)
                if c.shape != s.shape:
                    raise ValueError(f"--compare {str(path)!r}: {pre}{cn} has shape {c.shape}, "
                                     f"{pre}{sn} {s.shape}")  # fmt: skip
                g.tables[layout] = (c, s)
        rows = {t[0].shape[0] for t in g.tables.values()}
        if len(rows) > 1:
            raise ValueError(f"--compare {str(path)!r}: {pre}cos tables of different lengths")
        if g.positions is not None and rows and g.positions.size not in rows:
            raise ValueError(
                f"--compare {str(path)!r}: {pre}positions has {g.positions.size} entries, "
                f"the tables {rows.pop()} rows"
            )
        if g.positions is None and rows:
            g.positions = np.arange(rows.pop(), dtype=np.int64)
    groups = {p: g for p, g in groups.items() if g.inv_freq is not None or g.tables}
    if not groups:
        raise ValueError(
            f"--compare {str(path)!r}: needs inv_freq, or cos and sin (with positions, "
            f"default 0..n-1); it has {', '.join(sorted(arrays))}"
        )
    return groups


def _float_array(array: npt.NDArray[Any], name: str, path: Path, ndim: int) -> npt.NDArray[Any]:
    where = f"--compare {str(path)!r}: {name}"
    if array.dtype not in _UNIT_ROUNDOFF:
        raise ValueError(f"{where} must be float16, float32 or float64; got {array.dtype}")
    if array.ndim != ndim or array.size == 0:
        raise ValueError(f"{where} must be a non-empty {ndim}-D array; got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{where} holds NaN or infinite values")
    return array


def _position_array(array: npt.NDArray[Any], name: str, path: Path) -> npt.NDArray[np.int64]:
    where = f"--compare {str(path)!r}: {name}"
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{where} must be a non-empty 1-D array; got shape {array.shape}")
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
            raise ValueError(f"{where} must hold whole numbers")
    elif array.dtype.kind not in "iu":
        raise ValueError(f"{where} must be ints; got {array.dtype}")
    if array.min() < 0 or array.max() > MAX_POSITION:
        raise ValueError(f"{where} must lie in 0 .. 2**31 - 1")
    return array.astype(np.int64)


def compare(
    readings: list[Reading],
    path: str | Path,
    *,
    layout: str | None = None,
    layer_type: str | None = None,
) -> list[Verdict]:
    """Compare the tables in ``path`` with posenc's; one verdict per array group and RoPE.

    Args:
        readings: the config's RoPEs (:func:`read`).
        path: an ``.npz`` with ``inv_freq`` and/or ``cos`` + ``sin`` (+ ``positions``),
            names optionally prefixed ``<layer_type>/``.
        layout: the layout of their ``cos``/``sin``; ``None`` detects it.
        layer_type: which RoPE unprefixed arrays belong to; ``None`` tries each.

    Raises:
        ValueError: a file that is not such an ``.npz``, an unknown layer type.
        OSError: the file cannot be read.
    """
    by_type = {r.layer_type: r for r in readings}
    if layer_type is not None and layer_type not in by_type:
        known = ", ".join(str(k) for k in by_type)
        raise ValueError(f"--layer-type {layer_type!r}: this config's RoPEs: {known}")
    groups = _load_theirs(Path(path))
    verdicts: list[Verdict] = []
    for prefix, theirs in groups.items():
        if prefix:
            if prefix not in by_type:
                known = ", ".join(str(k) for k in by_type if k) or "none (one RoPE)"
                raise ValueError(
                    f"--compare {str(path)!r}: arrays prefixed {prefix!r}/, but this config's "
                    f"layer types are: {known}"
                )
            candidates = [by_type[prefix]]
        elif layer_type is not None:
            candidates = [by_type[layer_type]]
        else:
            candidates = readings
        options = [_compare_group(theirs, r, layout) for r in candidates]
        # the layer type the unprefixed arrays agree with, else the closest one
        best = min(options, key=lambda vs: (not all(v.agree for v in vs), sum(v.score for v in vs)))
        if len(candidates) > 1:
            agree = all(v.agree for v in best)
            for v in best:
                v.summary += f" ({'matches' if agree else 'closest'} layer type: {v.layer_type})"
        verdicts += best
    return verdicts


def _compare_group(theirs: _Theirs, r: Reading, layout: str | None) -> list[Verdict]:
    out = []
    seq_len = _seq_len(theirs.positions) if theirs.positions is not None else None
    if theirs.inv_freq is not None:
        out.append(_compare_inv_freq(theirs.inv_freq, r, seq_len))
    for kind, (c, s) in theirs.tables.items():
        assert theirs.positions is not None
        forced = "interleaved" if kind == "interleaved" else layout
        name = "cos/sin" if kind == "auto" else "cos_interleaved/sin_interleaved"
        out.append(_compare_tables(name, c, s, theirs.positions, r, forced))
    return out


# -- inv_freq


@dataclass
class _Candidate:
    """A known misreading: how it changes the frequencies (and tables), and its explanation."""

    cause: str
    freqs: Callable[[], RopeFrequencies | None]
    layout: str | None = None
    scale: float | None = None
    float32: bool = False


def _frequencies(omega: Sequence[float], scaling: float = 1.0) -> RopeFrequencies:
    return RopeFrequencies(tuple(decimal.Decimal(float(w)) for w in omega), scaling)


def _base_candidates(r: Reading, ratio: float | None, seq_len: int | None) -> list[_Candidate]:
    """The misreadings of the frequencies, most specific first."""
    spec = r.spec
    out = []
    if spec.rope_type != "default":
        default = dataclasses.replace(spec, rope_type="default", params={})
        out.append(_Candidate(
            f"the {spec.rope_type} scaling was not applied: their frequencies are the unscaled "
            f"default (base {_show(spec.base)})", lambda: default.frequencies(), scale=1.0,
        ))  # fmt: skip
    if spec.rope_type == "linear":
        f = float(spec.params["factor"])
        twice = dataclasses.replace(spec, params={"factor": f * f})
        out.append(_Candidate(
            f"the linear factor {_show(f)} was applied twice (their frequencies are "
            f"omega / {_show(f * f)})", lambda: twice.frequencies(seq_len=seq_len),
        ))  # fmt: skip
    if spec.rope_type == "longrope":
        original = spec.original_max_position_embeddings or 1
        other = original + 1 if (seq_len or 0) <= original else original
        which = "long" if other > original else "short"
        out.append(_Candidate(
            f"LongRoPE's {which}_factor: their frequencies are those of seq_len {other} "
            f"(posenc uses seq_len {seq_len or 'None'} = max position + 1)",
            lambda: spec.frequencies(seq_len=other),
        ))  # fmt: skip
    if spec.partial_rotary_factor < 1 and spec.rope_type == "default":
        head = spec.head_dim
        omega = [spec.base ** (-2 * k / head) for k in range(spec.rotary_dim // 2)]
        out.append(_Candidate(
            f"the exponent over head_dim {head} instead of the rotary dim {spec.rotary_dim}: "
            "omega_k = base ** (-2k / head_dim)", lambda: _frequencies(omega),
        ))  # fmt: skip
    if ratio is not None and ratio > 0 and spec.rotary_dim >= 4:
        estimate = ratio ** (-spec.rotary_dim / 2)
        if math.isfinite(estimate) and not math.isclose(estimate, spec.base, rel_tol=1e-9):
            for digits in (*range(1, 10), None):
                b = estimate if digits is None else float(f"{estimate:.{digits}g}")
                if b <= 1 or math.isclose(b, spec.base, rel_tol=1e-12):
                    continue
                other_spec = dataclasses.replace(spec, base=b)
                out.append(_Candidate(
                    f"a wrong base: their frequencies fit base {_show(b)} (posenc reads base "
                    f"{_show(spec.base)} from {r.rows[1].source})",
                    functools.partial(_safe_frequencies, other_spec, seq_len),
                ))  # fmt: skip
    return out


def _safe_frequencies(spec: RopeSpec, seq_len: int | None) -> RopeFrequencies | None:
    try:
        return spec.frequencies(seq_len=seq_len)
    except (ValueError, TypeError):
        return None


def _compare_inv_freq(theirs: npt.NDArray[Any], r: Reading, seq_len: int | None) -> Verdict:
    spec = r.spec
    ours = spec.frequencies(seq_len=seq_len).inv_freq
    u = _unit_roundoff(theirs.dtype)
    rtol = _frequency_rtol(spec, u)
    t = theirs.astype(np.float64)
    lt = r.layer_type
    if t.size != ours.size:
        cause = None
        if spec.partial_rotary_factor < 1 and t.size == spec.head_dim // 2:
            cause = (f"the partial_rotary_factor {_show(spec.partial_rotary_factor)} was ignored: "
                     f"{t.size} frequencies = head_dim / 2")  # fmt: skip
        elif t.size == spec.rotary_dim:
            cause = "their inv_freq holds rotary_dim values (one per channel), not one per pair"
        return Verdict("inv_freq", lt, False,
                       f"inv_freq: {t.size} frequencies, posenc has rotary_dim / 2 = {ours.size}",
                       cause=cause, score=math.inf)  # fmt: skip
    rel = np.abs(t - ours) / np.maximum(np.abs(ours), np.finfo(np.float64).tiny)
    rel = np.where(ours == 0, np.abs(t), rel)  # proportional's unrotated pairs: exactly 0
    bad = np.flatnonzero(rel > rtol)
    worst = int(np.argmax(rel))
    score = float(rel[worst] / rtol)
    if bad.size == 0:
        return Verdict("inv_freq", lt, True,
                       f"inv_freq: agree ({ours.size} frequencies; max relative difference "
                       f"{rel[worst]:.2g}, tolerance {rtol:.2g} for {theirs.dtype})",
                       score=score)  # fmt: skip
    k = int(bad[0])
    first = {"pair": k, "theirs": float(t[k]), "posenc": float(ours[k]),
             "relative_difference": float(rel[k]), "tolerance": rtol}  # fmt: skip
    ratio = float(t[1] / t[0]) if t.size > 1 and t[0] > 0 else None
    cause = None
    for cand in _base_candidates(r, ratio, seq_len):
        f = cand.freqs()
        if f is not None and np.all(np.abs(t - f.inv_freq) <= rtol * np.abs(f.inv_freq) + 0):
            cause = cand.cause
            break
    if cause is None and theirs.dtype == np.float64:
        as32 = t.astype(np.float32).astype(np.float64)
        if np.array_equal(as32, t) and np.all(rel <= _frequency_rtol(spec, 2.0**-24)):
            cause = "float32 frequencies stored as float64 (each value is a float32)"
    if cause is None and spec.rotary_dim >= 4 and ratio:
        estimate = ratio ** (-spec.rotary_dim / 2)
        cause = (f"no known misreading matches; their inv_freq[1] / inv_freq[0] implies "
                 f"base {estimate:.6g} (posenc: {_show(spec.base)})")  # fmt: skip
    summary = (f"inv_freq: DIVERGE from pair {k}: theirs {t[k]:.17g}, posenc {ours[k]:.17g} "
               f"(relative difference {rel[k]:.3g} > tolerance {rtol:.2g}); "
               f"{bad.size} of {ours.size} pairs differ")  # fmt: skip
    return Verdict("inv_freq", lt, False, summary, first=first, cause=cause, score=score)


# -- cos and sin


def _compare_tables(
    name: str,
    cos: npt.NDArray[Any],
    sin: npt.NDArray[Any],
    positions: npt.NDArray[np.int64],
    r: Reading,
    layout: str | None,
) -> Verdict:
    spec = r.spec
    lt = r.layer_type
    rows, channels = cos.shape
    checks.check_elements(8 * rows * channels, f"--compare tables of {rows} x {channels}")
    pairs = spec.rotary_dim // 2
    u = _unit_roundoff(np.result_type(cos.dtype, sin.dtype))
    seq_len = _seq_len(positions)
    freqs = spec.frequencies(seq_len=seq_len)
    tc, ts = cos.astype(np.float64), sin.astype(np.float64)
    if channels == pairs and spec.rotary_dim != 2:
        layouts = ["pair"]  # one value per pair: no layout
    elif channels == spec.rotary_dim:
        layouts = [layout] if layout else ["half", "interleaved"]
    else:
        cause = None
        if spec.partial_rotary_factor < 1 and channels == spec.head_dim:
            cause = (f"the partial_rotary_factor {_show(spec.partial_rotary_factor)} was ignored: "
                     f"their tables have head_dim = {channels} channels")  # fmt: skip
        return Verdict(name, lt, False,
                       f"{name}: {channels} channels, posenc's rotary dim is {spec.rotary_dim}",
                       cause=cause, score=math.inf)  # fmt: skip

    # exact pair values once; each layout is a re-indexing of them
    pc, ps = _tables(spec, positions, "half", freqs)
    pc, ps = pc[:, :pairs], ps[:, :pairs]
    omega = freqs.inv_freq
    angle_pairs = positions.astype(np.float64)[:, None] * omega[None, :]

    def evaluate(lay: str, c_p: Any, s_p: Any, tol_pairs: Any) -> dict[str, Any]:
        idx = _channel_pairs(channels, pairs, lay)
        dc, ds = np.abs(tc - c_p[:, idx]), np.abs(ts - s_p[:, idx])
        tol = tol_pairs[:, idx]
        over = (dc > tol) | (ds > tol)
        worst = float(np.max(np.maximum(dc, ds) / tol))
        return {
            "layout": lay,
            "over": over,
            "dc": dc,
            "ds": ds,
            "idx": idx,
            "tol": tol,
            "worst": worst,
            "count": int(over.sum()),
        }

    scale = freqs.attention_scaling
    tol_ours = _value_tolerance(spec, scale, angle_pairs, u)
    results = [evaluate(lay, pc, ps, tol_ours) for lay in layouts]
    best = min(results, key=lambda e: (e["count"], e["worst"]))
    where = f"{rows} positions {_show(int(positions[0]))}..{_show(int(positions[-1]))}"
    lay = best["layout"]
    lay_text = {"pair": "one value per pair", "half": "half layout",
                "interleaved": "interleaved layout"}[lay]  # fmt: skip
    if layout is None and len(layouts) == 2 and lay == "interleaved" and best["count"] == 0:
        lay_text += " (detected: theirs match posenc's interleaved, GPT-J/Meta tables)"
    elif layout is None and len(layouts) == 2 and best["count"] == 0:
        lay_text += " (detected)"
    if best["count"] == 0:
        return Verdict(name, lt, True,
                       f"{name}: agree ({lay_text}, {where}; max |difference| / tolerance "
                       f"{best['worst']:.2g}, tolerance for {cos.dtype})",
                       layout=lay, score=best["worst"])  # fmt: skip

    row, ch = (int(v) for v in np.argwhere(best["over"])[0])
    which = "cos" if best["dc"][row, ch] > best["tol"][row, ch] else "sin"
    theirs_v = (tc if which == "cos" else ts)[row, ch]
    ours_v = (pc if which == "cos" else ps)[row, best["idx"][ch]]
    first = {"row": row, "position": int(positions[row]), "channel": ch, "table": which,
             "theirs": float(theirs_v), "posenc": float(ours_v),
             "difference": float(abs(theirs_v - ours_v)),
             "tolerance": float(best["tol"][row, ch])}  # fmt: skip
    diff_max = np.maximum(best["dc"], best["ds"])
    mr, mc = (int(v) for v in np.unravel_index(int(np.argmax(diff_max)), diff_max.shape))
    summary = (
        f"{name}: DIVERGE ({lay_text}, {where}): first at position {first['position']} "
        f"(row {row}), channel {ch} of {which}: theirs {theirs_v:.17g}, posenc {ours_v:.17g}, "
        f"|difference| {first['difference']:.3g} > tolerance {first['tolerance']:.2g}; "
        f"largest {diff_max[mr, mc]:.3g} at position {int(positions[mr])}, channel {mc}; "
        f"{best['count']} of {rows * channels} values differ"
    )

    # the known misreadings, each checked by recomputing their tables
    cause = None
    other = {"half": "interleaved", "interleaved": "half"}.get(lay)
    candidates: list[_Candidate] = []
    if layout is not None and other is not None:
        pairing = (
            "GPT-J/Meta pairs (2i, 2i + 1)" if other == "interleaved" else "HF pairs (i, i + d/2)"
        )
        candidates.append(_Candidate(
            f"the {other} layout: theirs match posenc's {other} tables ({pairing}), "
            f"not the {lay} layout asked for", lambda: freqs, layout=other,
        ))  # fmt: skip
    if scale != 1.0:
        candidates.append(_Candidate(
            f"a missing attention factor: their values = posenc's / attention scaling "
            f"{scale:.6g} ({r.scaling.source})", lambda: freqs, scale=1.0,
        ))  # fmt: skip
        candidates.append(_Candidate(
            f"the attention factor applied twice: their values = posenc's x {scale:.6g}",
            lambda: freqs, scale=scale * scale,
        ))  # fmt: skip
    candidates.append(_Candidate(
        "float32 angles: their differences grow as position x omega x 2**-24 (largest "
        f"{diff_max[mr, mc]:.3g} at position {int(positions[mr])}); they match HF's float32 "
        "arithmetic (positions.float()[:, None] * inv_freq in float32); compute the angle "
        "in float64 or exactly (posenc.Rotary, posenc.families.rotary.tables.cos_sin)",
        lambda: freqs, float32=True,
    ))  # fmt: skip
    ratio = _angle_ratio(tc, ts, positions, lay, pairs, omega)
    candidates += _base_candidates(r, ratio, seq_len)
    for cand in candidates:
        if _matches(cand, spec, positions, channels, pairs, lay, scale, u, tc, ts):
            cause = cand.cause
            break
    if cause is None and ratio and spec.rotary_dim >= 4:
        estimate = ratio ** (-spec.rotary_dim / 2)
        if not math.isclose(estimate, spec.base, rel_tol=1e-3):
            cause = (
                "no known misreading matches exactly; their angles at the first positive "
                f"position imply base {estimate:.6g} (posenc: {_show(spec.base)})"
            )
    return Verdict(name, lt, False, summary, layout=lay, first=first, cause=cause,
                   score=best["worst"])  # fmt: skip


def _angle_ratio(
    tc: Any, ts: Any, positions: Any, lay: str, pairs: int, omega: Any
) -> float | None:
    """``omega_1 / omega_0`` read from their table at the first positive position, if unwrapped."""
    if pairs < 2:
        return None
    positive = np.flatnonzero(positions > 0)
    if positive.size == 0:
        return None
    row = int(positive[0])
    p = float(positions[row])
    if p * omega[0] > 2.5:  # their angle could have wrapped past pi
        return None
    ch = {"half": (0, 1), "interleaved": (0, 2), "pair": (0, 1)}[lay]
    a0 = math.atan2(ts[row, ch[0]], tc[row, ch[0]])
    a1 = math.atan2(ts[row, ch[1]], tc[row, ch[1]])
    if a0 <= 0 or a1 <= 0:
        return None
    return a1 / a0


def _matches(
    cand: _Candidate,
    spec: RopeSpec,
    positions: npt.NDArray[np.int64],
    channels: int,
    pairs: int,
    lay: str,
    scale: float,
    u: float,
    tc: npt.NDArray[np.float64],
    ts: npt.NDArray[np.float64],
) -> bool:
    """Whether their tables equal the candidate's within the tolerance."""
    freqs = cand.freqs()
    if freqs is None or len(freqs.omega) != pairs:
        return False
    lay = cand.layout or lay
    s = scale if cand.scale is None else cand.scale
    omega = freqs.inv_freq
    idx = _channel_pairs(channels, pairs, lay)
    angle = np.abs(positions.astype(np.float64)[:, None] * omega[None, :])
    if cand.float32:
        # HF: inv_freq in float32 (within rho32 of exact), the product and cos/sin in float32
        a32 = positions.astype(np.float32)[:, None] * omega.astype(np.float32)[None, :]
        c_p = np.cos(a32).astype(np.float64) * s
        s_p = np.sin(a32).astype(np.float64) * s
        rho32 = _frequency_rtol(spec, 2.0**-24) + 2.0**-23
        tol = abs(s) * (4 * u + 8 * 2.0**-24 + angle * rho32)
    else:
        c_p, s_p = _tables(spec, positions, "half", freqs)
        c_p, s_p = c_p[:, :pairs], s_p[:, :pairs]
        if s != freqs.attention_scaling:
            ratio = s / freqs.attention_scaling
            c_p, s_p = c_p * ratio, s_p * ratio
        tol = _value_tolerance(spec, s, angle, u)
    c_p, s_p, tol = c_p[:, idx], s_p[:, idx], tol[:, idx]
    return bool(np.all(np.abs(tc - c_p) <= tol) and np.all(np.abs(ts - s_p) <= tol))


# --------------------------------------------------------------------------------------
# The command.


def run(
    config: str,
    *,
    sets: Sequence[str] = (),
    as_json: bool = False,
    golden: str | None = None,
    positions: str | None = None,
    compare_file: str | None = None,
    layout: str | None = None,
    layer_type: str | None = None,
    out: IO[str] | None = None,
) -> int:
    """Run ``posenc rope``: print the reading; write or compare tables when asked.

    Returns:
        0, or 1 when ``compare_file`` diverges from posenc's tables.

    Raises:
        ValueError: bad input (reported by the command as one line, exit status 2).
        OSError: a file that cannot be read or written.
    """
    out = sys.stdout if out is None else out
    if positions is not None and golden is None:
        raise ValueError("--positions goes with --golden (--compare reads the file's positions)")
    if golden is not None and positions is None:
        raise ValueError("--golden needs --positions (e.g. 0:4096, 0:131072:1024, 0,1,100000)")
    if layout is not None and compare_file is None:
        raise ValueError("--layout goes with --compare")
    if layer_type is not None and compare_file is None:
        raise ValueError("--layer-type goes with --compare")
    if layout is not None:
        checks.check_choice(layout, "--layout", ("half", "interleaved"))
    pos = parse_positions(positions) if positions is not None else None
    loaded = load_config(config, sets)
    readings = read(loaded)
    doc = describe(loaded, readings)
    status = 0
    if golden is not None:
        assert pos is not None
        doc["golden"] = write_golden(readings, golden, pos)
    verdicts: list[Verdict] = []
    if compare_file is not None:
        verdicts = compare(readings, compare_file, layout=layout, layer_type=layer_type)
        status = 0 if all(v.agree for v in verdicts) else 1
        doc["compare"] = {
            "file": str(compare_file),
            "agree": status == 0,
            "results": [v.as_json() for v in verdicts],
        }
    if as_json:
        print(json.dumps(doc, indent=2, default=_json_default), file=out)
        return status
    print_description(doc, readings, out)
    if golden is not None:
        g = doc["golden"]
        p = g["positions"]
        if any(r.mrope for r in readings):
            print("M-RoPE: the tables are for text positions (all three axes equal)", file=out)
        print(
            f"wrote {g['file']}: {len(g['arrays'])} arrays ({', '.join(ARRAYS)}, attention_scaling"
            f"{' per layer type' if doc['per_layer_type'] else ''}), {p['count']} positions "
            f"{p['first']}..{p['last']}, float64",
            file=out,
        )
    if verdicts:
        print(f"compare {compare_file}:", file=out)
        for v in verdicts:
            label = f"[{v.layer_type}] " if v.layer_type else ""
            print(f"  {label}{v.summary}", file=out)
            if v.cause:
                print(f"    likely cause: {v.cause}", file=out)
        print("agree" if status == 0 else "DIVERGE", file=out)
    return status


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
