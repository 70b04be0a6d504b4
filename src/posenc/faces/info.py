"""``posenc info``: the versions, which backend serves each loop, and the engines found.

What a bug report needs and what a user asks first when posenc is slower than promised:
posenc's and its neighbours' versions, whether the compiled C kernels were built (and
why not), Triton for the rotation on CUDA, and the engines ``posenc rope --engines``
would run, with where each was looked for.
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Line:
    """One line of the report: what, and its state."""

    name: str
    value: str


def _version(package: str, extra: str | None) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return f"not installed (pip install 'posenc[{extra}]')" if extra else "not installed"


def versions() -> list[Line]:
    """posenc, Python and the packages posenc uses, with the extra that brings a missing one."""
    from posenc import __version__

    python = f"{platform.python_version()} ({sys.executable})"
    return [
        Line("posenc", __version__),
        Line("python", python),
        Line("numpy", _version("numpy", None)),
        Line("torch", _version("torch", "torch")),
        Line("triton", _version("triton", None)),
        Line("transformers", _version("transformers", "hf")),
    ]


def backends() -> list[Line]:
    """Which backend serves each loop that has a compiled one."""
    from posenc.core import kernels

    compiled = kernels.compiled
    why = f"numpy and torch: the compiled kernels are not built ({kernels.missing_reason})"

    def served(entry: str, fallback: str) -> str:
        if compiled is None:
            return why if fallback == "numpy" else why.replace("numpy and torch", fallback)
        if hasattr(compiled, entry):
            return f"compiled C ({kernels.MODULE}, up to {kernels.max_workers()} threads)"
        return f"{fallback}: this build of the kernels has no {entry}"

    triton = "Triton" if _version("triton", None) != "not installed" else "torch (no Triton)"
    return [
        Line("sinusoidal table", served("table", "numpy")),
        Line("rotary rotation, CPU", served("rotate", "torch")),
        Line("rotary rotation, CUDA", triton),
        Line("attention loop, CPU", served("attend", "torch")),
        Line("stick-breaking, CPU", served("breaking", "torch")),
        Line("CoPE loop, CPU", served("attend_counted", "torch (checkpointed)")),
        Line("DAPE loop, CPU", served("attend_mixed", "torch (checkpointed)")),
        Line("PaTH core, CPU", served("path_core", "torch")),
    ]


def engines() -> list[Line]:
    """Each engine ``posenc rope --engines`` runs, and where its Python is (or was sought)."""
    from posenc.integration.analysis.engines import ENGINES, engine_python

    found = []
    for name, engine in ENGINES.items():
        python = engine_python(name)
        state = (str(python) if python.is_file()
                 else f"not built ({engine.install} builds {python})")  # fmt: skip
        found.append(Line(name, state))
    return found


def report() -> str:
    """The text ``posenc info`` prints."""
    parts = [("versions", versions()), ("backends", backends()), ("engines", engines())]
    width = max(len(line.name) for _, lines in parts for line in lines)
    out = []
    for title, lines in parts:
        out.append(title)
        out += [f"  {line.name:<{width}}  {line.value}" for line in lines]
    return "\n".join(out)
