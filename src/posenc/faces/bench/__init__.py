"""Benchmarks: posenc against the code users run today, timed in one process.

- :mod:`~posenc.faces.bench.harness`: :class:`Impl`, :class:`Case`,
  :class:`Timing`, the interleaved timing loop (:func:`run`, :func:`run_case`),
  :func:`peak_memory`, the tables and JSON, and the registry :data:`CASES`.
- One module per family of cases, each listing its cases as ``CASES``:
  :mod:`~posenc.faces.bench.sinusoidal` (``sinusoidal-table``),
  :mod:`~posenc.faces.bench.rotary` (``rotary-*``),
  :mod:`~posenc.faces.bench.image_rotary` (``rope-mixed``, ``rope-mixed-backward``),
  :mod:`~posenc.faces.bench.polar` (``pope``, ``pope-backward``),
  :mod:`~posenc.faces.bench.attention` (``attention-bias``, ``attention-bias-train``) and
  :mod:`~posenc.faces.bench.decode` (``decode``, ``decode-bfloat16``).

They are registered here in that order, the order ``posenc bench`` runs and
prints them. Each case says which devices it runs on (``posenc bench --device
cpu|cuda``): all but ``sinusoidal-table`` (numpy) run on CUDA too, and
``decode-bfloat16`` on CUDA only. Nothing here imports torch or a peer at
module import time.
"""

from __future__ import annotations

from posenc.faces.bench import attention, decode, image_rotary, polar, rotary, sinusoidal
from posenc.faces.bench.harness import (
    CASES as CASES,
)
from posenc.faces.bench.harness import (
    DEVICES as DEVICES,
)
from posenc.faces.bench.harness import (
    Case as Case,
)
from posenc.faces.bench.harness import (
    Impl as Impl,
)
from posenc.faces.bench.harness import (
    Timing as Timing,
)
from posenc.faces.bench.harness import (
    format_table as format_table,
)
from posenc.faces.bench.harness import (
    peak_memory as peak_memory,
)
from posenc.faces.bench.harness import (
    register,
)
from posenc.faces.bench.harness import (
    run as run,
)
from posenc.faces.bench.harness import (
    run_case as run_case,
)
from posenc.faces.bench.harness import (
    to_json as to_json,
)

for _case in (
    *sinusoidal.CASES,
    *rotary.CASES,
    *image_rotary.CASES,
    *polar.CASES,
    *attention.CASES,
    *decode.CASES,
):
    register(_case)
del _case
