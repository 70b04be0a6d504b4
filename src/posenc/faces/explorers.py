"""The report's interactive explorers: their data as JSON, and the HTML that hosts them.

The numbers come from :mod:`posenc.analysis` (``analysis.explorer``); this module
only packs them for the page: arrays as base64 of their little-endian bytes,
zlib-compressed when that is shorter (``{"dtype", "shape", "b64"}`` plus
``"deflate": true``; the browser inflates them with its own
``DecompressionStream``, nothing downloaded), the rest as plain JSON. The page embeds the data
in ``<script type="application/json" id="posenc-data">``, then d3
(``web/d3.min.js``, ISC licence, vendored so that the page works offline) and the
explorers' own script (``web/explorer.js``), which draws and selects but
computes no encoding.

Containers the script fills: ``#sinusoidal-explorer`` (d, base and position
controls, heatmap, the first values, clock hands), ``#timestep-explorer`` (a
continuous diffusion timestep through the three timestep presets, its
similarity to every other timestep), ``#rope-explorer`` (m, n, rotated q and
k, the score matrix), ``#extension-explorer`` (schedule, trained and target
length, wavelength per pair) and ``#bias-explorer`` (ALiBi's and a trained T5
table's bias per head over the keys of a query, and the attention weights
they alone give).
"""

from __future__ import annotations

import base64
import html
import json
import zlib
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from posenc.integration.analysis import explorer as data
from posenc.integration.analysis.bases import BASES

#: The page's static files (d3, the explorers' script and style), shipped with posenc.
WEB = resources.files("posenc.faces") / "web"

_DTYPES = {"float64": "<f8", "float32": "<f4", "uint8": "u1"}


def encode(array: Any, dtype: str = "float64") -> dict[str, Any]:
    """``array`` as ``{"dtype", "shape", "b64"}``: base64 of its little-endian bytes.

    Bytes that zlib shortens are stored compressed, with ``"deflate": true`` (a
    sinusoidal table's slow channels barely change: the page's arrays shrink by
    about half).
    """
    a = np.ascontiguousarray(np.asarray(array), dtype=_DTYPES[dtype])
    raw = a.tobytes()
    packed = zlib.compress(raw, 9)
    out: dict[str, Any] = {"dtype": dtype, "shape": list(a.shape)}
    if len(packed) < len(raw):
        out.update(b64=base64.b64encode(packed).decode(), deflate=True)
    else:
        out["b64"] = base64.b64encode(raw).decode()
    return out


def _heat(table: Any) -> tuple[dict[str, Any], list[float]]:
    """The table as uint8 colour levels over its own range (a colour scale has 256 steps)."""
    lo, hi = float(table.min()), float(table.max())
    levels = np.rint((table - lo) / (hi - lo) * 255) if hi > lo else np.zeros(table.shape)
    return encode(levels, "uint8"), [lo, hi]


def _sinusoidal(length: int, preset: str, dim: int) -> dict[str, Any]:
    dims = sorted({16, 32, 64, 128, 256, 512, dim})
    got = data.sinusoidal_explorer(length, preset=preset, dims=dims, bases=BASES)
    combos = {}
    for (d, b), c in got["combos"].items():
        heat, span = _heat(c["table"])
        combos[f"{got['dims'].index(d)}|{got['bases'].index(b)}"] = {
            "heat": heat,
            "heat_range": span,
            "first": encode(c["first"]),
            "labels": c["labels"],
            "pairs": [int(i) for i in c["pairs"]],
            "omega": [float(w) for w in c["omega"]],
            "wavelength": [float(w) for w in c["wavelength"]],
            "channels": c["channels"].tolist(),
            # drawn, not printed: float32 (the exact values rounded once) halves their bytes
            "sin": encode(c["sin"], "float32"),
            "cos": encode(c["cos"], "float32"),
        }
    return {
        "preset": preset,
        "length": got["length"],
        "dims": got["dims"],
        "bases": got["bases"],
        "dim": dim,
        "base": 10000.0,
        "shown": got["shown"],
        "combos": combos,
    }


def _rope() -> dict[str, Any]:
    r = data.rope_explorer(head_dim=8, base=10000.0, positions=64)
    return {
        "head_dim": r["head_dim"],
        "base": r["base"],
        "positions": r["positions"],
        "omega": [float(w) for w in r["omega"]],
        "pairs": r["pairs"].tolist(),
        "q": [float(x) for x in r["q"]],
        "k": [float(x) for x in r["k"]],
        "q_rot": encode(r["q_rot"]),
        "k_rot": encode(r["k_rot"]),
        "score": encode(r["score"]),
        "unrotated": r["unrotated"],
    }


def _extension(rope: dict[str, Any]) -> dict[str, Any]:
    trained = sorted({2048, 4096, 8192, 32768, rope["original"]})
    factors = sorted({2.0, 4.0, 8.0, 16.0, 32.0, rope["factor"]})
    default_trained, default_factor = rope["original"], rope["factor"]
    schedules = rope["schedules"]
    got = data.extension_explorer(
        rope["head_dim"], rope["base"], trained=trained, factors=factors, schedules=schedules
    )
    keys = [s.key for s in got["schedules"]]
    cases = {}
    for (key, t, f), c in got["cases"].items():
        cases[f"{keys.index(key)}|{got['trained'].index(t)}|{got['factors'].index(f)}"] = {
            "omega": encode(c.omega),
            "wavelength": encode(c.wavelength),
            "ratio": encode(c.ratio),
            "kind": encode(c.kind, "uint8"),
            "in_range": encode(c.in_range, "uint8"),
            "attention_scaling": c.attention_scaling,
            "summary": data.describe(c, t, f),
        }
    return {
        "name": rope["name"],
        "head_dim": got["head_dim"],
        "base": got["base"],
        "trained": got["trained"],
        "factors": got["factors"],
        "default": {
            "schedule": 0,
            "trained": got["trained"].index(default_trained),
            "factor": got["factors"].index(default_factor),
        },
        "classes": list(data.EXTENSION_CLASSES),
        "schedules": [
            {"key": s.key, "label": s.label, "rope_type": s.rope_type} for s in got["schedules"]
        ],
        "original": encode(got["original"]),
        "original_wavelength": encode(2 * np.pi / got["original"]),
        "cases": cases,
    }


#: The layouts of the timestep presets, as the explorer labels them.
_TIMESTEP_FORMS = {
    "ddpm": "[sin | cos], \u03c9\u2096 = 10000^(\u2212k/(h\u22121)): diffusers' defaults, DDPM",
    "ldm": "[cos | sin], \u03c9\u2096 = 10000^(\u2212k/h): latent diffusion, Stable Diffusion, DiT",
    "annotated-diffusion": "[sin | cos], \u03c9\u2096 = 10000^(\u2212k/(h\u22121)): "
    "The Annotated Diffusion Model",
}


def _timestep() -> dict[str, Any]:
    got = data.timestep_explorer(dims=(16, 32, 64))
    names, dims = list(got["presets"]), got["dims"]
    combos: dict[str, Any] = {}
    stored: list[tuple[str, Any]] = []  # identical tables (ddpm and annotated-diffusion) once
    for (name, dim), c in got["combos"].items():
        key = f"{names.index(name)}|{dims.index(dim)}"
        same = next((k for k, t in stored if t.shape == c["table"].shape and
                     np.array_equal(t, c["table"])), None)  # fmt: skip
        if same is not None:
            combos[key] = {"same": same}
            continue
        stored.append((key, c["table"]))
        one = int(np.flatnonzero(c["offsets"] == 1.0)[0])
        combos[key] = {
            # drawn, not printed: values in [-1, 1] as 256 colour levels, channel by
            # channel (d, T): a slow channel's run of equal levels compresses to nothing
            "levels": encode(np.rint((c["table"].T + 1) * 127.5), "uint8"),
            "similarity": encode(c["similarity"], "float32"),
            "next": float(c["similarity"][one]),
        }
    cross: dict[str, Any] = {}
    kept: list[tuple[str, Any]] = []  # equal curves (ddpm and annotated-diffusion) once
    for (a, b, d), v in got["cross"].items():
        key = f"{names.index(a)}|{names.index(b)}|{dims.index(d)}"
        same = next((k for k, w in kept if np.array_equal(w, v)), None)
        if same is None:
            kept.append((key, v))
            cross[key] = encode(v)
        else:
            cross[key] = {"same": same}
    return {
        "timesteps": {
            "first": 0.0,
            "step": float(got["timesteps"][1]),
            "count": len(got["timesteps"]),
        },
        "dims": dims,
        "dim": dims[-1],
        "presets": names,
        "forms": [_TIMESTEP_FORMS.get(n, n) for n in names],
        "combos": combos,
        "cross": cross,
    }


def _bias(modules: dict[str, tuple[str, Any]], length: int, trained: int) -> dict[str, Any]:
    """The bias explorer's data: ``modules`` maps a key to (its label, an AttentionBias)."""
    got = data.bias_explorer({k: m for k, (_, m) in modules.items()}, length)
    entries = []
    for key, (label, _) in modules.items():
        e = got[key]
        entry = {
            "key": key,
            "label": label,
            "heads": e["heads"],
            "bias": encode(e["bias"], "float32"),
            "weights": encode(e["weights"], "float32"),
            "mean_distance": encode(e["mean_distance"]),
            "self_weight": encode(e["self_weight"]),
        }
        if "buckets" in e:
            entry["buckets"] = [int(b) for b in e["buckets"]]
        entries.append(entry)
    return {"length": length, "trained": trained, "modules": entries}


def bias_modules(lab: Any | None = None) -> tuple[dict[str, tuple[str, Any]], int, int]:
    """The modules the bias explorer shows, with its length and the trained length.

    ALiBi with the lab's heads, and T5's table as the lab's copy run learned it
    (seed 0 of ``lab``, a :class:`posenc.lab.results.LabResults`; the bundled run
    when None). Without a trained T5 table, T5 at its initialisation is shown and
    labelled so.
    """
    import posenc
    from posenc.faces.lab import results
    from posenc.faces.lab import tasks as T

    run = lab if lab is not None else results.bundled()[0]
    config = run.config
    heads = config.heads
    modules: dict[str, tuple[str, Any]] = {
        "alibi": (f"ALiBi, {heads} heads (nothing learned)", posenc.ALiBi(heads))
    }
    trained = [b for b in run.bias_parameters if b.encoding == "t5"]
    if trained:
        first = min(trained, key=lambda b: b.seed)
        modules["t5"] = (
            f"T5, the table learned by the lab's {config.task} run (training {first.seed + 1} "
            f"of {config.seeds})",
            results.bias_module(first, config),
        )
    else:
        modules["t5"] = (
            f"T5, {heads} heads at initialisation (random)",
            posenc.T5Bias(heads, bidirectional=False),
        )
    trained_length = T.sequence_length(config.task, config.train_len)
    return modules, config.max_positions, trained_length


def payload(
    *,
    length: int = 50,
    preset: str = "vaswani",
    dim: int = 512,
    rope: dict[str, Any] | None = None,
    lab: Any | None = None,
) -> dict[str, Any]:
    """Everything the explorers draw, JSON-ready.

    Args:
        length: positions of the sinusoidal explorer (slider ``0 .. length - 1``).
        preset: its sinusoidal preset.
        dim: the d selected first (added to the offered 16 .. 512).
        rope: the RoPE settings (:func:`posenc.report.rope_settings`): head_dim,
            base, trained length, factor and schedules (the first selected).
        lab: the lab run whose trained T5 table the bias explorer shows
            (:func:`bias_modules`; the bundled copy run when None).
    """
    if rope is None:
        rope = rope_settings(None)
    return {
        "sinusoidal": _sinusoidal(length, preset, dim),
        "timestep": _timestep(),
        "rope": _rope(),
        "extension": _extension(rope),
        "bias": _bias(*bias_modules(lab)),
    }


def rope_settings(config: str | Path | None) -> dict[str, Any]:
    """head_dim, base, factor, trained length and schedules for the RoPE sections.

    Llama-3.1's values by default (head_dim 128, theta 500000, llama3 scaling
    by 8 from 8192); with a ``config.json`` path, that model's (read by
    :func:`posenc.hf.rope_spec`), its schedule first among the ones compared.
    """
    standard = list(data.STANDARD_SCHEDULES)
    if config is None:
        return {
            "head_dim": 128,
            "base": 500000.0,
            "factor": 8.0,
            "original": 8192,
            "name": "a Llama-3.1-like model (head_dim 128, theta 500000)",
            "schedules": [standard[-1], *standard[:-1]],
        }
    from posenc.integration.hf import rope_spec

    path = Path(config)
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"--rope-config: cannot read {str(path)!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--rope-config: {str(path)!r} is not JSON: {exc.msg}") from None
    spec = rope_spec(raw)
    first, original, factor = data.model_schedule(spec, path.name)
    schedules = [first, *(s for s in standard if s.key != first.key)]
    return {
        "head_dim": spec.rotary_dim,
        "base": spec.base,
        "factor": factor,
        "original": int(original),
        "name": path.name,
        "schedules": schedules,
    }


def containers() -> dict[str, str]:
    """The empty ``<div>`` each explorer is drawn in, by explorer name."""
    return {
        name: f'<div class="explorer" id="{name}-explorer"></div>'
        for name in ("sinusoidal", "timestep", "rope", "extension", "bias")
    }


def _script_text(text: str) -> str:
    # a literal "</script" would end the element early; JSON and JS both accept "<\/"
    return text.replace("</", "<\\/")


def scripts(data_: dict[str, Any]) -> str:
    """The data, d3 and the explorers' script, inline, for the end of ``<body>``."""
    blob = json.dumps(data_, separators=(",", ":"), allow_nan=False)
    return "\n".join(
        [
            f'<script type="application/json" id="posenc-data">{_script_text(blob)}</script>',
            f"<script>{_script_text((WEB / 'd3.min.js').read_text())}</script>",
            f"<script>{_script_text((WEB / 'explorer.js').read_text())}</script>",
        ]
    )


def style() -> str:
    """The explorers' CSS."""
    return (WEB / "explorer.css").read_text()


def standalone(path: str | Path, **options: Any) -> Path:
    """A page with only the explorers (for working on them): ``payload(**options)``."""
    from posenc.core.files import atomic_write

    parts = containers()
    page = "\n".join(
        [
            '<!doctype html><html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape('posenc explorers')}</title><style>{style()}</style></head>",
            "<body>",
            *parts.values(),
            scripts(payload(**options)),
            "</body></html>",
        ]
    )
    path = Path(path)
    with atomic_write(path, "w") as f:
        f.write(page)
    return path
