"""Run another engine's own RoPE code on a config and compare its tables with transformers'.

Each engine is one :class:`Engine` in :data:`ENGINES`: a name, where its Python is
found, and a reader script (in :mod:`posenc.integration.analysis.engine_readers`) that
runs under that Python as a child process. The reader gets the config and the windows
to evaluate as JSON on stdin and prints the engine's cos/sin tables (one value per
pair, times whatever scale the engine multiplies in), its layout and attention scaling
as JSON on stdout. :func:`run_engines` gives one :class:`EngineResult` per engine:

- ``"same"``: the tables agree with the reference's within
  :func:`~posenc.integration.analysis.rope_compare.compare`'s derived tolerances, or
  differ only as float32 angles do (transformers computes its angles in float32 too);
- ``"different"``: where (window, first position, pair), by how much, the attention
  scaling on both sides and the likely misreading;
- ``"refused"``: the engine's code raised on this config (its error message and where it
  was raised, which the reader sends as JSON);
- ``"error"``: no answer (the timeout; a reader that cannot start or dies, its stderr's
  last line; output that is not the reader's JSON);
- ``"not installed"``: no Python for the engine.

The reference is posenc's reading of the config, which ``posenc rope`` checks equal to
transformers' own (:mod:`posenc.integration.analysis.rope_reading`).

An engine's Python is ``--engine-python NAME=PATH``, else its environment in the user
cache, which ``posenc engines build NAME`` builds
(:mod:`~posenc.integration.analysis.engine_cache`: ``$POSENC_ENGINES``, else
``$XDG_CACHE_HOME/posenc/engines``, one directory per engine and pins).

The windows are the positions that matter: for a RoPE with a pretraining length
shorter than its longest supported one (``llama3``, ``yarn``, ``longrope``, ``dynamic``
past ``max_position_embeddings``), one window of the original length (positions 0, 1,
2, the middle and the last two) and one of the longest (0, 1, around the original
length, the middle and the last two); else one window of ``max_position_embeddings``.
A window of ``seq_len`` N is a sequence of N tokens (transformers' ``seq_len =
max(position_ids) + 1``, what dynamic NTK and LongRoPE read).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from posenc.integration.analysis import engine_cache
from posenc.integration.analysis.rope_compare import (
    Verdict,
    compare,
    compare_mrope,
    golden_tables,
)
from posenc.integration.analysis.rope_reading import (
    Reading,
    checkpoint_layout,
    nope_layers,
    show,
    softmax_scale,
)

READERS = Path(__file__).resolve().parent / "engine_readers"
#: The verdicts, in the order the table prints them.
VERDICTS = ("same", "different", "refused", "error", "not installed")
#: bfloat16's unit roundoff (8 significant bits).
_BFLOAT16_ROUNDOFF = 2.0**-8
#: A window longer than the original context uses these positions past its middle.
_FALLBACK_LENGTH = 4096
#: How far a scale an engine computes in float32 (YaRN's ``0.1 ln(factor) + 1``, DeepSeek's
#: ``mscale ** 2 / sqrt(head_dim)``) may be from the exact one, relatively: a log, a few
#: products and a square root, each rounded to float32 (2**-24), well within 16 ulps.
FLOAT32_SCALAR_RTOL = 2.0**-20


def _scaling_rtol(u: float) -> float:
    """How far a reported attention scaling may be from the reference, relatively.

    The readers report the norm of the engine's own cos/sin pair at position 0: the
    scale it computed in float32 (:data:`FLOAT32_SCALAR_RTOL`), stored in its tables'
    dtype (one rounding, the dtype's unit roundoff ``u``: 2**-8 in bfloat16, 2**-11 in
    float16, 2**-24 in float32).
    """
    return FLOAT32_SCALAR_RTOL + u


@dataclass(frozen=True)
class Engine:
    """One engine: its name, its reader script, its build recipe and how long it may run.

    Attributes:
        name: the name ``--engines`` takes.
        reader: the script's path, run as ``PYTHON reader`` (JSON on stdin and stdout).
        timeout_s: seconds the reader may take, start-up included.
        sources: files other than the recipe and its pins that the build compiles in
            (part of its cache key, :func:`~posenc.integration.analysis.engine_cache.key`).
        recipes: the directory of its recipe ``NAME.sh`` and pins ``NAME.txt`` (the
            package's ``engine_recipes/``).
        logits: whether its reader answers the ``"logits"`` request (converts a tiny
            checkpoint with the engine's converter and runs it:
            :mod:`~posenc.integration.analysis.engine_logits`).
    """

    name: str
    reader: Path
    timeout_s: float = 180.0
    sources: tuple[Path, ...] = ()
    recipes: Path = engine_cache.RECIPES
    logits: bool = False

    @property
    def recipe(self) -> Path:
        """The bash script that builds the environment: ``RECIPES/NAME.sh``."""
        return self.recipes / f"{self.name}.sh"

    @property
    def pins(self) -> Path:
        """The versions the recipe installs: ``RECIPES/NAME.txt``."""
        return self.recipes / f"{self.name}.txt"

    @property
    def install(self) -> str:
        """The command that builds the environment."""
        return f"posenc engines build {self.name}"


#: The engines ``--engines`` accepts, by name.
ENGINES: dict[str, Engine] = {
    "vllm": Engine("vllm", READERS / "vllm_reader.py"),
    "sglang": Engine("sglang", READERS / "sglang_reader.py"),
    "mlx": Engine("mlx", READERS / "mlx_reader.py", logits=True),
    # the reader's driver programs, compiled by the recipe against libllama
    "llama.cpp": Engine(
        "llama.cpp",
        READERS / "llamacpp_reader.py",
        sources=(READERS / "llamacpp_graph.py",),
        logits=True,
    ),
    "lmdeploy": Engine("lmdeploy", READERS / "lmdeploy_reader.py"),
    "keras-hub": Engine("keras-hub", READERS / "kerashub_reader.py"),
    "easydel": Engine("easydel", READERS / "easydel_reader.py"),
    "maxtext": Engine("maxtext", READERS / "maxtext_reader.py"),
    "ctranslate2": Engine(
        "ctranslate2", READERS / "ctranslate2_reader.py", timeout_s=300.0, logits=True
    ),
    "onnxruntime-genai": Engine(
        "onnxruntime-genai", READERS / "ortgenai_reader.py", timeout_s=300.0, logits=True
    ),
}


@dataclass
class EngineResult:
    """What one engine made of the config, against the reference."""

    engine: str
    verdict: str
    version: str | None = None
    source: str | None = None
    python: str | None = None
    max_abs_diff: float | None = None
    first_difference: dict[str, Any] | None = None
    attention_scaling: dict[str, Any] = field(default_factory=dict)
    layout: dict[str, str | None] = field(default_factory=dict)
    note: str = ""
    cause: str | None = None
    seconds: float | None = None
    windows: list[dict[str, Any]] = field(default_factory=list)
    switching: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The result as the JSON object ``posenc rope --engines --json`` prints."""
        return {
            "verdict": self.verdict,
            "version": self.version,
            "source": self.source,
            "python": self.python,
            "max_abs_diff": self.max_abs_diff,
            "first_difference": self.first_difference,
            "attention_scaling": self.attention_scaling,
            "layout": self.layout,
            "cause": self.cause,
            "note": self.note,
            "switching": self.switching,
            "windows": self.windows,
        }


# --------------------------------------------------------------------------------------
# Command-line values.


def parse_engines(text: str, option: str = "--engines") -> list[str]:
    """Engine names from ``--engines`` (a comma list; ``all`` is every registered engine).

    ``option`` names the value in the errors.

    Raises:
        ValueError: an empty list or an unknown name (the message names the accepted ones).
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    accepted = ", ".join([*ENGINES, "all"])
    if not names:
        raise ValueError(f"{option} {text!r}: no engine named (accepted: {accepted})")
    if "all" in names:
        return list(ENGINES)
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise ValueError(
            f"{option} {text!r}: unknown engine {', '.join(map(repr, unknown))} "
            f"(accepted: {accepted})"
        )
    return list(dict.fromkeys(names))


def parse_engine_python(items: Sequence[str]) -> dict[str, str]:
    """``--engine-python NAME=PATH`` values, by engine name.

    Raises:
        ValueError: not ``NAME=PATH``, or an unknown engine name.
    """
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        name = name.strip()
        if not sep or not name or not path:
            raise ValueError(f"--engine-python must look like NAME=PATH; got {item!r}")
        if name not in ENGINES:
            raise ValueError(f"--engine-python {item!r}: unknown engine {name!r} "
                             f"(accepted: {', '.join(ENGINES)})")  # fmt: skip
        out[name] = path
    return out


def engine_python(name: str, overrides: Mapping[str, str] | None = None) -> Path:
    """Where engine ``name``'s Python should be (it may not exist).

    ``overrides[name]`` (``--engine-python``), else its build in the user cache,
    ``NAME-KEY/bin/python`` (:mod:`~posenc.integration.analysis.engine_cache`, built by
    ``posenc engines build NAME``).
    """
    if overrides and name in overrides:
        return Path(overrides[name])
    return engine_cache.python(ENGINES[name])


# --------------------------------------------------------------------------------------
# Which positions.


def _points(seq_len: int, extra: Sequence[int] = ()) -> list[int]:
    wanted = {0, 1, 2, seq_len // 2, seq_len - 2, seq_len - 1, *extra}
    return sorted(p for p in wanted if 0 <= p < seq_len)


def _windows_of(reading: Reading) -> list[dict[str, Any]]:
    spec = reading.spec
    longest = spec.max_position_embeddings or _FALLBACK_LENGTH
    original = spec.original_max_position_embeddings
    if spec.rope_type == "dynamic":
        # dynamic NTK changes the base only past max_position_embeddings: state a length
        # of factor times it, transformers' and the engines' extended context
        original = longest
        factor = spec.params.get("factor")
        longest = int(longest * (float(factor) if isinstance(factor, (int, float)) else 2.0))
    out = []
    if original and original < longest:
        out.append({"seq_len": original, "positions": _points(original)})
        around = (original - 1, original, original + 1)
        out.append({"seq_len": longest, "positions": _points(longest, around)})
    else:
        out.append({"seq_len": longest, "positions": _points(longest)})
    return out


def mrope_positions(positions: Sequence[int]) -> list[list[int]]:
    """Multi-axis positions (temporal, height, width) that tell M-RoPE's sections apart.

    Row ``p`` is at ``(p, p // 2, p // 4)``: the three axes differ from position 2 on
    (as in an image, where height and width grow slower than the token index), so a
    pair read from the wrong axis shows.
    """
    return [[int(p) for p in positions], [int(p) // 2 for p in positions],
            [int(p) // 4 for p in positions]]  # fmt: skip


def windows(
    readings: Sequence[Reading], config: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The windows to evaluate the config's RoPEs at.

    Each window is ``{"seq_len": N, "positions": [...]}``, plus ``"layer_type"`` for a
    config with one RoPE per layer type and ``"layer"``, the first layer of the RoPE (a
    reader that builds the model reads that layer's attention); an M-RoPE gets each
    window twice, at text positions (all axes equal) and at :func:`mrope_positions`
    (``"position_ids"``). A ``config`` with layers that transformers leaves without RoPE
    (:func:`~posenc.integration.analysis.rope_reading.nope_layers`: SmolLM3's
    ``no_rope_layers``, Cohere 2's full-attention layers) adds one window at the first
    of them, marked ``"nope": true``: there the engine must not rotate.
    """
    many = len(readings) > 1 or any(r.layer_type for r in readings)
    out = []
    for r in readings:
        for w in _windows_of(r):
            if many:
                w["layer_type"] = r.layer_type
            if r.layers:
                w["layer"] = r.layers[0]
            out.append(w)
            if r.mrope:
                out.append({**w, "position_ids": mrope_positions(w["positions"])})
    nope = nope_layers(config) if config is not None else None
    if nope and nope["layers"] and out:
        layer = int(nope["layers"][0])
        # the RoPE the layer would have (its layer type's, else the only one): its pairs
        of_type = [r for r in readings if r.layers and layer in r.layers] or list(readings)
        first = next(w for w in out if w.get("layer_type") == of_type[0].layer_type)
        seq_len = int(first["seq_len"])
        w = {"seq_len": seq_len, "positions": _points(seq_len), "layer": layer, "nope": True}
        if many:
            w["layer_type"] = of_type[0].layer_type
        out.append(w)
    return out


# --------------------------------------------------------------------------------------
# Running a reader.


def _last_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no message)"


def child_env() -> dict[str, str]:
    """The environment a reader runs in: this one's, without its Python paths (the engine's
    Python must see its own packages only)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    return env


def call_reader(
    python: Path, engine: Engine, request: Mapping[str, Any], timeout_s: float
) -> tuple[str, Any]:
    """Run ``engine``'s reader with ``python`` on one request (or a batch): ``("ok", its
    JSON)`` or ``("error", what went wrong)`` (it cannot start, dies, prints no JSON
    object, or takes longer than ``timeout_s``: killed with its children)."""
    try:
        proc = subprocess.Popen(
            [str(python), str(engine.reader)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
            start_new_session=True,  # its own process group: a timeout kills its children too
        )
    except OSError as exc:
        return "error", f"cannot start {python}: {exc.strerror or exc}"
    try:
        out, err = proc.communicate(json.dumps(request), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        return "error", f"no answer within {show(timeout_s)} s (the reader was killed)"
    if proc.returncode != 0:
        # a reader answers a refusal as JSON: dying is the environment's or the reader's
        # failure (an import that fails, a crash, a kill), not the config's
        return "error", f"the reader exited with status {proc.returncode}: {_last_line(err)}"
    try:
        answer = json.loads(out)
    except ValueError:
        return "error", f"the reader printed no JSON (exit 0): {out.strip()[:200]!r}"
    if not isinstance(answer, dict):
        return "error", "the reader's JSON is not an object"
    return "ok", answer


def call_batch(
    python: Path, engine: Engine, requests: Sequence[Mapping[str, Any]], timeout_s: float
) -> tuple[str, Any]:
    """Run the reader on ``requests`` in one child process: ``("ok", one answer per
    request)``, or ``("error", what went wrong)`` (:func:`call_reader`'s failures, or a
    reply that is not a batch of as many answers)."""
    status, answer = call_reader(python, engine, {"batch": list(requests)}, timeout_s)
    if status == "ok" and not (isinstance(answer.get("batch"), list)
                               and len(answer["batch"]) == len(requests)):  # fmt: skip
        return "error", f"the reader answered no batch of {len(requests)}"
    return (status, answer["batch"]) if status == "ok" else (status, answer)


def _config_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    return dict(config.to_dict())  # a transformers config instance (a class name as CONFIG)


def _not_installed(name: str, python: Path) -> EngineResult:
    engine = ENGINES[name]
    return EngineResult(name, "not installed", python=str(python),
                        note=f"no {python}; build it with {engine.install}, "
                        f"or give --engine-python {name}=PATH")  # fmt: skip


def _result(
    name: str,
    answer: Any,
    readings: list[Reading],
    python: Path,
    asked: list[dict[str, Any]],
    config: Mapping[str, Any],
) -> EngineResult:
    """One request's answer, judged: a refusal, an unreadable answer, or the tables' verdict."""
    if not isinstance(answer, dict):
        return EngineResult(name, "error", python=str(python), note="the reader's answer is "
                            f"not an object: {str(answer)[:200]!r}")  # fmt: skip
    if "refused" in answer:
        where = f" (at {answer['where']})" if answer.get("where") else ""
        return EngineResult(name, "refused", python=str(python), version=answer.get("version"),
                            note=f"{answer['refused']}{where}")  # fmt: skip
    if not isinstance(answer.get("windows"), list):
        return EngineResult(name, "error", python=str(python),
                            note="the reader's JSON has no windows")  # fmt: skip
    try:
        result = _judge(name, answer, readings, asked, config)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        return EngineResult(name, "error", python=str(python),
                            note=f"the reader's tables cannot be compared: {exc}")  # fmt: skip
    result.python = str(python)
    return result


def run_engine(
    name: str,
    config: Any,
    readings: list[Reading],
    python: Path,
) -> EngineResult:
    """Run engine ``name``'s reader with ``python`` on ``config`` and judge its tables."""
    import time

    engine = ENGINES[name]
    if not python.exists():
        return _not_installed(name, python)
    asked = windows(readings, _config_dict(config))
    request: dict[str, Any] = {"config": _config_dict(config), "windows": asked}
    started = time.monotonic()
    status, answer = call_reader(python, engine, request, engine.timeout_s)
    seconds = time.monotonic() - started
    if status != "ok":
        return EngineResult(name, status, python=str(python), note=str(answer), seconds=seconds)
    result = _result(name, answer, readings, python, asked, request["config"])
    result.seconds = seconds
    return result


def run_engines(
    names: Sequence[str],
    config: Any,
    readings: list[Reading],
    overrides: Mapping[str, str] | None = None,
) -> list[EngineResult]:
    """One :class:`EngineResult` per engine in ``names``, in that order."""
    return [run_engine(n, config, readings, engine_python(n, overrides)) for n in names]


def run_cases(
    name: str,
    configs: Sequence[Mapping[str, Any]],
    python: Path | None = None,
    *,
    seconds_per_config: float = 30.0,
) -> list[EngineResult]:
    """Engine ``name`` on many ``config.json`` dicts, in one child process (one import).

    Each config is read as ``posenc rope`` reads a file
    (:func:`~posenc.integration.analysis.rope_reading.read`); the reader answers them in
    one batch, and a config it refuses does not stop the others. The timeout is the
    engine's plus ``seconds_per_config`` per config.

    Raises:
        ValueError: a config posenc itself cannot read (the message names its index).
    """
    import copy
    import time

    from posenc.integration.analysis.rope_reading import Loaded, read, rewrite_mrope_type

    engine = ENGINES[name]
    python = engine_python(name) if python is None else python
    all_readings = []
    for i, config in enumerate(configs):
        data = copy.deepcopy(dict(config))
        loaded = Loaded(config=data, label=f"config {i}", kind="file", original=copy.deepcopy(data))
        rewrite_mrope_type(loaded)
        all_readings.append((loaded, read(loaded)))
    if not python.exists():
        return [_not_installed(name, python) for _ in configs]
    batch: list[dict[str, Any]] = [
        {
            "config": _config_dict(loaded.config),
            "windows": windows(readings, _config_dict(loaded.config)),
        }
        for loaded, readings in all_readings
    ]
    started = time.monotonic()
    timeout = engine.timeout_s + seconds_per_config * len(configs)
    status, answers = call_batch(python, engine, batch, timeout)
    seconds = (time.monotonic() - started) / max(len(configs), 1)
    if status != "ok":
        return [EngineResult(name, status, python=str(python), note=str(answers))
                for _ in configs]  # fmt: skip
    out = []
    for (_, readings), one, request in zip(all_readings, answers, batch, strict=True):
        result = _result(name, one, readings, python, request["windows"], request["config"])
        result.seconds = seconds
        out.append(result)
    return out


# --------------------------------------------------------------------------------------
# Judging an answer.


def _float32_only(v: Verdict) -> bool:
    return bool(v.cause and v.cause.startswith("float32 angles"))


def _judge(
    name: str,
    answer: Mapping[str, Any],
    readings: list[Reading],
    asked: list[dict[str, Any]],
    config: Mapping[str, Any],
) -> EngineResult:
    """The verdict on one answer; its windows are the ``asked`` ones, in their order."""
    layout = answer.get("layout")
    notes = [str(answer["note"])] if answer.get("note") else []
    by_type = {r.layer_type: r for r in readings}
    named = str(answer.get("dtype", "float32"))
    # bfloat16 has no numpy dtype: its values (exact in float32) are judged with its roundoff
    rounding = _BFLOAT16_ROUNDOFF if named == "bfloat16" else None
    dtype = np.dtype("float32" if rounding else named)
    if dtype not in (np.float16, np.float32, np.float64):
        raise ValueError(f"dtype {named} (the reader's values must be bfloat16, float16, 32 "
                         "or 64)")  # fmt: skip
    if named in ("bfloat16", "float16"):
        notes.append(f"{name} keeps its tables in {named} (judged within {named}'s rounding)")
    if len(answer["windows"]) != len(asked):
        raise ValueError(f"the reader answered {len(answer['windows'])} windows of {len(asked)}")
    verdicts: list[tuple[dict[str, Any], Reading, Verdict, float]] = []
    for a, got in zip(asked, answer["windows"], strict=True):
        # what was asked (layer type, positions) is the request's, the tables the reader's
        w = {**got, **{k: a[k] for k in ("layer_type", "position_ids", "layer", "nope")
                       if k in a}}  # fmt: skip
        if [int(p) for p in got["positions"]] != a["positions"]:
            raise ValueError(f"a window answered at other positions than asked: {got['positions']}")
        lt = w.get("layer_type")
        if lt not in by_type:
            if lt is None and len(readings) == 1:
                lt = readings[0].layer_type
            else:
                raise ValueError(f"a window of layer type {lt!r}; the config's: {list(by_type)}")
        reading = by_type[lt]
        if w.get("nope"):
            v = _judge_nope(name, w, reading, config, answer.get("fallback"))
            verdicts.append((w, reading, v, v.largest or 0.0))
            continue
        if w.get("rotates") is False:
            layer = w.get("layer", 0)
            v = Verdict(f"layer {layer}", lt, False,
                        f"{name} does not rotate layer {layer}; transformers does",
                        cause=f"{name} reads layer {layer} as a layer without RoPE")  # fmt: skip
            verdicts.append((w, reading, v, 1.0))
            continue
        positions = np.asarray(w["positions"], dtype=np.int64)
        # JSON carries no dtype: the reader says which its engine computed in (MLX: float32),
        # and the values are judged with that dtype's tolerance
        cos = np.asarray(w["cos"], dtype=dtype)
        sin = np.asarray(w["sin"], dtype=dtype)
        label = f"{name} at seq_len {w['seq_len']}" + (f" [{lt}]" if lt else "")
        if w.get("position_ids") is not None:
            ids = np.asarray(w["position_ids"], dtype=np.int64)
            v = compare_mrope(reading, ids, cos, sin, source=f"{label} (multi-axis positions)",
                              rounding=rounding)  # fmt: skip
            verdicts.append((w, reading, v, v.largest or 0.0))
            continue
        arrays = {"positions": positions, "cos": cos, "sin": sin}
        for v in compare(readings, arrays, source=label, layer_type=lt, rounding=rounding):
            verdicts.append((w, reading, v, _max_abs_diff(w, reading)))
    max_diff = max(d for *_, d in verdicts)
    first: dict[str, Any] | None = None
    for w, _, v, _ in verdicts:
        if not v.agree and not _float32_only(v) and first is None:
            first = {"seq_len": w["seq_len"], "layer_type": w.get("layer_type"),
                     **(v.first or {}), "summary": v.summary}  # fmt: skip
            if "channel" in first:
                first["pair"] = first.pop("channel")
            if "posenc" in first:
                first["reference"] = first.pop("posenc")
    per_window = [
        {"seq_len": w["seq_len"], "positions": w["positions"], "mode": w.get("mode"),
         "layer_type": w.get("layer_type"), "position_ids": w.get("position_ids"),
         "layer": w.get("layer"), "nope": bool(w.get("nope")), "rotates": w.get("rotates"),
         "same": v.agree or _float32_only(v), "summary": v.summary}
        for w, _, v, _ in verdicts
    ]  # fmt: skip
    if any(not v.agree and _float32_only(v) for *_, v, _ in verdicts) and first is None:
        notes.append("differs from the exact tables only as float32 angles do (as "
                     "transformers computes them)")  # fmt: skip
    cause = next((v.cause for *_, v, _ in verdicts if not v.agree and not _float32_only(v)), None)
    different = first is not None
    reference = verdicts[-1][1]
    ref_layout = checkpoint_layout(reference)
    if layout is not None and layout != ref_layout:
        different = True
        notes.append(f"layout: {name} rotates {layout} pairs, transformers {ref_layout}")
    # the attention scaling of each window (a reader may give it per window)
    scaling: dict[str, Any] = {}
    scaling_tol = _scaling_rtol(rounding or float(np.finfo(dtype).eps) / 2)
    for w, reading, _, _ in verdicts:
        if w.get("nope") or w.get("rotates") is False:
            continue  # no table: no scale multiplied into one
        ref = float(reading.spec.frequencies(seq_len=int(w["seq_len"])).attention_scaling)
        theirs = w.get("attention_scaling", answer.get("attention_scaling"))
        scaling = {"engine": theirs, "reference": ref}
        if isinstance(theirs, (int, float)) and not math.isclose(theirs, ref, rel_tol=scaling_tol):
            different = True
            text = (f"attention scaling: {name} {theirs:.6g}, transformers {ref:.6g} "
                    f"({reading.scaling.source})")  # fmt: skip
            if text not in notes:
                notes.append(text)
    theirs_softmax = answer.get("softmax_scale")
    if isinstance(theirs_softmax, (int, float)):
        # the factor on q . k: with DeepSeek's YaRN, part of the scaling lives here
        ref_softmax, softmax_source = softmax_scale(config)
        scaling["softmax_scale"] = {"engine": theirs_softmax, "reference": ref_softmax}
        if ref_softmax is None:
            notes.append(f"softmax scale not compared ({softmax_source})")
        elif not math.isclose(theirs_softmax, ref_softmax, rel_tol=FLOAT32_SCALAR_RTOL):
            different = True
            notes.append(f"softmax scale: {name} {theirs_softmax:.6g}, transformers "
                         f"{ref_softmax:.6g} ({softmax_source})")  # fmt: skip
    switching = answer.get("switching")
    return EngineResult(
        name,
        "different" if different else "same",
        switching=str(switching) if switching else None,
        version=answer.get("version"),
        source=answer.get("source"),
        max_abs_diff=max_diff,
        first_difference=first,
        attention_scaling=scaling,
        layout={"engine": layout, "reference": ref_layout},
        note="; ".join(notes),
        cause=cause,
        windows=per_window,
    )


def _judge_nope(
    name: str,
    w: Mapping[str, Any],
    reading: Reading,
    config: Mapping[str, Any],
    fallback: str | None = None,
) -> Verdict:
    """A layer transformers leaves without RoPE: the engine must not rotate it.

    ``rotates`` is the reader's word; without it, the tables say: a layer that does not
    rotate holds cos = 1 and sin = 0 at every position (exactly: no angle is computed).
    A reader that read the model as another model's file (``fallback``: the engine has
    none of its own) and cannot say ``rotates`` has not seen the model's layers: the
    window is not judged, and says so.
    """
    layer = int(w.get("layer", 0))
    nope = nope_layers(config) or {}
    source = nope.get("from", "the config")
    rotates = w.get("rotates")
    if rotates is None and fallback:
        return Verdict(f"layer {layer}", reading.layer_type, True,
                       f"layer {layer} (without RoPE in transformers) not judged: the reader "
                       f"read the model as {fallback}")  # fmt: skip
    largest = 0.0
    if rotates is None:
        cos = np.asarray(w["cos"], dtype=np.float64)
        sin = np.asarray(w["sin"], dtype=np.float64)
        largest = float(max(np.max(np.abs(cos - 1.0), initial=0.0),
                            np.max(np.abs(sin), initial=0.0)))  # fmt: skip
        rotates = largest > 0.0
    if rotates:
        return Verdict(f"layer {layer}", reading.layer_type, False,
                       f"{name} rotates layer {layer}, which transformers leaves without RoPE "
                       f"({source})", cause=f"{name} misses the NoPE layers ({source})",
                       largest=largest or 1.0)  # fmt: skip
    return Verdict(f"layer {layer}", reading.layer_type, True,
                   f"layer {layer} without RoPE, as transformers ({source})")  # fmt: skip


def _max_abs_diff(w: Mapping[str, Any], reading: Reading) -> float:
    positions = np.asarray(w["positions"], dtype=np.int64)
    ref = golden_tables([reading], positions)
    prefix = f"{reading.layer_type}/" if reading.layer_type else ""
    pairs = reading.spec.rotary_dim // 2
    rc: npt.NDArray[np.float64] = ref[prefix + "cos"][:, :pairs]
    rs: npt.NDArray[np.float64] = ref[prefix + "sin"][:, :pairs]
    tc, ts = np.asarray(w["cos"], dtype=np.float64), np.asarray(w["sin"], dtype=np.float64)
    if tc.shape != rc.shape:
        return math.inf
    return float(max(np.max(np.abs(tc - rc)), np.max(np.abs(ts - rs))))


# --------------------------------------------------------------------------------------
# Printing.


def table(results: Sequence[EngineResult]) -> list[str]:
    """The compact table ``posenc rope --engines`` prints, one line per engine and detail."""
    width = max([9, *(len(r.engine) for r in results)])
    head = f"{'verdict':13}  {'max |diff|':10}  {'scaling (engine / ref)':22}  version"
    lines = [f"{'engine':{width}}  {head}"]
    for r in results:
        diff = "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.3g}"
        sc = r.attention_scaling
        scaling = "-"
        if sc.get("engine") is not None:
            scaling = f"{sc['engine']:.6g} / {sc['reference']:.6g}"
        row = f"{r.verdict:13}  {diff:10}  {scaling:22}  {r.version or '-'}"
        lines.append(f"{r.engine:{width}}  {row}")
        if r.first_difference:
            f = r.first_difference
            lt = f" [{f['layer_type']}]" if f.get("layer_type") else ""
            lines.append(
                f"  first difference: seq_len {f['seq_len']}{lt}, position {f.get('position')}, "
                f"pair {f.get('pair')} ({f.get('table')}): {r.engine} {f.get('theirs')!r}, "
                f"transformers {f.get('reference')!r}"
            )
        for w in r.windows:
            if not w["same"]:
                lt = f" [{w['layer_type']}]" if w.get("layer_type") else ""
                lines.append(f"  seq_len {w['seq_len']}{lt}: {w['summary']}")
        if r.cause:
            lines.append(f"  likely cause: {r.cause}")
        if r.switching:
            lines.append(f"  switches: {r.switching}")
        if r.note:
            lines.append(f"  note: {r.note}")
    return lines
