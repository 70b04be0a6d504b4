"""The ``posenc rope`` command: how posenc reads a model's RoPE configuration.

``posenc rope CONFIG`` reads a ``config.json`` (or a directory holding one, or a
transformers config class instantiated with its defaults) with
:func:`posenc.families.rotary.config.rope_spec`, and prints, per layer type, every
setting the rotary embedding depends on with the config key it came from: rope
type, base, head and rotary dims, layout, the schedule's parameters (given,
derived from another attribute, or the schedule's default), the attention
scaling, and the wavelengths against the trained window. NoPE layers and M-RoPE
sections are listed when the config has them, and what the layers do with positions
besides RoPE (Llama 4's temperature tuning, chunked attention and QK norm; Cohere 2's
sliding windows), each with its key and its layers. For a ``config.json`` whose
``model_type`` transformers knows, the reading is checked against the one of
transformers' own config class, and any difference is printed.

``--golden FILE.npz`` writes posenc's exact tables (``inv_freq``, ``cos``,
``sin`` in the half and the interleaved layouts, in float64) for checking another
engine; ``--compare FILE.npz`` checks another engine's tables against posenc's and
names the likely misreading when they diverge (layout, a missing attention factor,
float32 angles, a scaling not applied or applied twice, a wrong base).
``--engines mlx`` runs another engine's own code on the config, in that engine's own
Python (:mod:`posenc.integration.analysis.engines`), and compares its tables with
transformers' reading: same, different (where, by how much), refused (its error) or
not installed.

This module parses the command line, loads the config (``--set`` included), reads
and writes the files and prints; the reading is measured by
:mod:`posenc.integration.analysis.rope_reading`, the tables and the comparison
(with its tolerances) by :mod:`posenc.integration.analysis.rope_compare`.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
import shutil
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from posenc.core import checks
from posenc.core.files import atomic_write
from posenc.families.rotary.config import setting
from posenc.families.rotary.schedules import STRETCH
from posenc.integration.analysis.engines import (
    EngineResult,
    parse_engine_python,
    parse_engines,
    run_engines,
)
from posenc.integration.analysis.engines import table as engine_table
from posenc.integration.analysis.rope_compare import (
    MAX_POSITION,
    Verdict,
    compare,
    golden_tables,
)
from posenc.integration.analysis.rope_reading import (
    Loaded,
    Reading,
    describe,
    nested_dict,
    one_line,
    quiet,
    ranges,
    read,
    rewrite_mrope_type,
    show,
    softmax_scale,
)

#: Names of the arrays of a golden file (each prefixed ``<layer_type>/`` for per-type RoPE).
ARRAYS = ("inv_freq", "positions", "cos", "sin", "cos_interleaved", "sin_interleaved")


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
    rewrite_mrope_type(loaded)
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


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ValueError(
            "a config class name needs transformers (pip install 'posenc[hf]'); "
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
    with quiet():
        try:
            default = cls()
        except Exception as exc:
            raise ValueError(f"{name}() fails with its defaults: {one_line(exc)}") from None
        kwargs = _class_kwargs(name, default, sets)
        try:
            config = cls(**kwargs)
        except Exception as exc:
            raise ValueError(f"{name}(**--set values) fails: {one_line(exc)}") from None
    notes = _apply_after(config, sets)
    label = f"{name}() (transformers {transformers.__version__} defaults)"
    return Loaded(config, label, "class", [(".".join(k), v) for k, v in sets], notes)


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
        if key in kwargs and isinstance(params, dict) and not nested_dict(params):
            params[key] = kwargs.pop(key)
    return kwargs


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
# Printing.


def _title(r: Reading, doc: Mapping[str, Any]) -> str:
    name = f"RoPE of {r.layer_type} layers" if r.layer_type else "RoPE"
    total = doc["num_hidden_layers"]
    if r.layer_type is None and r.layers is not None and len(r.layers) == total:
        name += f" (all {total} layers)"
    elif r.layers is not None:
        name += f" ({len(r.layers)} of {total or len(r.layers)} layers: {ranges(r.layers)})"
    elif r.layer_type is None:
        name += " (all layers)"
    return name


def _extra_rows(r: Reading) -> list[tuple[str, str, str]]:
    w = r.wavelengths
    rows = []
    if w["shortest"] is not None:
        rows.append((
            "wavelengths",
            f"{show(w['shortest'])} .. {show(w['longest'])}",
            f"2 pi / omega in positions, pairs {w['shortest_pair']} .. {w['longest_pair']}",
        ))  # fmt: skip
    if w["rotating_pairs"] < w["pairs"]:
        rows.append(("not rotating", f"{w['pairs'] - w['rotating_pairs']} pairs", "omega = 0"))
    if w["window"] is not None:
        rows.append(("trained window", show(w["window"]), w["window_from"]))
        rows.append((
            "full turns in window",
            f"{w['full_turn_pairs']} of {w['pairs']} pairs",
            f"pairs with wavelength <= {show(w['window'])}",
        ))  # fmt: skip
    if "max_position_embeddings" in w:
        rows.append((
            "full turns in max_pos",
            f"{w['full_turn_pairs_max']} of {w['pairs']} pairs",
            f"wavelength <= max_position_embeddings ({show(w['max_position_embeddings'])})",
        ))  # fmt: skip
    if "note" in w:
        rows.append(("frequencies shown", "at seq_len <= window", w["note"]))
    if r.mrope:
        m = r.mrope
        rows.append(("mrope_section", show(m["section"]), m["from"]))
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
            f"NoPE layers ({len(nope['layers'])}{total}): {ranges(nope['layers'], 16)}; "
            f"from {nope['from']}"
        )
    else:
        lines.append("NoPE layers: none (every layer rotates)")
    for s in doc.get("layer_settings", ()):
        where = "" if s["layers"] is None else f" (layers {ranges(s['layers'], 16) or 'none'})"
        lines.append(f"{s['setting']} = {show(s['value'])}{where}: {s['means']}; from {s['from']}")
    lines += [f"note: {n}" for n in doc["notes"]]
    if any(r["rope_type"]["value"] in STRETCH for r in doc["ropes"]):
        # a context-extension schedule: where they are compared on one trained model
        lines.append('every schedule compared: how-to "Choose a context-extension schedule"')
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


def _softmax_scale(loaded: Loaded) -> float | None:
    """transformers' factor on ``q . k`` for the config (``None`` without transformers, or
    where it cannot build the model): what a port's attention must multiply by."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None or not isinstance(loaded.config, Mapping):
        return None
    return softmax_scale(loaded.config)[0]


def write_golden(
    readings: list[Reading],
    out: str | Path,
    positions: npt.NDArray[np.int64],
    softmax_scale: float | None = None,
) -> dict[str, Any]:
    """Write posenc's exact tables to ``out`` (``.npz``), atomically; return a summary.

    The arrays are those of :func:`~posenc.integration.analysis.rope_compare.golden_tables`
    (per RoPE, names prefixed ``<layer_type>/`` for per-type RoPE: ``inv_freq``,
    ``positions``, ``cos``, ``sin``, ``cos_interleaved``, ``sin_interleaved``,
    ``attention_scaling`` and, when given, ``softmax_scale``).

    Raises:
        ValueError: ``out`` does not end in ``.npz``, or the tables are too large.
        OSError: ``out`` cannot be written.
    """
    path = Path(out)
    if path.suffix.lower() != ".npz":
        raise ValueError(f"--golden must end in .npz; got {str(out)!r}")
    arrays = golden_tables(readings, positions, softmax_scale)
    with atomic_write(path) as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    return {
        "file": str(path),
        "arrays": sorted(arrays),
        "positions": {"count": int(positions.size), "first": int(positions[0]),
                      "last": int(positions[-1])},
    }  # fmt: skip


# --------------------------------------------------------------------------------------
# Comparing another engine's tables: their file.


def _load_theirs(path: Path) -> dict[str, npt.NDArray[Any]]:
    """The arrays of the ``.npz`` at ``path``, by name (checked by :func:`compare`)."""
    if not path.exists():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    if path.is_file() and not zipfile.is_zipfile(path):
        raise ValueError(f"--compare {str(path)!r}: not a .npz file (numpy's zip of arrays)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (ValueError, zipfile.BadZipFile, EOFError, KeyError) as exc:
        raise ValueError(
            f"--compare {str(path)!r}: not a .npz file numpy can read ({exc})"
        ) from None


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
    engines: str | None = None,
    engine_python: Sequence[str] = (),
    out: IO[str] | None = None,
) -> int:
    """Run ``posenc rope``: print the reading; write or compare tables when asked.

    Returns:
        0, or 1 when ``compare_file`` diverges from posenc's tables or an engine of
        ``engines`` reads the config differently, refuses it or gives no answer (an
        error, or not installed: what ``--help`` promises; the table says which).

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
    if engine_python and engines is None:
        raise ValueError("--engine-python goes with --engines")
    names = parse_engines(engines) if engines is not None else []
    pythons = parse_engine_python(engine_python)
    pos = parse_positions(positions) if positions is not None else None
    loaded = load_config(config, sets)
    readings = read(loaded)
    doc = describe(loaded, readings)
    status = 0
    if golden is not None:
        assert pos is not None
        doc["golden"] = write_golden(readings, golden, pos, _softmax_scale(loaded))
    verdicts: list[Verdict] = []
    if compare_file is not None:
        theirs = _load_theirs(Path(compare_file))
        verdicts = compare(
            readings,
            theirs,
            source=f"--compare {str(compare_file)!r}",
            layout=layout,
            layer_type=layer_type,
        )
        status = 0 if all(v.agree for v in verdicts) else 1
        doc["compare"] = {
            "file": str(compare_file),
            "agree": status == 0,
            "results": [v.as_json() for v in verdicts],
        }
    results: list[EngineResult] = []
    if names:
        results = run_engines(names, loaded.config, readings, pythons)
        doc["engines"] = {r.engine: r.as_json() for r in results}
        if any(r.verdict != "same" for r in results):  # an engine not installed answers nothing
            status = 1
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
            f"{', softmax_scale' if any(a.endswith('softmax_scale') for a in g['arrays']) else ''}"
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
        print("agree" if all(v.agree for v in verdicts) else "DIVERGE", file=out)
    if results:
        print("engines (each engine's own code, against transformers' reading):", file=out)
        print("\n".join("  " + line for line in engine_table(results)), file=out)
    return status


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
