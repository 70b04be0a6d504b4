"""Measured properties of positional encodings: the claims people ask about, as numbers.

Every number that ``posenc report``, ``posenc plot``, ``posenc check`` and
``posenc rope`` show is measured here; they only present it. Nothing here prints,
and importing it needs only numpy (torch, mpmath and transformers are imported by
the measurements that use them).

- :mod:`.sinusoidal`: :func:`shift_error`, :func:`norms`,
  :func:`offset_dot_products`, :func:`regression_r2` (one column against its
  (sin, cos) pair), :func:`geometry`, :func:`permutation_check` (why
  attention needs positions), :func:`add_concat` (adding a position to a token
  embedding, at two scales, or concatenating it).
- :mod:`.precision`: :func:`precision_report` (float32 at large positions),
  :func:`precision_curves`, :func:`exp_log_forms`, :func:`exp_log_errors`
  (the two frequency forms pair by pair, and the ``h - 1`` denominator).
- :mod:`.rotary`: :func:`rope_relative`, :func:`rope_decay`, :func:`scaling_curves`.
- :mod:`.learned`: :func:`train_learned`, a learned table from a tiny training run.
- :mod:`.timesteps`: :func:`timestep_presets` (one diffusion timestep through
  the ``ddpm``, ``ldm`` and ``annotated-diffusion`` conventions, and how alike
  neighbouring timesteps are), :func:`index_features` (the raw index and the
  index over the length as features, against the bounded table).
- :mod:`.verdicts`: :func:`check`, the rows of ``posenc check`` with their PASS/FAIL.
- :mod:`.rope_reading`: ``read`` (a model's RoPE config per layer type, every
  setting with the key it came from), ``nope_layers``, ``describe`` (what
  ``posenc rope`` prints).
- :mod:`.rope_compare`: ``golden_tables`` (the exact tables of ``posenc rope
  --golden``), ``compare`` (another engine's tables against them, with the likely
  misreading).

Bounds are derived from float64 rounding, in units of :data:`EPS`.
"""

from __future__ import annotations

from posenc.integration.analysis._table import EPS as EPS
from posenc.integration.analysis.learned import Learned as Learned
from posenc.integration.analysis.learned import train_learned
from posenc.integration.analysis.precision import (
    ExpLogErrors as ExpLogErrors,
)
from posenc.integration.analysis.precision import (
    PrecisionPoint as PrecisionPoint,
)
from posenc.integration.analysis.precision import (
    PrecisionReport as PrecisionReport,
)
from posenc.integration.analysis.precision import (
    exp_log_errors,
    exp_log_forms,
    precision_curves,
    precision_report,
)
from posenc.integration.analysis.rotary import rope_decay, rope_relative, scaling_curves
from posenc.integration.analysis.sinusoidal import (
    AddConcat as AddConcat,
)
from posenc.integration.analysis.sinusoidal import (
    DotProducts as DotProducts,
)
from posenc.integration.analysis.sinusoidal import (
    Norms as Norms,
)
from posenc.integration.analysis.sinusoidal import (
    PermutationCheck as PermutationCheck,
)
from posenc.integration.analysis.sinusoidal import (
    Regression as Regression,
)
from posenc.integration.analysis.sinusoidal import (
    ShiftError as ShiftError,
)
from posenc.integration.analysis.sinusoidal import (
    add_concat,
    geometry,
    norms,
    offset_dot_products,
    permutation_check,
    regression_r2,
    shift_error,
)
from posenc.integration.analysis.timesteps import (
    TIMESTEP_PRESETS as TIMESTEP_PRESETS,
)
from posenc.integration.analysis.timesteps import (
    IndexFeatures as IndexFeatures,
)
from posenc.integration.analysis.timesteps import (
    TimestepPresets as TimestepPresets,
)
from posenc.integration.analysis.timesteps import (
    index_features,
    timestep_presets,
)
from posenc.integration.analysis.verdicts import Verdict as Verdict
from posenc.integration.analysis.verdicts import check

__all__ = [
    "add_concat",
    "check",
    "exp_log_errors",
    "exp_log_forms",
    "geometry",
    "index_features",
    "norms",
    "offset_dot_products",
    "permutation_check",
    "precision_curves",
    "precision_report",
    "regression_r2",
    "rope_decay",
    "rope_relative",
    "scaling_curves",
    "shift_error",
    "timestep_presets",
    "train_learned",
]
