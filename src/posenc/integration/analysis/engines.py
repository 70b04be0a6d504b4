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
- ``"refused"``: the engine's code raised (its error message, the traceback's last line);
- ``"error"``: no answer (the timeout, or output that is not the reader's JSON);
- ``"not installed"``: no Python for the engine.

The reference is posenc's reading of the config, which ``posenc rope`` checks equal to
transformers' own (:mod:`posenc.integration.analysis.rope_reading`).

An engine's Python is, in order: ``--engine-python NAME=PATH``;
``$POSENC_ENGINES/NAME/bin/python``; ``.engines/NAME/bin/python`` under the
repository (``make engines`` builds it there).

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

from posenc.integration.analysis.rope_compare import Verdict, compare, golden_tables
from posenc.integration.analysis.rope_reading import Reading, show

__all__ = [
    "ENGINES",
    "Engine",
    "EngineResult",
    "engine_python",
    "parse_engine_python",
    "parse_engines",
    "run_engine",
    "run_engines",
    "windows",
]

#: The repository root (``src/posenc/integration/analysis/engines.py`` is four levels down).
REPO = Path(__file__).resolve().parents[4]
READERS = Path(__file__).resolve().parent / "engine_readers"
#: The verdicts, in the order the table prints them.
VERDICTS = ("same", "different", "refused", "error", "not installed")
#: A window longer than the original context uses these positions past its middle.
_FALLBACK_LENGTH = 4096


@dataclass(frozen=True)
class Engine:
    """One engine: its name, its reader script and how long its reader may run.

    Attributes:
        name: the name ``--engines`` takes.
        reader: the script's path, run as ``PYTHON reader`` (JSON on stdin and stdout).
        install: what to run to build the engine's environment.
        timeout_s: seconds the reader may take, start-up included.
    """

    name: str
    reader: Path
    install: str
    timeout_s: float = 180.0


#: The engines ``--engines`` accepts, by name.
ENGINES: dict[str, Engine] = {
    "mlx": Engine("mlx", READERS / "mlx_reader.py", "make engines (mlx[cpu] and mlx-lm)"),
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
    attention_scaling: dict[str, float | None] = field(default_factory=dict)
    layout: dict[str, str | None] = field(default_factory=dict)
    note: str = ""
    cause: str | None = None
    seconds: float | None = None
    windows: list[dict[str, Any]] = field(default_factory=list)

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
            "windows": self.windows,
        }


# --------------------------------------------------------------------------------------
# Command-line values.


def parse_engines(text: str) -> list[str]:
    """Engine names from ``--engines`` (a comma list; ``all`` is every registered engine).

    Raises:
        ValueError: an empty list or an unknown name (the message names the accepted ones).
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    accepted = ", ".join([*ENGINES, "all"])
    if not names:
        raise ValueError(f"--engines {text!r}: no engine named (accepted: {accepted})")
    if "all" in names:
        return list(ENGINES)
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise ValueError(
            f"--engines {text!r}: unknown engine {', '.join(map(repr, unknown))} "
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

    ``overrides[name]`` (``--engine-python``), else ``$POSENC_ENGINES/NAME/bin/python``,
    else ``.engines/NAME/bin/python`` under the repository.
    """
    if overrides and name in overrides:
        return Path(overrides[name])
    root = os.environ.get("POSENC_ENGINES")
    base = Path(root) if root else REPO / ".engines"
    return base / name / "bin" / "python"


# --------------------------------------------------------------------------------------
# Which positions.


def _points(seq_len: int, extra: Sequence[int] = ()) -> list[int]:
    wanted = {0, 1, 2, seq_len // 2, seq_len - 2, seq_len - 1, *extra}
    return sorted(p for p in wanted if 0 <= p < seq_len)


def windows(reading: Reading) -> list[dict[str, Any]]:
    """The windows to evaluate ``reading`` at: ``[{"seq_len": N, "positions": [...]}]``."""
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


# --------------------------------------------------------------------------------------
# Running a reader.


def _last_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no message)"


def _child_env() -> dict[str, str]:
    # the engine's Python must see its own packages only, never this environment's
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    return env


def _call(python: Path, engine: Engine, request: Mapping[str, Any]) -> tuple[str, Any]:
    """Run the reader; ``("ok", answer)``, ``("refused", message)`` or ``("error", message)``."""
    try:
        proc = subprocess.Popen(
            [str(python), str(engine.reader)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_child_env(),
            start_new_session=True,  # its own process group: a timeout kills its children too
        )
    except OSError as exc:
        return "error", f"cannot start {python}: {exc.strerror or exc}"
    try:
        out, err = proc.communicate(json.dumps(request), timeout=engine.timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        return "error", f"no answer within {show(engine.timeout_s)} s (the reader was killed)"
    if proc.returncode != 0:
        return "refused", _last_line(err)
    try:
        answer = json.loads(out)
    except ValueError:
        return "error", f"the reader printed no JSON (exit 0): {out.strip()[:200]!r}"
    if not isinstance(answer, dict) or not isinstance(answer.get("windows"), list):
        return "error", "the reader's JSON has no windows"
    return "ok", answer


def _config_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    return dict(config.to_dict())  # a transformers config instance (a class name as CONFIG)


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
        return EngineResult(name, "not installed", python=str(python),
                            note=f"no {python}; build it with {engine.install}, "
                            f"or give --engine-python {name}=PATH")  # fmt: skip
    wins = windows(readings[0])
    started = time.monotonic()
    status, answer = _call(python, engine, {"config": _config_dict(config), "windows": wins})
    seconds = time.monotonic() - started
    if status != "ok":
        return EngineResult(name, status, python=str(python), note=str(answer), seconds=seconds)
    try:
        result = _judge(name, answer, readings)
    except (ValueError, KeyError, TypeError) as exc:
        return EngineResult(name, "error", python=str(python),
                            note=f"the reader's tables cannot be compared: {exc}")  # fmt: skip
    result.python, result.seconds = str(python), seconds
    return result


def run_engines(
    names: Sequence[str],
    config: Any,
    readings: list[Reading],
    overrides: Mapping[str, str] | None = None,
) -> list[EngineResult]:
    """One :class:`EngineResult` per engine in ``names``, in that order."""
    return [run_engine(n, config, readings, engine_python(n, overrides)) for n in names]


# --------------------------------------------------------------------------------------
# Judging an answer.


def _float32_only(v: Verdict) -> bool:
    return bool(v.cause and v.cause.startswith("float32 angles"))


def _judge(name: str, answer: Mapping[str, Any], readings: list[Reading]) -> EngineResult:
    layout = answer.get("layout")
    notes = [str(answer["note"])] if answer.get("note") else []
    by_type = {r.layer_type: r for r in readings}
    dtype = np.dtype(str(answer.get("dtype", "float32")))
    if dtype not in (np.float16, np.float32, np.float64):
        raise ValueError(f"dtype {dtype} (the reader's values must be float16, 32 or 64)")
    verdicts: list[tuple[dict[str, Any], Verdict]] = []
    for w in answer["windows"]:
        positions = np.asarray(w["positions"], dtype=np.int64)
        # JSON carries no dtype: the reader says which its engine computed in (MLX: float32),
        # and the values are judged with that dtype's tolerance
        arrays: dict[str, npt.NDArray[Any]] = {
            "positions": positions,
            "cos": np.asarray(w["cos"], dtype=dtype),
            "sin": np.asarray(w["sin"], dtype=dtype),
        }
        for v in compare(readings, arrays, source=f"{name} at seq_len {w['seq_len']}"):
            verdicts.append((w, v))
    reference = by_type.get(verdicts[0][1].layer_type, readings[0])
    ref_layout = reference.layout
    max_diff = 0.0
    first: dict[str, Any] | None = None
    for w, v in verdicts:
        diff = _max_abs_diff(w, reference)
        max_diff = max(max_diff, diff)
        if not v.agree and not _float32_only(v) and first is None:
            first = {"seq_len": w["seq_len"], **(v.first or {}), "summary": v.summary}
            if "channel" in first:
                first["pair"] = first.pop("channel")
            if "posenc" in first:
                first["reference"] = first.pop("posenc")
    per_window = [
        {"seq_len": w["seq_len"], "positions": w["positions"], "mode": w.get("mode"),
         "same": v.agree or _float32_only(v), "summary": v.summary}
        for w, v in verdicts
    ]  # fmt: skip
    float32 = [v for _, v in verdicts if not v.agree and _float32_only(v)]
    if float32 and first is None:
        notes.append("differs from the exact tables only as float32 angles do (as "
                     "transformers computes them)")  # fmt: skip
    cause = next((v.cause for _, v in verdicts if not v.agree and not _float32_only(v)), None)
    different = first is not None
    if layout is not None and layout != ref_layout:
        different = True
        notes.append(f"layout: {name} rotates {layout} pairs, transformers {ref_layout}")
    last = answer["windows"][-1]
    ref_scaling = reference.spec.frequencies(seq_len=int(last["seq_len"])).attention_scaling
    theirs_scaling = answer.get("attention_scaling")
    if isinstance(theirs_scaling, (int, float)) and not math.isclose(
        theirs_scaling, ref_scaling, rel_tol=2.0**-20
    ):
        # the reader's scaling is a float32 cos/sin pair's norm: a few float32 ulps
        different = True
        notes.append(f"attention scaling: {name} {theirs_scaling:.6g}, transformers "
                     f"{ref_scaling:.6g} ({reference.scaling.source})")  # fmt: skip
    return EngineResult(
        name,
        "different" if different else "same",
        version=answer.get("version"),
        source=answer.get("source"),
        max_abs_diff=max_diff,
        first_difference=first,
        attention_scaling={"engine": theirs_scaling, "reference": float(ref_scaling)},
        layout={"engine": layout, "reference": ref_layout},
        note="; ".join(notes),
        cause=cause,
        windows=per_window,
    )


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
    lines = [f"{'engine':8}  {'verdict':13}  {'max |diff|':10}  {'scaling (engine / ref)':22}  "
             "version"]  # fmt: skip
    for r in results:
        diff = "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.3g}"
        sc = r.attention_scaling
        scaling = "-"
        if sc.get("engine") is not None:
            scaling = f"{sc['engine']:.6g} / {sc['reference']:.6g}"
        lines.append(f"{r.engine:8}  {r.verdict:13}  {diff:10}  {scaling:22}  {r.version or '-'}")
        if r.first_difference:
            f = r.first_difference
            lines.append(
                f"  first difference: seq_len {f['seq_len']}, position {f.get('position')}, "
                f"pair {f.get('pair')} ({f.get('table')}): {r.engine} {f.get('theirs')!r}, "
                f"transformers {f.get('reference')!r}"
            )
        for w in r.windows:
            if not w["same"]:
                lines.append(f"  seq_len {w['seq_len']}: {w['summary']}")
        if r.cause:
            lines.append(f"  likely cause: {r.cause}")
        if r.note:
            lines.append(f"  note: {r.note}")
    return lines
