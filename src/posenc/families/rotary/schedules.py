"""Frequency schedules of rotary embeddings: one registry, one signature.

Every schedule maps ``(rotary_dim, base, params)`` to the angular frequencies
``omega_k`` (``k < rotary_dim / 2``) and the attention scaling that multiplies
cos and sin, as HF transformers' ``ROPE_INIT_FUNCTIONS`` do. posenc computes
the frequencies in 40-digit decimal arithmetic, so that the exact angle
engine (:mod:`posenc.core.angles`) can evaluate ``position * omega_k`` exactly;
HF computes them in float32.

Base rule (Su et al. 2021; HF ``_compute_default_rope_parameters``):
``omega_k = base ** (-2k / rotary_dim)``, the exponent over the *rotary*
dim, not the head dim (transformers PR #48652).

The schedules and the keys of their ``params`` (HF ``rope_parameters`` names,
without ``rope_type`` and ``rope_theta``; :data:`PARAMETERS` holds them as
data; ``[...]`` marks optional keys):

- ``default``: none.
- ``linear``, ``ntk``: ``factor``.
- ``dynamic``: ``factor``, ``max_position_embeddings`` (a config attribute in
  HF); uses ``seq_len``.
- ``yarn``: ``factor``, ``original_max_position_embeddings``,
  [``attention_factor``, ``beta_fast``, ``beta_slow``, ``mscale``,
  ``mscale_all_dim``, ``truncate``].
- ``llama3``: ``factor``, ``low_freq_factor``, ``high_freq_factor``,
  ``original_max_position_embeddings``.
- ``longrope``: ``short_factor``, ``long_factor``,
  ``original_max_position_embeddings``, [``factor``, ``attention_factor``,
  ``max_position_embeddings``]; uses ``seq_len``.
- ``proportional``: [``partial_rotary_factor``, ``factor``], with ``rotary_dim``
  the whole head dim (the one schedule that takes the partial factor itself).
- ``resonance``: none; ``resonance_yarn``: ``yarn``'s keys. Resonance RoPE: the
  default or YaRN frequencies with every wavelength rounded to an integer.

For every other schedule the caller applies ``partial_rotary_factor`` by
passing ``rotary_dim = int(head_dim * partial_rotary_factor)``.
"""

from __future__ import annotations

import decimal
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from posenc.core import checks
from posenc.core.angles import PI, Turns, decimal_context, turns_from_radians

__all__ = [
    "SCHEDULES",
    "RopeFrequencies",
    "default",
    "dynamic",
    "frequencies",
    "linear",
    "llama3",
    "longrope",
    "ntk",
    "proportional",
    "register",
    "resonance",
    "resonance_yarn",
    "stretched",
    "yarn",
]

_CTX = decimal_context()


@dataclass(frozen=True)
class RopeFrequencies:
    """The frequencies of one rotary embedding and its attention scaling.

    Attributes:
        omega: exact angular frequencies (radians per position), one per pair.
        attention_scaling: multiplies cos and sin (YaRN's mscale, LongRoPE's
            factor); 1.0 for most schedules.

    Examples:
        >>> import torch
        >>> from posenc.rotary.schedules import frequencies
        >>> f = frequencies("linear", 8, 10000.0, {"factor": 2.0})
        >>> f.omega[1]  # exact, 40 digits
        Decimal('0.0500000000000000000000000000000000000000')
        >>> f.inv_freq.tolist(), f.attention_scaling
        ([0.5, 0.05, 0.005, 0.0005], 1.0)
        >>> torch.from_numpy(f.inv_freq).float()  # as HF's inv_freq buffer
        tensor([0.5000, 0.0500, 0.0050, 0.0005])
    """

    omega: tuple[decimal.Decimal, ...]
    attention_scaling: float = 1.0

    @functools.cached_property
    def turns(self) -> Turns:
        """The frequencies prepared for the exact angle engine."""
        return turns_from_radians(self.omega)

    @property
    def inv_freq(self) -> npt.NDArray[np.float64]:
        """The frequencies as float64 (HF's ``inv_freq``, which is float32)."""
        return self.turns.radians.copy()


#: A frequency schedule: ``(rotary_dim, base, params, *, head_dim, seq_len)`` to
#: :class:`RopeFrequencies`.
Schedule = Callable[..., RopeFrequencies]
#: Every schedule by HF's ``rope_type``: a :data:`Schedule` each (:func:`register` adds one).
SCHEDULES: dict[str, Schedule] = {}
#: rope_type -> (required keys, optional keys) of its ``params``
PARAMETERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
#: How a context-extension schedule is set to stretch a model: ``(factor, original,
#: rotary_dim, base)`` to its ``params``, for a model trained at ``original`` tokens run
#: at ``factor * original``.
Stretch = Callable[[float, int, int, float], dict[str, Any]]
#: rope_type -> its :data:`Stretch`, for the schedules that extend a context
#: (:func:`stretched` reads it; ``default``, ``proportional`` and ``resonance`` have none).
STRETCH: dict[str, Stretch] = {}


def register(
    name: str,
    required: tuple[str, ...] = (),
    optional: tuple[str, ...] = (),
    stretch: Stretch | None = None,
) -> Callable[[Schedule], Schedule]:
    """Add a schedule to :data:`SCHEDULES` under ``name``, with the keys it takes.

    ``stretch``, for a schedule that extends a context, gives its parameters for a
    model trained at ``original`` tokens run at ``factor`` times that:
    ``stretch(factor, original, rotary_dim, base) -> params``. :func:`stretched` reads
    it, and with it ``posenc lab extend`` measures the schedule beside the others.

    Examples:
        >>> import posenc
        >>> from posenc.rotary.schedules import default, frequencies, register, stretched
        >>> @register("base_scaled", required=("factor",),
        ...           stretch=lambda factor, original, rotary_dim, base: {"factor": factor})
        ... def base_scaled(rotary_dim, base, params, *, head_dim=None, seq_len=None):
        ...     return default(rotary_dim, base * params["factor"], {})  # a larger base
        >>> frequencies("base_scaled", 4, 100.0, {"factor": 100.0}).inv_freq.tolist()
        [1.0, 0.01]
        >>> posenc.Rotary(4, base=100.0, scaling={"rope_type": "base_scaled", "factor": 100.0})
        Rotary(4, base=100, layout='half', rope_type='base_scaled')
        >>> stretched("base_scaled", 4.0, 2048, rotary_dim=4, base=100.0)
        {'rope_type': 'base_scaled', 'factor': 4.0}
    """

    def add(fn: Schedule) -> Schedule:
        SCHEDULES[name] = fn
        PARAMETERS[name] = (frozenset(required), frozenset(optional))
        if stretch is not None:
            STRETCH[name] = stretch
        else:
            STRETCH.pop(name, None)
        return fn

    return add


def stretched(
    rope_type: str, factor: float, original: int, *, rotary_dim: int, base: float
) -> dict[str, Any]:
    """The ``rope_scaling`` that runs a model trained at ``original`` tokens at ``factor`` times.

    Each context-extension schedule sets its own keys (its ``stretch``, given to
    :func:`register`):

    - ``linear`` and ``ntk``: ``factor``;
    - ``dynamic``: ``factor`` 1 and ``max_position_embeddings = original``, the
      scale ``max(1, seq_len / original)`` of Peng et al. 2023 (YaRN, section 3.3),
      computed at each length, so one setting serves every length;
    - ``yarn`` and ``resonance_yarn``: ``factor`` and
      ``original_max_position_embeddings`` (the default betas and attention factor);
    - ``llama3``: ``factor``, Llama 3.1's ``low_freq_factor`` 1 and
      ``high_freq_factor`` 4, ``original_max_position_embeddings``;
    - ``longrope``: ``short_factor`` all 1 (the trained frequencies within
      ``original``) and ``long_factor`` YaRN's own per-pair stretch at ``factor``
      (``omega_k / omega'_k``): LongRoPE finds its factors by an evolutionary search
      on the trained model, which this stands in for; ``factor``, the original and
      extended lengths.

    Args:
        rope_type: a schedule with a stretch (:data:`STRETCH`).
        factor: the extended length over ``original`` (> 1).
        original: the trained context, in tokens.
        rotary_dim: the channels that rotate.
        base: ``rope_theta``.

    Raises:
        ValueError: a schedule that extends no context (the ones that do are listed),
            ``factor`` not above 1, ``original`` below 2.

    Examples:
        >>> from posenc.rotary.schedules import stretched
        >>> stretched("yarn", 4.0, 64, rotary_dim=16, base=10000.0)
        {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 64}
        >>> stretched("default", 4.0, 64, rotary_dim=16, base=10000.0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: rope_type 'default' extends no context; accepted: linear, ntk, dynamic, ...
    """
    if rope_type not in STRETCH:
        raise ValueError(f"rope_type {rope_type!r} extends no context; accepted: "
                         f"{', '.join(STRETCH)}")  # fmt: skip
    factor = checks.check_number(factor, "factor", positive=True)
    if not factor > 1:
        raise ValueError(f"factor must be > 1 (the extended length over the trained one); "
                         f"got {factor}")  # fmt: skip
    original = checks.check_int(original, "original", minimum=2)
    rotary_dim = checks.check_channels(rotary_dim, "rotary_dim", minimum=2)
    base = checks.check_number(base, "base", positive=True)
    return {"rope_type": rope_type, **STRETCH[rope_type](factor, original, rotary_dim, base)}


def _factor_only(factor: float, original: int, rotary_dim: int, base: float) -> dict[str, Any]:
    return {"factor": factor}


def _with_original(factor: float, original: int, rotary_dim: int, base: float) -> dict[str, Any]:
    return {"factor": factor, "original_max_position_embeddings": original}


def base_exponents(rotary_dim: int, base: float) -> list[decimal.Decimal]:
    """``base ** (-2k / rotary_dim)`` for ``k < rotary_dim / 2``, exactly."""
    return _powers(rotary_dim // 2, rotary_dim, _CTX.ln(decimal.Decimal(base)))


def _powers(count: int, dim: int, log_base: decimal.Decimal) -> list[decimal.Decimal]:
    """``exp(-2k / dim * log_base)`` for ``k < count``."""
    d = decimal.Decimal(dim)
    # every operation in _CTX: bare Decimal arithmetic would round to the thread's 28 digits
    return [_CTX.exp(_CTX.divide(_CTX.multiply(-2 * k, log_base), d)) for k in range(count)]


def check_params(
    params: Mapping[str, Any], name: str, allowed: set[str], required: set[str]
) -> None:
    """Reject missing and unknown keys of a schedule's parameters, naming them."""
    missing = sorted(required - set(params))
    if missing:
        raise ValueError(f"rope type {name!r} needs {', '.join(missing)}")
    extra = sorted(set(params) - allowed)
    if extra:
        raise ValueError(
            f"rope type {name!r} does not take {', '.join(extra)}; "
            f"it takes {', '.join(sorted(allowed)) or 'no parameters'}"
        )


def _check(params: Mapping[str, Any], name: str) -> None:
    required, optional = PARAMETERS[name]
    check_params(params, name, set(required | optional), set(required))


@register("default")
def default(
    rotary_dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
) -> RopeFrequencies:
    """Unscaled RoPE: ``base ** (-2k / rotary_dim)``.

    Examples:
        >>> from posenc.rotary.schedules import default
        >>> default(8, 10000.0, {}).inv_freq.tolist()
        [1.0, 0.1, 0.01, 0.001]
    """
    _check(params, "default")
    return RopeFrequencies(tuple(base_exponents(rotary_dim, base)))


@register("linear", required=("factor",), stretch=_factor_only)
def linear(
    rotary_dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
) -> RopeFrequencies:
    """Position interpolation (kaiokendev; HF ``linear``): the default divided by ``factor``.

    Examples:
        >>> from posenc.rotary.schedules import linear
        >>> linear(8, 10000.0, {"factor": 2.0}).inv_freq.tolist()
        [0.5, 0.05, 0.005, 0.0005]
    """
    _check(params, "linear")
    factor = _factor(params["factor"])
    f = decimal.Decimal(factor)
    return RopeFrequencies(tuple(_CTX.divide(w, f) for w in base_exponents(rotary_dim, base)))


def _factor(value: Any, name: str = "factor") -> float:
    factor = checks.check_number(value, name)
    if factor < 1.0:
        raise ValueError(f"{name} must be >= 1; got {value!r}")
    return factor


def _optional(params: Mapping[str, Any], key: str) -> Any:
    """``params[key]``, with ``None`` meaning absent (as HF's ``dict.get`` reads it)."""
    return params.get(key)


def _positive(params: Mapping[str, Any], key: str) -> float | None:
    value = _optional(params, key)
    return None if value is None else checks.check_number(value, key, positive=True)


def _seq_len(seq_len: Any) -> int | None:
    return None if seq_len is None else checks.check_int(seq_len, "seq_len", minimum=0)


def _dec(x: float) -> decimal.Decimal:
    return decimal.Decimal(x)  # exact: a float is a dyadic rational


def _ntk_powers(
    rotary_dim: int, base: float, scale: decimal.Decimal, name: str
) -> list[decimal.Decimal]:
    """``(base * scale ** (d / (d - 2))) ** (-2k / d)``: NTK-aware base change."""
    if rotary_dim < 4:
        raise ValueError(
            f"rope type {name!r} needs rotary_dim >= 4 (its exponent d / (d - 2) "
            f"is infinite at d = 2); got {rotary_dim}"
        )
    d = decimal.Decimal(rotary_dim)
    log_base = _CTX.ln(_dec(base))
    if scale != 1:
        log_base = _CTX.add(log_base, _CTX.multiply(_CTX.divide(d, d - 2), _CTX.ln(scale)))
    return _powers(rotary_dim // 2, rotary_dim, log_base)


@register("ntk", required=("factor",), stretch=_factor_only)
def ntk(
    rotary_dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
) -> RopeFrequencies:
    """Static NTK-aware scaling (bloc97, 2023): ``base' = base * factor ** (d / (d - 2))``.

    Not an HF type: it is HF's ``dynamic`` frozen at ``seq_len = factor *
    max_position_embeddings`` with factor 1. Takes ``factor`` (>= 1).

    Examples:
        >>> from posenc.rotary.schedules import default, ntk
        >>> f = ntk(8, 10000.0, {"factor": 4.0})
        >>> f.inv_freq.round(6).tolist()
        [1.0, 0.062996, 0.003969, 0.00025]
        >>> (default(8, 10000.0, {}).inv_freq / f.inv_freq).round(4).tolist()  # up to factor
        [1.0, 1.5874, 2.5198, 4.0]
    """
    _check(params, "ntk")
    factor = _factor(params["factor"])
    return RopeFrequencies(tuple(_ntk_powers(rotary_dim, base, _dec(factor), "ntk")))


@register(
    "dynamic",
    required=("factor", "max_position_embeddings"),
    stretch=lambda factor, original, rotary_dim, base: {
        "factor": 1.0,
        "max_position_embeddings": original,
    },
)
def dynamic(
    rotary_dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
) -> RopeFrequencies:
    """Dynamic NTK scaling (bloc97, emozilla; HF ``_compute_dynamic_ntk_parameters``).

    With ``L = max(seq_len, max_position_embeddings)`` (``seq_len`` None means
    ``max_position_embeddings``, HF's value at init) and ``m =
    max_position_embeddings``: ``base' = base * (factor * L / m - (factor - 1))
    ** (d / (d - 2))``. At ``seq_len <= m`` the scale is exactly 1 and the
    result is exactly the default schedule: that is the restore that callers
    must apply when a sequence falls back below ``m`` (transformers #25104).

    Takes ``factor`` (>= 1) and ``max_position_embeddings`` (HF reads the latter
    from the model config).

    Examples:
        >>> from posenc.rotary.schedules import dynamic
        >>> params = {"factor": 2.0, "max_position_embeddings": 2048}
        >>> dynamic(8, 10000.0, params, seq_len=1024).inv_freq.tolist()  # the default
        [1.0, 0.1, 0.01, 0.001]
        >>> dynamic(8, 10000.0, params, seq_len=4096).inv_freq.round(6).tolist()
        [1.0, 0.069336, 0.004807, 0.000333]
    """
    _check(params, "dynamic")
    factor = _factor(params["factor"])
    max_pos = checks.check_int(
        params["max_position_embeddings"], "max_position_embeddings", minimum=1
    )
    length = max(_seq_len(seq_len) or 0, max_pos)
    # factor * L / m - (factor - 1) written as 1 + factor * (L - m) / m: exactly 1 at L == m
    scale = _CTX.add(
        1, _CTX.divide(_CTX.multiply(_dec(factor), decimal.Decimal(length - max_pos)), max_pos)
    )
    return RopeFrequencies(tuple(_ntk_powers(rotary_dim, base, scale, "dynamic")))


def _get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 * mscale * ln(scale) + 1`` (1 for ``scale <= 1``)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


@register(
    "yarn",
    required=("factor", "original_max_position_embeddings"),
    optional=(
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    ),
    stretch=_with_original,
)
def yarn(
    rotary_dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
) -> RopeFrequencies:
    """YaRN (Peng et al. 2023, arXiv:2309.00071; HF ``_compute_yarn_parameters``).

    Frequencies blend interpolation (``omega / factor``) and extrapolation
    (``omega``) with a linear ramp over the pair index ``k``: with
    ``corr(r) = d ln(L / (2 pi r)) / (2 ln base)``, ``low = corr(beta_fast)``,
    ``high = corr(beta_slow)``, floored and ceiled when ``truncate`` (the
    default; gpt-oss sets it false), clamped to ``[max(low, 0), min(high, d -
    1)]``, ``high += 0.001`` if they are equal, ``ramp_k = clamp((k - low) /
    (high - low), 0, 1)`` and ``omega'_k = omega_k (ramp_k / factor + 1 - ramp_k)``.

    The attention scaling is ``attention_factor`` when given (it always wins,
    mlx-lm PR #1507); else, when ``mscale`` and ``mscale_all_dim`` are both
    non-zero, ``get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)``;
    else ``get_mscale(factor) = 0.1 ln(factor) + 1``. (DeepSeek V2/V3 also scale
    the softmax by ``get_mscale(factor, mscale_all_dim) ** 2``: the caller's part.)

    Takes ``factor`` (>= 1), ``original_max_position_embeddings``, and optionally
    ``attention_factor`` (> 0), ``beta_fast`` (> 0, default 32), ``beta_slow``
    (> 0, default 1), ``mscale``, ``mscale_all_dim``, ``truncate`` (bool, default
    True). ``None`` means absent, except for ``truncate``, which must be a bool
    (HF would read ``None`` as false). HF turns a zero beta into its default;
    posenc rejects it.

    Examples:
        >>> from posenc.rotary.schedules import default, yarn
        >>> f = yarn(16, 10000.0, {"factor": 4.0, "original_max_position_embeddings": 2048})
        >>> (default(16, 10000.0, {}).inv_freq / f.inv_freq).round(4).tolist()
        [1.0, 1.0, 1.0, 1.2308, 1.6, 2.2857, 4.0, 4.0]
        >>> round(f.attention_scaling, 4)  # 0.1 ln(4) + 1
        1.1386
    """
    _check(params, "yarn")
    factor = _factor(params["factor"])
    original = checks.check_int(
        params["original_max_position_embeddings"], "original_max_position_embeddings", minimum=1
    )
    attention_factor = _positive(params, "attention_factor")
    mscale = _optional(params, "mscale")
    mscale_all_dim = _optional(params, "mscale_all_dim")
    mscale = None if mscale is None else checks.check_number(mscale, "mscale")
    mscale_all_dim = (
        None if mscale_all_dim is None else checks.check_number(mscale_all_dim, "mscale_all_dim")
    )
    beta_fast = _positive(params, "beta_fast") or 32.0
    beta_slow = _positive(params, "beta_slow") or 1.0
    truncate = params.get("truncate", True)
    checks.check_bool(truncate, "truncate")
    if base <= 1:
        raise ValueError(f"rope type 'yarn' needs base > 1 (it divides by ln base); got {base}")

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _get_mscale(factor, mscale) / _get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _get_mscale(factor)

    d = decimal.Decimal(rotary_dim)
    two_ln_base = _CTX.multiply(2, _CTX.ln(_dec(base)))
    two_pi = _CTX.multiply(2, PI)

    def correction_dim(rotations: float) -> decimal.Decimal:
        ratio = _CTX.divide(original, _CTX.multiply(two_pi, _dec(rotations)))
        return _CTX.divide(_CTX.multiply(d, _CTX.ln(ratio)), two_ln_base)

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low = low.to_integral_value(decimal.ROUND_FLOOR)
        high = high.to_integral_value(decimal.ROUND_CEILING)
    low, high = max(low, decimal.Decimal(0)), min(high, d - 1)
    if low == high:
        high = _CTX.add(high, decimal.Decimal("0.001"))  # HF's guard against 0 / 0
    f = _dec(factor)
    omega = []
    for k, w in enumerate(base_exponents(rotary_dim, base)):
        ramp = _CTX.divide(_CTX.subtract(k, low), _CTX.subtract(high, low))
        ramp = min(max(ramp, decimal.Decimal(0)), decimal.Decimal(1))
        blend = _CTX.add(_CTX.divide(ramp, f), _CTX.subtract(1, ramp))
        omega.append(_CTX.multiply(w, blend))
    return RopeFrequencies(tuple(omega), float(attention_factor))


@register(
    "llama3",
    required=(
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    ),
    # Llama 3.1's own settings (its config.json: low 1, high 4)
    stretch=lambda factor, original, rotary_dim, base: {
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": original,
    },
)
def llama3(
    rotary_dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
) -> RopeFrequencies:
    """Llama 3.1 scaling (Meta ``apply_scaling``; HF ``_compute_llama3_parameters``).

    With ``wavelen = 2 pi / omega`` and ``L = original_max_position_embeddings``:
    wavelengths above ``L / low_freq_factor`` are divided by ``factor``, those
    below ``L / high_freq_factor`` are kept, and in between ``s = (L / wavelen -
    low_freq_factor) / (high_freq_factor - low_freq_factor)``, ``omega' = (1 - s)
    omega / factor + s omega``. Meta's values: 8, 1, 4, 8192.

    Takes ``factor`` (>= 1), ``low_freq_factor`` (> 0), ``high_freq_factor``
    (> ``low_freq_factor``) and ``original_max_position_embeddings``.

    Examples:
        >>> from posenc.rotary.schedules import default, llama3
        >>> params = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        ...           "original_max_position_embeddings": 8192}
        >>> f = llama3(16, 500000.0, params)
        >>> (default(16, 500000.0, {}).inv_freq / f.inv_freq).round(4).tolist()
        [1.0, 1.0, 1.0, 1.0, 2.6945, 8.0, 8.0, 8.0]
    """
    _check(params, "llama3")
    factor = _factor(params["factor"])
    low_ff = checks.check_number(params["low_freq_factor"], "low_freq_factor", positive=True)
    high_ff = checks.check_number(params["high_freq_factor"], "high_freq_factor", positive=True)
    if high_ff <= low_ff:
        raise ValueError(f"high_freq_factor must be > low_freq_factor; got {high_ff} and {low_ff}")
    original = checks.check_int(
        params["original_max_position_embeddings"], "original_max_position_embeddings", minimum=1
    )
    f, lo_f, hi_f = _dec(factor), _dec(low_ff), _dec(high_ff)
    low_wavelen = _CTX.divide(original, lo_f)
    high_wavelen = _CTX.divide(original, hi_f)
    two_pi = _CTX.multiply(2, PI)
    omega = []
    for w in base_exponents(rotary_dim, base):
        wavelen = _CTX.divide(two_pi, w)
        if wavelen > low_wavelen:
            omega.append(_CTX.divide(w, f))
        elif wavelen < high_wavelen:
            omega.append(w)
        else:
            s = _CTX.divide(
                _CTX.subtract(_CTX.divide(original, wavelen), lo_f), _CTX.subtract(hi_f, lo_f)
            )
            blend = _CTX.add(_CTX.divide(_CTX.subtract(1, s), f), s)
            omega.append(_CTX.multiply(w, blend))
    return RopeFrequencies(tuple(omega))


def _factor_list(value: Any, name: str, count: int) -> list[float]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a list of {count} numbers; got {value!r}")
    if len(value) != count:
        raise ValueError(f"{name} must have rotary_dim / 2 = {count} entries; got {len(value)}")
    return [checks.check_number(v, f"{name}[{i}]", positive=True) for i, v in enumerate(value)]


def _longrope_stretch(factor: float, original: int, rotary_dim: int, base: float) -> dict[str, Any]:
    """LongRoPE's factors as YaRN's per-pair stretch (:func:`stretched` says why)."""
    plain = default(rotary_dim, base, {}).inv_freq
    blended = yarn(rotary_dim, base, _with_original(factor, original, rotary_dim, base)).inv_freq
    long_factor = [float(x) for x in plain / blended]
    return {"short_factor": [1.0] * (rotary_dim // 2), "long_factor": long_factor,
            "factor": factor, "original_max_position_embeddings": original,
            "max_position_embeddings": math.ceil(factor * original)}  # fmt: skip


@register(
    "longrope",
    required=("short_factor", "long_factor", "original_max_position_embeddings"),
    optional=("factor", "attention_factor", "max_position_embeddings"),
    stretch=lambda factor, original, rotary_dim, base: _longrope_stretch(
        factor, original, rotary_dim, base
    ),
)
def longrope(
    rotary_dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
) -> RopeFrequencies:
    """LongRoPE (Ding et al. 2024, arXiv:2402.13753; HF ``_compute_longrope_parameters``).

    ``omega'_k = omega_k / ext_k`` with ``ext = long_factor`` when ``seq_len >
    original_max_position_embeddings`` (strictly: at exactly the original
    length the short factors apply, unsloth PR #10681) and ``short_factor``
    otherwise, including ``seq_len`` None. ``factor`` defaults to
    ``max_position_embeddings / original_max_position_embeddings`` (Phi-3);
    the attention scaling is ``attention_factor`` when given, else
    ``sqrt(1 + ln(factor) / ln(original_max_position_embeddings))`` if
    ``factor > 1``, else 1.

    Takes ``short_factor`` and ``long_factor`` (``rotary_dim / 2`` positive
    numbers each), ``original_max_position_embeddings`` (>= 2), and optionally
    ``factor`` (>= 1), ``attention_factor`` (> 0) and ``max_position_embeddings``
    (needed when ``factor`` is absent; HF reads it from the model config).

    Examples:
        >>> from posenc.rotary.schedules import default, longrope
        >>> params = {"short_factor": [1.0, 1.0, 1.5, 2.0], "long_factor": [1.0, 2.0, 4.0, 8.0],
        ...           "original_max_position_embeddings": 4096, "max_position_embeddings": 131072}
        >>> base = default(8, 10000.0, {}).inv_freq
        >>> (base / longrope(8, 10000.0, params, seq_len=4096).inv_freq).tolist()
        [1.0, 1.0, 1.5, 2.0]
        >>> f = longrope(8, 10000.0, params, seq_len=8192)
        >>> (base / f.inv_freq).tolist(), round(f.attention_scaling, 4)
        ([1.0, 2.0, 4.0, 8.0], 1.1902)
    """
    _check(params, "longrope")
    count = rotary_dim // 2
    short = _factor_list(params["short_factor"], "short_factor", count)
    long = _factor_list(params["long_factor"], "long_factor", count)
    original = checks.check_int(
        params["original_max_position_embeddings"], "original_max_position_embeddings", minimum=2
    )
    attention_factor = _positive(params, "attention_factor")
    if _optional(params, "factor") is not None:
        factor = _factor(params["factor"])
    elif _optional(params, "max_position_embeddings") is not None:
        max_pos = checks.check_int(
            params["max_position_embeddings"], "max_position_embeddings", minimum=1
        )
        factor = max_pos / original
    else:
        raise ValueError(
            "rope type 'longrope' needs factor or max_position_embeddings "
            "(factor defaults to max_position_embeddings / original_max_position_embeddings)"
        )
    if attention_factor is None:
        if factor <= 1.0:
            attention_factor = 1.0
        else:
            attention_factor = math.sqrt(1 + math.log(factor) / math.log(original))
    length = _seq_len(seq_len)
    ext = long if length is not None and length > original else short
    omega = [
        _CTX.divide(w, _dec(e)) for w, e in zip(base_exponents(rotary_dim, base), ext, strict=True)
    ]
    return RopeFrequencies(tuple(omega), float(attention_factor))


@register("proportional", optional=("partial_rotary_factor", "factor"))
def proportional(
    rotary_dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
) -> RopeFrequencies:
    """Proportional RoPE (Gemma 4; HF ``_compute_proportional_rope_parameters``).

    Unlike every other schedule, the partial factor does not shrink the rotary
    dim: the schedule covers the *whole head*, so pass ``rotary_dim = head_dim``
    and ``partial_rotary_factor`` in ``params``. Of the ``head_dim / 2``
    frequencies, the first ``n = int(partial_rotary_factor * head_dim // 2)``
    are ``base ** (-2k / head_dim)`` (exponent over the head dim), the rest are
    exactly zero (those pairs do not rotate), and all are divided by
    ``factor``. In the half layout the rotated pairs are ``(i, i + head_dim /
    2)`` for ``i < n``, which differs from a rotary dim of ``2 n``.

    Takes, optionally, ``partial_rotary_factor`` (in [0, 1], default 1) and
    ``factor`` (>= 1, default 1). ``head_dim``, if given, must equal
    ``rotary_dim``.

    Examples:
        >>> from posenc.rotary.schedules import proportional
        >>> proportional(8, 10000.0, {"partial_rotary_factor": 0.5}).inv_freq.tolist()
        [1.0, 0.1, 0.0, 0.0]
    """
    _check(params, "proportional")
    if head_dim is not None and head_dim != rotary_dim:
        raise ValueError(
            "rope type 'proportional' covers the whole head: pass rotary_dim = head_dim "
            "and partial_rotary_factor in params; "
            f"got rotary_dim={rotary_dim}, head_dim={head_dim}"
        )
    partial = _optional(params, "partial_rotary_factor")
    partial = 1.0 if partial is None else checks.check_number(partial, "partial_rotary_factor")
    if not 0.0 <= partial <= 1.0:
        raise ValueError(f"partial_rotary_factor must lie in [0, 1]; got {partial}")
    factor_value = _optional(params, "factor")
    factor = 1.0 if factor_value is None else _factor(factor_value)
    rope_angles = int(partial * rotary_dim // 2)  # HF's expression, float floor division
    f = _dec(factor)
    rotated = _powers(rope_angles, rotary_dim, _CTX.ln(_dec(base)))
    omega = [_CTX.divide(w, f) for w in rotated]
    omega += [decimal.Decimal(0)] * (rotary_dim // 2 - rope_angles)
    return RopeFrequencies(tuple(omega))


def resonance_rounded(freqs: RopeFrequencies, name: str = "resonance") -> RopeFrequencies:
    """``freqs`` with every wavelength rounded to an integer (Resonance RoPE).

    Wang et al. 2024, arXiv:2403.00071; sheryc/resonance_rope
    ``ResonanceEmbedding.resonance_register``: ``lambda~_k = round(2 pi / omega_k)``,
    ``omega~_k = 2 pi / lambda~_k``, ties to even as ``torch.round``. Every rounded
    pair repeats its angles exactly every ``lambda~_k`` positions, so a position past
    the trained length meets only angles seen in training for the pairs whose
    wavelength is below it. (The reference builds its tables from ``t mod lambda~_k``
    for that reason; the exact angle engine reduces ``t * omega~_k`` modulo a turn
    exactly, which gives the same angles.) The attention scaling is kept.

    posenc rounds the exact wavelength; the reference rounds ``2 pi / inv_freq``
    computed in float32, which can land on the neighbouring integer where the
    wavelength lies within float32's error (a few parts in ``10**7``) of a
    half-integer. Huge wavelengths are rounded like any other (by less than 1/2,
    a relative change below ``1 / (2 lambda)``).

    Raises:
        ValueError: a frequency above ``4 pi`` (wavelength below 1/2), whose
            wavelength rounds to 0: the reference divides by it and gets ``inf``.
    """
    two_pi = _CTX.multiply(2, PI)
    omega = []
    for k, w in enumerate(freqs.omega):
        if w == 0:  # a pair that never rotates has no wavelength to round
            omega.append(w)
            continue
        wavelength = _CTX.divide(two_pi, w).to_integral_value(decimal.ROUND_HALF_EVEN)
        if wavelength == 0:
            raise ValueError(
                f"rope type {name!r}: frequency {k} ({float(w):.6g} rad per position) has a "
                "wavelength below 1/2, which rounds to 0; Resonance RoPE needs every "
                "frequency <= 4 pi (a base > 1 gives frequencies <= 1)"
            )
        omega.append(_CTX.divide(two_pi, wavelength))
    return RopeFrequencies(tuple(omega), freqs.attention_scaling)


@register("resonance")
def resonance(
    rotary_dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
) -> RopeFrequencies:
    """Resonance RoPE (sheryc/resonance_rope ``LlamaResonanceRotaryEmbedding``).

    The default frequencies with every wavelength rounded to an integer
    (:func:`resonance_rounded`). Takes no parameters.

    Examples:
        >>> import math
        >>> from posenc.rotary.schedules import default, resonance
        >>> (2 * math.pi / default(8, 10000.0, {}).inv_freq).round(2).tolist()  # wavelengths
        [6.28, 62.83, 628.32, 6283.19]
        >>> (2 * math.pi / resonance(8, 10000.0, {}).inv_freq).round(4).tolist()
        [6.0, 63.0, 628.0, 6283.0]
    """
    _check(params, "resonance")
    return resonance_rounded(default(rotary_dim, base, {}), "resonance")


@register(
    "resonance_yarn",
    required=tuple(sorted(PARAMETERS["yarn"][0])),
    optional=tuple(sorted(PARAMETERS["yarn"][1])),
    stretch=_with_original,
)
def resonance_yarn(
    rotary_dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
) -> RopeFrequencies:
    """Resonance YaRN (sheryc/resonance_rope ``LlamaResonanceYaRNScaledRotaryEmbedding``).

    YaRN's frequencies (:func:`yarn`, the same parameters), then every wavelength
    rounded (:func:`resonance_rounded`): the rounding comes after YaRN's blend, as the
    reference's ``yarn()`` calls ``resonance_register()`` on the ``inv_freq`` it just
    made. The attention scaling is YaRN's ``mscale``.

    Examples:
        >>> import math
        >>> from posenc.rotary.schedules import resonance_yarn
        >>> params = {"factor": 4.0, "original_max_position_embeddings": 2048}
        >>> f = resonance_yarn(8, 10000.0, params)
        >>> (2 * math.pi / f.inv_freq).round(4).tolist(), round(f.attention_scaling, 4)
        ([6.0, 63.0, 1005.0, 25133.0], 1.1386)
    """
    _check(params, "resonance_yarn")
    return resonance_rounded(yarn(rotary_dim, base, params), "resonance_yarn")


def frequencies(
    rope_type: str,
    rotary_dim: int,
    base: float,
    params: Mapping[str, Any] | None = None,
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
) -> RopeFrequencies:
    """The frequencies of ``rope_type`` (a key of :data:`SCHEDULES`).

    Args:
        rope_type: ``"default"``, ``"linear"``, ... (``"type"`` aliases are the
            caller's business: see :mod:`posenc.hf`).
        rotary_dim: channels that rotate (even, >= 2).
        base: ``rope_theta``.
        params: the schedule's own parameters (``factor`` ...), without
            ``rope_type`` and ``rope_theta``.
        head_dim: the full head dim; only ``proportional`` reads it, to check
            that ``rotary_dim`` is the whole head.
        seq_len: the current sequence length (dynamic and longrope).

    Raises:
        ValueError: unknown type (the valid ones are listed), odd or small
            ``rotary_dim``, or one above :data:`posenc.core.checks.MAX_CHANNELS`,
            non-positive base, missing or extra parameters.

    Examples:
        >>> from posenc.rotary.schedules import frequencies
        >>> params = {"factor": 4.0, "original_max_position_embeddings": 2048}
        >>> f = frequencies("yarn", 8, 10000.0, params)  # rope_theta 10000, rotary_dim 8
        >>> f.inv_freq.tolist(), round(f.attention_scaling, 4)
        ([1.0, 0.1, 0.00625, 0.00025], 1.1386)
    """
    if rope_type not in SCHEDULES:
        raise ValueError(f"unknown rope type {rope_type!r}; valid types: {', '.join(SCHEDULES)}")
    # one 40-digit frequency per pair: refuse absurd sizes before computing any
    rotary_dim = checks.check_channels(rotary_dim, "rotary_dim", minimum=2)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even; got {rotary_dim}")
    base = checks.check_number(base, "base", positive=True)
    return SCHEDULES[rope_type](
        rotary_dim, base, dict(params or {}), head_dim=head_dim, seq_len=seq_len
    )
