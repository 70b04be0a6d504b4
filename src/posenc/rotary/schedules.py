"""Frequency schedules of rotary embeddings: one registry, one signature.

Every schedule maps ``(rotary_dim, base, params)`` to the angular frequencies
``omega_k`` (``k < rotary_dim / 2``) and the attention scaling that multiplies
cos and sin, as HF transformers' ``ROPE_INIT_FUNCTIONS`` do. posenc computes
the frequencies in 40-digit decimal arithmetic, so that the exact angle
engine (:mod:`posenc._angles`) can evaluate ``position * omega_k`` exactly;
HF computes them in float32.

Base rule (Su et al. 2021; HF ``_compute_default_rope_parameters``):
``omega_k = base ** (-2k / rotary_dim)``, the exponent over the *rotary*
dim, not the head dim (transformers PR #48652).
"""

from __future__ import annotations

import decimal
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from posenc import _arrays
from posenc._angles import Turns, turns_from_radians

_CTX = decimal.Context(prec=40, Emin=-999999, Emax=999999)


@dataclass(frozen=True)
class RopeFrequencies:
    """The frequencies of one rotary embedding and its attention scaling.

    Attributes:
        omega: exact angular frequencies (radians per position), one per pair.
        attention_scaling: multiplies cos and sin (YaRN's mscale, LongRoPE's
            factor); 1.0 for most schedules.
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


Schedule = Callable[..., RopeFrequencies]
#: rope_type -> schedule(rotary_dim, base, params, *, head_dim, seq_len) -> RopeFrequencies
SCHEDULES: dict[str, Schedule] = {}


def register(name: str) -> Callable[[Schedule], Schedule]:
    """Add a schedule to :data:`SCHEDULES` under ``name``."""

    def add(fn: Schedule) -> Schedule:
        SCHEDULES[name] = fn
        return fn

    return add


def base_exponents(rotary_dim: int, base: float) -> list[decimal.Decimal]:
    """``base ** (-2k / rotary_dim)`` for ``k < rotary_dim / 2``, exactly."""
    log_base = _CTX.ln(decimal.Decimal(base))
    d = decimal.Decimal(rotary_dim)
    return [_CTX.exp(_CTX.divide(-2 * k * log_base, d)) for k in range(rotary_dim // 2)]


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


@register("default")
def default(
    rotary_dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
) -> RopeFrequencies:
    """Unscaled RoPE: ``base ** (-2k / rotary_dim)``."""
    check_params(params, "default", set(), set())
    return RopeFrequencies(tuple(base_exponents(rotary_dim, base)))


@register("linear")
def linear(
    rotary_dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
) -> RopeFrequencies:
    """Position interpolation (kaiokendev; HF ``linear``): the default divided by ``factor``."""
    check_params(params, "linear", {"factor"}, {"factor"})
    factor = _factor(params["factor"])
    f = decimal.Decimal(factor)
    return RopeFrequencies(tuple(_CTX.divide(w, f) for w in base_exponents(rotary_dim, base)))


def _factor(value: Any, name: str = "factor") -> float:
    factor = _arrays.check_number(value, name)
    if factor < 1.0:
        raise ValueError(f"{name} must be >= 1; got {value!r}")
    return factor


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
        head_dim: the full head dim (schedules that need it: proportional).
        seq_len: the current sequence length (dynamic and longrope).

    Raises:
        ValueError: unknown type (the valid ones are listed), odd or small
            ``rotary_dim``, non-positive base, missing or extra parameters.
    """
    if rope_type not in SCHEDULES:
        raise ValueError(f"unknown rope type {rope_type!r}; valid types: {', '.join(SCHEDULES)}")
    rotary_dim = _arrays.check_dim(rotary_dim, "rotary_dim", minimum=2)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even; got {rotary_dim}")
    base = _arrays.check_number(base, "base", positive=True)
    return SCHEDULES[rope_type](
        rotary_dim, base, dict(params or {}), head_dim=head_dim, seq_len=seq_len
    )
