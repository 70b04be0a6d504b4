"""posenc lab: train small transformers with every encoding and measure length extrapolation.

- :mod:`posenc.lab.tasks`: copy, reverse, sort, associative recall, addition
  (generated on the fly, seeded) and a byte-level language model over the
  Python standard library's sources;
- :mod:`posenc.lab.encodings`: every encoding as data (its position pieces
  and test-time scaling), importable without torch;
- :mod:`posenc.lab.model`: a small decoder-only transformer from posenc's
  pieces, one positional encoding per model;
- :mod:`posenc.lab.training`: training (cached, resumable; under torchrun DDP, and
  context parallelism with ring attention) and evaluation at every length;
- :mod:`posenc.lab.probes`: linear probes of where each layer's residual stream
  keeps the absolute position;
- :mod:`posenc.lab.results`: the figure and HTML page, and ``results.json`` read
  back (probes and trained bias modules included).

``posenc lab run`` is the command; :func:`run` with a :class:`LabConfig` is the same
from Python. Needs torch (and matplotlib for the figure).
"""

from typing import Any

from posenc.faces.lab.encodings import ENCODINGS

# torch-backed names, imported on first use
_LAZY = {"LabConfig": "posenc.faces.lab.training", "run": "posenc.faces.lab.training"}

__all__ = [
    "ENCODINGS",
    "LabConfig",
    "run",
]


def __getattr__(name: str) -> Any:
    from posenc.core import extras

    return extras.attribute("posenc.lab", _LAZY, name)
