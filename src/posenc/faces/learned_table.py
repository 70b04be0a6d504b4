"""The explainer's learned table, trained once and bundled, as the lab's results are.

``posenc report`` shows a learned position table from a tiny training run
(:func:`posenc.analysis.train_learned`: 32 positions x 32 channels, 300 steps,
16 tokens, seed 0). Training is deterministic on CPU, so that run is bundled
(``posenc/faces/data/learned-table.json``) and read back instead of trained at
every build: :func:`trained` returns the bundled run when asked for its
settings and trains only for others (``posenc report --train-steps N`` with
another N, ``posenc plot learned`` at other sizes).

``python -m posenc.faces.learned_table [OUT]`` (``make learned-table``) trains
the run again and writes the bundled file (or ``OUT``): the same bytes, as long
as torch computes the same floats.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from posenc.core.files import atomic_write
from posenc.integration.analysis.learned import Learned, train_learned

#: The bundled run's file name in ``posenc/faces/data``.
BUNDLED = "learned-table.json"

#: The bundled run's settings: :func:`posenc.analysis.train_learned`'s defaults.
SETTINGS: Mapping[str, int] = {"length": 32, "dim": 32, "steps": 300, "vocab": 16, "seed": 0}


def document(learned: Learned, settings: Mapping[str, int]) -> dict[str, Any]:
    """The JSON document of a run: its ``settings``, accuracy and table (not its time).

    The table's entries are the trained float32 values as float64, which JSON
    writes and reads back exactly; the training time is left out, so that the
    same run gives the same document.
    """
    return {
        "settings": dict(settings),
        "accuracy": learned.accuracy,
        "table": np.asarray(learned.table, dtype=np.float64).tolist(),
    }


def text(doc: Mapping[str, Any]) -> str:
    """``doc`` as the file's text: one line per table row, a newline at the end."""
    rows = ",\n  ".join(json.dumps(row) for row in doc["table"])
    head = json.dumps({k: v for k, v in doc.items() if k != "table"}, indent=1)
    return f'{head[:-2]},\n "table": [\n  {rows}\n ]\n}}\n'


def read(doc: Mapping[str, Any]) -> Learned:
    """The :class:`~posenc.analysis.Learned` of a document (``seconds`` 0: not trained now).

    Raises:
        ValueError: ``doc`` lacks ``settings``, ``accuracy`` or ``table``, or its table
            is not ``settings``' ``length`` x ``dim``.
    """
    for key in ("settings", "accuracy", "table"):
        if key not in doc:
            raise ValueError(f"a learned-table document must hold {key!r}")
    settings = doc["settings"]
    table = np.asarray(doc["table"], dtype=np.float64)
    if table.shape != (settings["length"], settings["dim"]):
        raise ValueError(
            f"the table is {table.shape}, not length x dim = "
            f"{(settings['length'], settings['dim'])}"
        )
    return Learned(table, float(doc["accuracy"]), int(settings["steps"]), 0.0)


def bundled() -> Learned:
    """The bundled run (:data:`SETTINGS`), read back."""
    path = resources.files("posenc.faces") / "data" / BUNDLED
    return read(json.loads(path.read_text()))


def trained(**settings: int) -> Learned:
    """A learned table at ``settings`` (:func:`posenc.analysis.train_learned`'s arguments).

    The bundled run where ``settings``, with the defaults filled in, are
    :data:`SETTINGS`; otherwise a run trained now.

    Examples:
        >>> from posenc.faces import learned_table
        >>> learned_table.trained(steps=300).seconds  # the bundled run: nothing trained
        0.0
        >>> learned_table.trained().table.shape
        (32, 32)
    """
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
    full = {**SETTINGS, **settings}
    if full == SETTINGS:
        return bundled()
    return train_learned(**full)


def write(doc: Mapping[str, Any], path: Path) -> None:
    """Write ``doc`` to ``path`` atomically (:func:`posenc.core.files.atomic_write`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "w") as f:
        f.write(text(doc))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m posenc.faces.learned_table [OUT]``: train :data:`SETTINGS`' run, write it."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    out = Path(args[0]) if args else Path(str(resources.files("posenc.faces"))) / "data" / BUNDLED
    run = train_learned(**SETTINGS)
    write(document(run, SETTINGS), out)
    print(f"wrote {out} (copy accuracy {100 * run.accuracy:.1f}%, {run.seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
