"""How far another engine's RoPE tables are from the exact ones, and the likely misreading.

:func:`golden_tables` computes posenc's exact tables for a config's RoPEs
(``inv_freq``, and ``cos``, ``sin`` in the half and the interleaved layouts, in
float64, times the attention scaling); :func:`compare` checks another engine's
``inv_freq`` and ``cos``/``sin`` against them, one :class:`Verdict` per array
group and RoPE, and when they diverge names the likely cause by recomputing the
tables of each known misreading (the other layout, a missing or doubled
attention factor, float32 angles, a scaling not applied or a linear factor
applied twice, a wrong base, LongRoPE's other factor, a partial rotary factor
ignored).

Tolerances (see ``_value_tolerance``): a value may differ from the exact one by
the rounding of the stored dtype and by what a float64 computation of the
frequencies and of ``position * omega`` costs; float32 angles, which err by about
``position * omega * 2**-24``, do not agree.

Nothing here prints or touches a file, and importing it needs only numpy (torch
is imported by the tables).
"""

from __future__ import annotations

import dataclasses
import decimal
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from posenc.core import checks
from posenc.families.rotary.config import RopeSpec
from posenc.families.rotary.schedules import RopeFrequencies
from posenc.integration.analysis.rope_reading import Reading, ranges, show

__all__ = [
    "compare",
    "golden_tables",
]

#: Positions the exact angle engine evaluates within its error budget (``|position| < 2**31``).
MAX_POSITION = 2**31 - 1
#: posenc's own error on a float64 table value (the exact engine: about 1e-15, before scaling).
_POSENC_ERROR = 2.0**-49
_UNIT_ROUNDOFF = {
    np.dtype(np.float16): 2.0**-11,
    np.dtype(np.float32): 2.0**-24,
    np.dtype(np.float64): 2.0**-53,
}


# --------------------------------------------------------------------------------------
# Golden tables.


def _tables(
    spec: RopeSpec, positions: npt.NDArray[np.int64], layout: str, freqs: RopeFrequencies
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    import torch

    from posenc.families.rotary.tables import cos_sin

    c, s = cos_sin(torch.as_tensor(positions), freqs, layout=layout, dtype=torch.float64)  # type: ignore[arg-type]
    return c.numpy(), s.numpy()


def _seq_len(positions: npt.NDArray[np.int64]) -> int:
    return int(positions.max()) + 1  # HF's value: max(position_ids) + 1


def golden_tables(
    readings: list[Reading],
    positions: npt.NDArray[np.int64],
    softmax_scale: float | None = None,
) -> dict[str, npt.NDArray[Any]]:
    """posenc's exact tables of every RoPE in ``readings`` at ``positions``, by array name.

    Per RoPE (names prefixed ``<layer_type>/`` for per-type RoPE): ``inv_freq``
    (float64, at ``seq_len = max(positions) + 1``), ``positions`` (int64), ``cos``,
    ``sin`` (float64, ``(len(positions), rotary_dim)``, half layout, times the
    attention scaling), ``cos_interleaved``, ``sin_interleaved`` and
    ``attention_scaling`` (a float64 scalar); and ``softmax_scale``, the factor the
    attention multiplies ``q . k`` by, when given (``posenc rope --golden`` gives
    transformers' own, :func:`~posenc.integration.analysis.rope_reading.softmax_scale`).

    Raises:
        ValueError: the tables are too large.

    Examples:
        >>> import numpy as np
        >>> from posenc.analysis.rope_reading import Loaded, read
        >>> from posenc.analysis.rope_compare import golden_tables
        >>> config = {"model_type": "llama", "rope_theta": 500000.0, "hidden_size": 64,
        ...           "num_attention_heads": 2, "max_position_embeddings": 8192}
        >>> tables = golden_tables(read(Loaded(config, "config.json", "file")), np.arange(16))
        >>> sorted(tables)
        ['attention_scaling', 'cos', 'cos_interleaved', 'inv_freq', 'positions', 'sin',
         'sin_interleaved']
        >>> tables["cos"].shape, tables["inv_freq"][:3].round(4)
        ((16, 32), array([1.    , 0.4404, 0.1939]))
    """
    total = sum(4 * positions.size * r.spec.rotary_dim for r in readings)
    checks.check_elements(total, f"--golden tables of {positions.size} positions")
    arrays: dict[str, npt.NDArray[Any]] = {}
    for r in readings:
        pre = f"{r.layer_type}/" if r.layer_type else ""
        freqs = r.spec.frequencies(seq_len=_seq_len(positions))
        c, s = _tables(r.spec, positions, "half", freqs)
        ci, si = _tables(r.spec, positions, "interleaved", freqs)
        arrays.update({
            f"{pre}inv_freq": freqs.inv_freq.astype(np.float64),
            f"{pre}positions": positions.astype(np.int64),
            f"{pre}cos": c, f"{pre}sin": s,
            f"{pre}cos_interleaved": ci, f"{pre}sin_interleaved": si,
            f"{pre}attention_scaling": np.float64(freqs.attention_scaling),
        })  # fmt: skip
        if softmax_scale is not None:
            arrays[f"{pre}softmax_scale"] = np.float64(softmax_scale)
    return arrays


# --------------------------------------------------------------------------------------
# Comparing another engine's tables.


@dataclass
class Verdict:
    """One comparison: ``agree``, and if not, where, by how much and the likely cause."""

    what: str
    layer_type: str | None
    agree: bool
    summary: str
    layout: str | None = None
    first: dict[str, Any] | None = None
    cause: str | None = None
    score: float = 0.0
    #: the largest ``|theirs - exact|`` (set by :func:`compare_mrope`)
    largest: float | None = None

    def as_json(self) -> dict[str, Any]:
        """The verdict as the plain values ``posenc rope --compare --json`` prints."""
        return {
            "what": self.what,
            "layer_type": self.layer_type,
            "agree": self.agree,
            "summary": self.summary,
            "layout": self.layout,
            "first_divergence": self.first,
            "cause": self.cause,
        }


def _unit_roundoff(dtype: np.dtype[Any]) -> float:
    if dtype not in _UNIT_ROUNDOFF:
        raise ValueError(f"arrays must be float16, float32 or float64; got {dtype}")
    return _UNIT_ROUNDOFF[dtype]


def _factor(spec: RopeSpec) -> float:
    factor = spec.params.get("factor")
    return float(factor) if isinstance(factor, (int, float)) and factor > 1 else 1.0


def _frequency_rtol(spec: RopeSpec, u: float) -> float:
    """Relative error of frequencies computed with unit roundoff ``u``.

    The bound posenc.hf checks HF's float32 ``inv_freq`` with, at any precision: the
    exponent's rounding costs ``ln(base)`` ulps, the power and divisions a few more,
    and the blends of yarn and llama3 amplify the ramp's rounding up to ``factor``.
    """
    return (4 + abs(math.log(spec.base)) + _factor(spec)) * 2 * u


def _value_tolerance(
    spec: RopeSpec, scale: float, angle: npt.NDArray[np.float64], u: float
) -> npt.NDArray[np.float64]:
    """Allowed ``|theirs - posenc|`` of a table value whose exact angle is ``angle``.

    ``scale * (4 u + 2**-49 + |angle| * rho64)``: their dtype's rounding of cos, sin
    and the product with the scaling (``u``, 4 ulps), posenc's own error, and what
    float64 frequencies and a float64 product ``position * omega`` cost
    (``rho64``, ``_frequency_rtol`` at float64 plus the product's rounding).
    """
    rho64 = _frequency_rtol(spec, 2.0**-53) + 2.0**-52
    return abs(scale) * (4 * u + _POSENC_ERROR + np.abs(angle) * rho64)


def _channel_pairs(channels: int, pairs: int, layout: str) -> npt.NDArray[np.int64]:
    """The frequency index of each channel in ``layout`` (``"pair"``: one channel per pair)."""
    idx = np.arange(channels)
    if layout == "half":
        return idx % pairs
    if layout == "interleaved":
        return idx // 2
    return idx


@dataclass
class _Theirs:
    """One group of their arrays (one layer type, or unprefixed)."""

    prefix: str
    inv_freq: npt.NDArray[Any] | None = None
    positions: npt.NDArray[np.int64] | None = None
    tables: dict[str, tuple[npt.NDArray[Any], npt.NDArray[Any]]] = field(default_factory=dict)


def _group_theirs(arrays: Mapping[str, npt.NDArray[Any]], source: str) -> dict[str, _Theirs]:
    """``arrays`` checked and grouped by ``<layer_type>/`` prefix ('' for none)."""
    if not arrays:
        raise ValueError(f"{source}: no arrays")
    groups: dict[str, _Theirs] = {}
    for name, array in arrays.items():
        prefix, _, base = name.rpartition("/")
        g = groups.setdefault(prefix, _Theirs(prefix))
        if base == "inv_freq":
            g.inv_freq = _float_array(array, name, source, ndim=1)
        elif base == "positions":
            g.positions = _position_array(array, name, source)
    for prefix, g in groups.items():
        pre = f"{prefix}/" if prefix else ""
        names = {"auto": ("cos", "sin"), "interleaved": ("cos_interleaved", "sin_interleaved")}
        for layout, (cn, sn) in names.items():
            have = [n for n in (cn, sn) if pre + n in arrays]
            if len(have) == 1:
                raise ValueError(f"{source}: {pre}{have[0]} without its partner "
                                 f"({pre}{cn} and {pre}{sn} go together)")  # fmt: skip
            if have:
                c = _float_array(arrays[pre + cn], pre + cn, source, ndim=2)
                s = _float_array(arrays[pre + sn], pre + sn, source, ndim=2)
                if c.shape != s.shape:
                    raise ValueError(f"{source}: {pre}{cn} has shape {c.shape}, "
                                     f"{pre}{sn} {s.shape}")  # fmt: skip
                g.tables[layout] = (c, s)
        rows = {t[0].shape[0] for t in g.tables.values()}
        if len(rows) > 1:
            raise ValueError(f"{source}: {pre}cos tables of different lengths")
        if g.positions is not None and rows and g.positions.size not in rows:
            raise ValueError(
                f"{source}: {pre}positions has {g.positions.size} entries, "
                f"the tables {rows.pop()} rows"
            )
        if g.positions is None and rows:
            g.positions = np.arange(rows.pop(), dtype=np.int64)
    groups = {p: g for p, g in groups.items() if g.inv_freq is not None or g.tables}
    if not groups:
        raise ValueError(
            f"{source}: needs inv_freq, or cos and sin (with positions, "
            f"default 0..n-1); it has {', '.join(sorted(arrays))}"
        )
    return groups


def _float_array(array: npt.NDArray[Any], name: str, source: str, ndim: int) -> npt.NDArray[Any]:
    where = f"{source}: {name}"
    if array.dtype not in _UNIT_ROUNDOFF:
        raise ValueError(f"{where} must be float16, float32 or float64; got {array.dtype}")
    if array.ndim != ndim or array.size == 0:
        raise ValueError(f"{where} must be a non-empty {ndim}-D array; got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{where} holds NaN or infinite values")
    return array


def _position_array(array: npt.NDArray[Any], name: str, source: str) -> npt.NDArray[np.int64]:
    where = f"{source}: {name}"
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{where} must be a non-empty 1-D array; got shape {array.shape}")
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
            raise ValueError(f"{where} must hold whole numbers")
    elif array.dtype.kind not in "iu":
        raise ValueError(f"{where} must be ints; got {array.dtype}")
    if array.min() < 0 or array.max() > MAX_POSITION:
        raise ValueError(f"{where} must lie in 0 .. 2**31 - 1")
    return array.astype(np.int64)


def compare(
    readings: list[Reading],
    arrays: Mapping[str, npt.NDArray[Any]],
    *,
    source: str = "arrays",
    layout: str | None = None,
    layer_type: str | None = None,
    rounding: float | None = None,
) -> list[Verdict]:
    """Compare another engine's arrays with posenc's; one verdict per array group and RoPE.

    Args:
        readings: the config's RoPEs (:func:`posenc.integration.analysis.rope_reading.read`).
        arrays: ``inv_freq`` and/or ``cos`` + ``sin`` (+ ``positions``, else
            ``0 .. n - 1``), names optionally prefixed ``<layer_type>/``, as in an
            ``.npz`` of :func:`golden_tables`.
        source: how error messages name the arrays (``posenc rope`` passes
            ``--compare 'FILE'``).
        layout: the layout of their ``cos``/``sin``; ``None`` detects it.
        layer_type: which RoPE unprefixed arrays belong to; ``None`` tries each.
        rounding: the unit roundoff of the dtype their tables were stored in, when the
            arrays cannot carry it (bfloat16 values in float32 arrays: ``2**-8``);
            ``None``: their arrays' dtype's.

    Raises:
        ValueError: arrays of the wrong names, dtypes or shapes, an unknown layer type.

    Examples:
        Another engine that ignores Llama 3's scaling: its ``inv_freq`` is the plain one.

        >>> import numpy as np
        >>> from posenc.analysis.rope_reading import Loaded, read
        >>> from posenc.analysis.rope_compare import compare
        >>> config = {"model_type": "llama", "rope_theta": 500000.0, "hidden_size": 64,
        ...           "num_attention_heads": 2, "max_position_embeddings": 8192,
        ...           "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
        ...                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        ...                            "original_max_position_embeddings": 8192}}
        >>> readings = read(Loaded(config, "config.json", "file"))
        >>> theirs = 500000.0 ** (-np.arange(0, 32, 2) / 32)
        >>> (verdict,) = compare(readings, {"inv_freq": theirs})
        >>> verdict.agree, verdict.first["pair"]
        (False, 8)
        >>> print(verdict.cause)
        the llama3 scaling was not applied: their frequencies are the unscaled default (base 500000)
    """
    by_type = {r.layer_type: r for r in readings}
    if layer_type is not None and layer_type not in by_type:
        known = ", ".join(str(k) for k in by_type)
        raise ValueError(f"--layer-type {layer_type!r}: this config's RoPEs: {known}")
    groups = _group_theirs(arrays, source)
    verdicts: list[Verdict] = []
    for prefix, theirs in groups.items():
        if prefix:
            if prefix not in by_type:
                known = ", ".join(str(k) for k in by_type if k) or "none (one RoPE)"
                raise ValueError(
                    f"{source}: arrays prefixed {prefix!r}/, but this config's "
                    f"layer types are: {known}"
                )
            candidates = [by_type[prefix]]
        elif layer_type is not None:
            candidates = [by_type[layer_type]]
        else:
            candidates = readings
        options = [_compare_group(theirs, r, layout, rounding) for r in candidates]
        # the layer type the unprefixed arrays agree with, else the closest one
        best = min(options, key=lambda vs: (not all(v.agree for v in vs), sum(v.score for v in vs)))
        if len(candidates) > 1:
            agree = all(v.agree for v in best)
            for v in best:
                v.summary += f" ({'matches' if agree else 'closest'} layer type: {v.layer_type})"
        verdicts += best
    return verdicts


def _compare_group(
    theirs: _Theirs, r: Reading, layout: str | None, rounding: float | None = None
) -> list[Verdict]:
    out = []
    seq_len = _seq_len(theirs.positions) if theirs.positions is not None else None
    if theirs.inv_freq is not None:
        out.append(_compare_inv_freq(theirs.inv_freq, r, seq_len))
    for kind, (c, s) in theirs.tables.items():
        assert theirs.positions is not None
        forced = "interleaved" if kind == "interleaved" else layout
        name = "cos/sin" if kind == "auto" else "cos_interleaved/sin_interleaved"
        out.append(_compare_tables(name, c, s, theirs.positions, r, forced, rounding))
    return out


# -- inv_freq


@dataclass
class _Candidate:
    """A known misreading: how it changes the frequencies (and tables), and its explanation."""

    cause: str
    freqs: Callable[[], RopeFrequencies | None]
    layout: str | None = None
    scale: float | None = None
    float32: bool = False


def _frequencies(omega: Sequence[float], scaling: float = 1.0) -> RopeFrequencies:
    return RopeFrequencies(tuple(decimal.Decimal(float(w)) for w in omega), scaling)


def _base_candidates(
    r: Reading, estimates: Sequence[float | None], seq_len: int | None
) -> list[_Candidate]:
    """The misreadings of the frequencies, most specific first; ``estimates`` are bases
    their frequencies or angles imply (:func:`_ratio_base`, :func:`_first_angles_base`,
    :func:`_fitted_base`)."""
    spec = r.spec
    out = []
    if spec.rope_type != "default":
        default = dataclasses.replace(spec, rope_type="default", params={})
        out.append(_Candidate(
            f"the {spec.rope_type} scaling was not applied: their frequencies are the unscaled "
            f"default (base {show(spec.base)})", lambda: default.frequencies(), scale=1.0,
        ))  # fmt: skip
    if spec.base != 10000.0 and spec.rope_type != "default":
        # both the base and the scaling lost (with no scaling it is "a wrong base" below)
        unread = dataclasses.replace(spec, rope_type="default", params={}, base=10000.0)
        out.append(_Candidate(
            "the config's RoPE was not read at all: their frequencies are the default base "
            f"10000 with no scaling (posenc reads base {show(spec.base)} from "
            f"{r.rows[1].source})", lambda: unread.frequencies(), scale=1.0,
        ))  # fmt: skip
    if spec.rope_type == "linear":
        f = float(spec.params["factor"])
        twice = dataclasses.replace(spec, params={"factor": f * f})
        out.append(_Candidate(
            f"the linear factor {show(f)} was applied twice (their frequencies are "
            f"omega / {show(f * f)})", lambda: twice.frequencies(seq_len=seq_len),
        ))  # fmt: skip
    if spec.rope_type == "longrope":
        original = spec.original_max_position_embeddings or 1
        other = original + 1 if (seq_len or 0) <= original else original
        which = "long" if other > original else "short"
        out.append(_Candidate(
            f"LongRoPE's {which}_factor: their frequencies are those of seq_len {other} "
            f"(posenc uses seq_len {seq_len or 'None'} = max position + 1)",
            lambda: spec.frequencies(seq_len=other),
        ))  # fmt: skip
    if spec.partial_rotary_factor < 1 and spec.rope_type == "default":
        head = spec.head_dim
        omega = [spec.base ** (-2 * k / head) for k in range(spec.rotary_dim // 2)]
        out.append(_Candidate(
            f"the exponent over head_dim {head} instead of the rotary dim {spec.rotary_dim}: "
            "omega_k = base ** (-2k / head_dim)", lambda: _frequencies(omega),
        ))  # fmt: skip
    for estimate in estimates:
        if estimate is not None and not math.isclose(estimate, spec.base, rel_tol=1e-9):
            for digits in (*range(1, 10), None):
                b = estimate if digits is None else float(f"{estimate:.{digits}g}")
                if b <= 1 or math.isclose(b, spec.base, rel_tol=1e-12):
                    continue
                other_spec = dataclasses.replace(spec, base=b)
                out.append(_Candidate(
                    f"a wrong base: their frequencies fit base {show(b)} (posenc reads base "
                    f"{show(spec.base)} from {r.rows[1].source})",
                    functools.partial(_safe_frequencies, other_spec, seq_len),
                ))  # fmt: skip
    return out


def _ratio_base(spec: RopeSpec, ratio: float | None) -> float | None:
    """The base of a default schedule whose ``omega_1 / omega_0`` is ``ratio``."""
    if ratio is None or not ratio > 0 or spec.rotary_dim < 4:
        return None
    estimate = ratio ** (-spec.rotary_dim / 2)
    return estimate if math.isfinite(estimate) and estimate > 1 else None


def _fitted_base(
    spec: RopeSpec,
    seq_len: int | None,
    angles: npt.NDArray[np.float64],
    positions: npt.NDArray[np.int64],
    omega: npt.NDArray[np.float64],
) -> float | None:
    """The base whose frequencies (``spec``'s schedule, ``omega`` at ``spec.base``) best
    explain their ``angles``.

    Their angles (``(rows, pairs)``, read off their tables with ``atan2``) are
    unwrapped against posenc's, ``delta = wrap(theirs - position * omega)``; a base
    ``base * exp(lam)`` moves each angle by ``lam * g`` to first order, ``g = position *
    d omega / d ln(base)`` (the schedule's own derivative, taken numerically, so that
    scaled schedules are fitted too). ``lam`` is the least-squares fit over the
    values with ``|delta| < 1`` (where the first order holds and nothing wrapped).
    Where their dtype's rounding hides the base at the first positions (bfloat16:
    ``u / omega_1`` of an angle near 1), the last positions pin it down ``position``
    times better. None when nothing constrains it.
    """
    if spec.rotary_dim < 4:
        return None
    h = 1e-6
    omegas = []
    for step in (h, -h):
        freqs = _safe_frequencies(dataclasses.replace(spec, base=spec.base * math.exp(step)),
                                  seq_len)  # fmt: skip
        if freqs is None or freqs.inv_freq.size != angles.shape[1]:
            return None
        omegas.append(freqs.inv_freq.astype(np.float64))
    p = positions.astype(np.float64)[:, None]
    g = p * (omegas[0] - omegas[1])[None, :] / (2 * h)
    exact = p * omega.astype(np.float64)[None, :]
    delta = np.angle(np.exp(1j * (angles - exact)))  # wrapped to (-pi, pi]
    use = (np.abs(delta) < 1.0) & (g != 0)
    if not use.any():
        return None
    lam = float(np.sum(delta[use] * g[use]) / np.sum(g[use] ** 2))
    estimate = spec.base * math.exp(lam)
    return estimate if math.isfinite(estimate) and estimate > 1 else None


def _safe_frequencies(spec: RopeSpec, seq_len: int | None) -> RopeFrequencies | None:
    try:
        return spec.frequencies(seq_len=seq_len)
    except (ValueError, TypeError):
        return None


def _compare_inv_freq(theirs: npt.NDArray[Any], r: Reading, seq_len: int | None) -> Verdict:
    spec = r.spec
    ours = spec.frequencies(seq_len=seq_len).inv_freq
    u = _unit_roundoff(theirs.dtype)
    rtol = _frequency_rtol(spec, u)
    t = theirs.astype(np.float64)
    lt = r.layer_type
    if t.size != ours.size:
        cause = None
        if spec.partial_rotary_factor < 1 and t.size == spec.head_dim // 2:
            cause = (f"the partial_rotary_factor {show(spec.partial_rotary_factor)} was ignored: "
                     f"{t.size} frequencies = head_dim / 2")  # fmt: skip
        elif t.size == spec.rotary_dim:
            cause = "their inv_freq holds rotary_dim values (one per channel), not one per pair"
        return Verdict("inv_freq", lt, False,
                       f"inv_freq: {t.size} frequencies, posenc has rotary_dim / 2 = {ours.size}",
                       cause=cause, score=math.inf)  # fmt: skip
    rel = np.abs(t - ours) / np.maximum(np.abs(ours), np.finfo(np.float64).tiny)
    rel = np.where(ours == 0, np.abs(t), rel)  # proportional's unrotated pairs: exactly 0
    bad = np.flatnonzero(rel > rtol)
    worst = int(np.argmax(rel))
    score = float(rel[worst] / rtol)
    if bad.size == 0:
        return Verdict("inv_freq", lt, True,
                       f"inv_freq: agree ({ours.size} frequencies; max relative difference "
                       f"{rel[worst]:.2g}, tolerance {rtol:.2g} for {theirs.dtype})",
                       score=score)  # fmt: skip
    k = int(bad[0])
    first = {"pair": k, "theirs": float(t[k]), "posenc": float(ours[k]),
             "relative_difference": float(rel[k]), "tolerance": rtol}  # fmt: skip
    ratio = float(t[1] / t[0]) if t.size > 1 and t[0] > 0 else None
    cause = None
    for cand in _base_candidates(r, [_ratio_base(spec, ratio)], seq_len):
        f = cand.freqs()
        if f is not None and np.all(np.abs(t - f.inv_freq) <= rtol * np.abs(f.inv_freq) + 0):
            cause = cand.cause
            break
    if cause is None and theirs.dtype == np.float64:
        as32 = t.astype(np.float32).astype(np.float64)
        if np.array_equal(as32, t) and np.all(rel <= _frequency_rtol(spec, 2.0**-24)):
            cause = "float32 frequencies stored as float64 (each value is a float32)"
    if cause is None and spec.rotary_dim >= 4 and ratio:
        estimate = ratio ** (-spec.rotary_dim / 2)
        cause = (f"no known misreading matches; their inv_freq[1] / inv_freq[0] implies "
                 f"base {estimate:.6g} (posenc: {show(spec.base)})")  # fmt: skip
    summary = (f"inv_freq: DIVERGE from pair {k}: theirs {t[k]:.17g}, posenc {ours[k]:.17g} "
               f"(relative difference {rel[k]:.3g} > tolerance {rtol:.2g}); "
               f"{bad.size} of {ours.size} pairs differ")  # fmt: skip
    return Verdict("inv_freq", lt, False, summary, first=first, cause=cause, score=score)


# -- cos and sin


def _compare_tables(
    name: str,
    cos: npt.NDArray[Any],
    sin: npt.NDArray[Any],
    positions: npt.NDArray[np.int64],
    r: Reading,
    layout: str | None,
    rounding: float | None = None,
) -> Verdict:
    spec = r.spec
    lt = r.layer_type
    rows, channels = cos.shape
    checks.check_elements(8 * rows * channels, f"--compare tables of {rows} x {channels}")
    pairs = spec.rotary_dim // 2
    u = rounding or _unit_roundoff(np.result_type(cos.dtype, sin.dtype))
    seq_len = _seq_len(positions)
    freqs = spec.frequencies(seq_len=seq_len)
    tc, ts = cos.astype(np.float64), sin.astype(np.float64)
    if channels == pairs and spec.rotary_dim != 2:
        layouts = ["pair"]  # one value per pair: no layout
    elif channels == spec.rotary_dim:
        layouts = [layout] if layout else ["half", "interleaved"]
    else:
        cause = None
        if spec.partial_rotary_factor < 1 and channels == spec.head_dim:
            cause = (f"the partial_rotary_factor {show(spec.partial_rotary_factor)} was ignored: "
                     f"their tables have head_dim = {channels} channels")  # fmt: skip
        return Verdict(name, lt, False,
                       f"{name}: {channels} channels, posenc's rotary dim is {spec.rotary_dim}",
                       cause=cause, score=math.inf)  # fmt: skip

    # exact pair values once; each layout is a re-indexing of them
    pc, ps = _tables(spec, positions, "half", freqs)
    pc, ps = pc[:, :pairs], ps[:, :pairs]
    omega = freqs.inv_freq
    angle_pairs = positions.astype(np.float64)[:, None] * omega[None, :]

    def evaluate(lay: str, c_p: Any, s_p: Any, tol_pairs: Any) -> dict[str, Any]:
        idx = _channel_pairs(channels, pairs, lay)
        dc, ds = np.abs(tc - c_p[:, idx]), np.abs(ts - s_p[:, idx])
        tol = tol_pairs[:, idx]
        over = (dc > tol) | (ds > tol)
        worst = float(np.max(np.maximum(dc, ds) / tol))
        return {
            "layout": lay,
            "over": over,
            "dc": dc,
            "ds": ds,
            "idx": idx,
            "tol": tol,
            "worst": worst,
            "count": int(over.sum()),
        }

    scale = freqs.attention_scaling
    tol_ours = _value_tolerance(spec, scale, angle_pairs, u)
    results = [evaluate(lay, pc, ps, tol_ours) for lay in layouts]
    best = min(results, key=lambda e: (e["count"], e["worst"]))
    where = f"{rows} positions {show(int(positions[0]))}..{show(int(positions[-1]))}"
    lay = best["layout"]
    lay_text = {"pair": "one value per pair", "half": "half layout",
                "interleaved": "interleaved layout"}[lay]  # fmt: skip
    if layout is None and len(layouts) == 2 and lay == "interleaved" and best["count"] == 0:
        lay_text += " (detected: theirs match posenc's interleaved, GPT-J/Meta tables)"
    elif layout is None and len(layouts) == 2 and best["count"] == 0:
        lay_text += " (detected)"
    if best["count"] == 0:
        return Verdict(name, lt, True,
                       f"{name}: agree ({lay_text}, {where}; max |difference| / tolerance "
                       f"{best['worst']:.2g}, tolerance for {cos.dtype})",
                       layout=lay, score=best["worst"])  # fmt: skip

    row, ch = (int(v) for v in np.argwhere(best["over"])[0])
    which = "cos" if best["dc"][row, ch] > best["tol"][row, ch] else "sin"
    theirs_v = (tc if which == "cos" else ts)[row, ch]
    ours_v = (pc if which == "cos" else ps)[row, best["idx"][ch]]
    first = {"row": row, "position": int(positions[row]), "channel": ch, "table": which,
             "theirs": float(theirs_v), "posenc": float(ours_v),
             "difference": float(abs(theirs_v - ours_v)),
             "tolerance": float(best["tol"][row, ch])}  # fmt: skip
    diff_max = np.maximum(best["dc"], best["ds"])
    mr, mc = (int(v) for v in np.unravel_index(int(np.argmax(diff_max)), diff_max.shape))
    summary = (
        f"{name}: DIVERGE ({lay_text}, {where}): first at position {first['position']} "
        f"(row {row}), channel {ch} of {which}: theirs {theirs_v:.17g}, posenc {ours_v:.17g}, "
        f"|difference| {first['difference']:.3g} > tolerance {first['tolerance']:.2g}; "
        f"largest {diff_max[mr, mc]:.3g} at position {int(positions[mr])}, channel {mc}; "
        f"{best['count']} of {rows * channels} values differ"
    )

    # the known misreadings, each checked by recomputing their tables
    cause = None
    other = {"half": "interleaved", "interleaved": "half"}.get(lay)
    candidates: list[_Candidate] = []
    if layout is not None and other is not None:
        pairing = (
            "GPT-J/Meta pairs (2i, 2i + 1)" if other == "interleaved" else "HF pairs (i, i + d/2)"
        )
        candidates.append(_Candidate(
            f"the {other} layout: theirs match posenc's {other} tables ({pairing}), "
            f"not the {lay} layout asked for", lambda: freqs, layout=other,
        ))  # fmt: skip
    if scale != 1.0:
        candidates.append(_Candidate(
            f"a missing attention factor: their values = posenc's / attention scaling "
            f"{scale:.6g} ({r.scaling.source})", lambda: freqs, scale=1.0,
        ))  # fmt: skip
        candidates.append(_Candidate(
            f"the attention factor applied twice: their values = posenc's x {scale:.6g}",
            lambda: freqs, scale=scale * scale,
        ))  # fmt: skip
    candidates.append(_Candidate(
        "float32 angles: their differences grow as position x omega x 2**-24 (largest "
        f"{diff_max[mr, mc]:.3g} at position {int(positions[mr])}); they match HF's float32 "
        "arithmetic (positions.float()[:, None] * inv_freq in float32); compute the angle "
        "in float64 or exactly (posenc.Rotary, posenc.families.rotary.tables.cos_sin)",
        lambda: freqs, float32=True,
    ))  # fmt: skip
    candidates.append(_Candidate(
        "float32 angles: their differences from the exact tables stay within what float32 "
        "frequencies and products cost, though not as HF's float32 arithmetic rounds them "
        "(e.g. pair k's frequency made as theta_scale**k by k float32 products, as ggml's "
        "rope_cache_init does: an error up to position x omega_k x (2k + 8) x 2**-24)",
        lambda: freqs,
    ))  # fmt: skip
    leading = np.arange(pairs) * (2 if lay == "interleaved" else 1)  # each pair's 1st channel
    angles = np.arctan2(ts[:, leading], tc[:, leading])
    read = _first_angles_base(angles, positions, omega, spec.rotary_dim, u)
    estimate, spread = read if read else (None, math.inf)
    fitted = _fitted_base(spec, seq_len, angles, positions, omega)
    candidates += _base_candidates(r, [fitted, estimate], seq_len)
    for cand in candidates:
        if _matches(cand, spec, positions, channels, pairs, lay, scale, u, tc, ts):
            cause = cand.cause
            break
    if cause is None and lay == "pair":
        cause = _frozen(ts, ps, positions[:, None] * np.ones((1, pairs), np.int64))
    if cause is None and estimate and spec.rotary_dim >= 4 and spread < 1e-3:
        if not math.isclose(estimate, spec.base, rel_tol=1e-3):
            cause = (
                "no known misreading matches exactly; their angles at the first positive "
                f"position imply base {estimate:.6g} (posenc: {show(spec.base)})"
            )
    return Verdict(name, lt, False, summary, layout=lay, first=first, cause=cause,
                   score=best["worst"])  # fmt: skip


def _frozen(
    theirs_sin: npt.NDArray[Any], exact_sin: npt.NDArray[Any], positions: npt.NDArray[Any]
) -> str | None:
    """Pairs that never turn in their tables (sine 0 at every position past 0) but do in
    the exact ones: named as the cause (one value per pair, ``positions`` per pair)."""
    moving = positions > 0
    frozen = [
        k
        for k in range(theirs_sin.shape[1])
        if moving[:, k].any()
        and np.all(theirs_sin[moving[:, k], k] == 0)
        and np.any(exact_sin[moving[:, k], k] != 0)
    ]
    if not frozen:
        return None
    return (f"pairs {ranges(frozen)} never turn: their sine is 0 at every position, where "
            "the exact tables turn them")  # fmt: skip


def _first_angles_base(
    angles: npt.NDArray[np.float64],
    positions: npt.NDArray[np.int64],
    omega: npt.NDArray[np.float64],
    rotary_dim: int,
    u: float,
) -> tuple[float, float] | None:
    """The base a default schedule would need for their angles at the first positive
    position, and a bound of its relative error; None where nothing can be read.

    Their angle of pair ``k`` at position ``p`` is ``p * base ** (-2k / rotary_dim)`` while
    it has not wrapped, so ``ln(angle_k)`` falls linearly in ``k`` with slope ``-2 ln(base) /
    rotary_dim``: fitted by least squares over the pairs with angles in ``(8 u, 3)``,
    weighted by ``angle_k ** 2``. A value rounded with unit roundoff ``u`` turns its
    angle by up to ``2 u`` (cos and sin each), ``ln(angle_k)`` by ``2 u / angle_k``; the
    slope, a weighted sum of these, errs by at most the same sum of their bounds, and
    ``ln(base)`` by ``rotary_dim / 2`` times that: about 1e-6 in float32 (d = 128,
    position 1), a few % in bfloat16, where the first positions cannot tell the base
    to 0.1 % (:func:`_fitted_base` reads the last ones).
    """
    positive = np.flatnonzero(positions > 0)
    if positive.size == 0 or omega.size < 2:
        return None
    row = int(positive[0])
    if positions[row] * omega[0] > 2.5:  # their first angle could have wrapped past pi
        return None
    a = angles[row]
    k = np.flatnonzero((a > 8 * u) & (a < 3.0))
    if k.size < 2:
        return None
    w = a[k] ** 2
    x = k - np.sum(w * k) / np.sum(w)
    coef = w * x / np.sum(w * x * x)  # slope = sum(coef * ln(a_k))
    slope = float(np.sum(coef * np.log(a[k])))
    error = float(np.sum(np.abs(coef) * 2 * u / a[k]))
    estimate = math.exp(-slope * rotary_dim / 2)
    if not math.isfinite(estimate) or estimate <= 1:
        return None
    return estimate, math.expm1(error * rotary_dim / 2)


def _matches(
    cand: _Candidate,
    spec: RopeSpec,
    positions: npt.NDArray[np.int64],
    channels: int,
    pairs: int,
    lay: str,
    scale: float,
    u: float,
    tc: npt.NDArray[np.float64],
    ts: npt.NDArray[np.float64],
) -> bool:
    """Whether their tables equal the candidate's within the tolerance."""
    freqs = cand.freqs()
    if freqs is None or len(freqs.omega) != pairs:
        return False
    lay = cand.layout or lay
    s = scale if cand.scale is None else cand.scale
    omega = freqs.inv_freq
    idx = _channel_pairs(channels, pairs, lay)
    angle = np.abs(positions.astype(np.float64)[:, None] * omega[None, :])
    if cand.float32:
        # HF: inv_freq in float32 (within rho32 of exact), the product and cos/sin in float32
        a32 = positions.astype(np.float32)[:, None] * omega.astype(np.float32)[None, :]
        c_p = np.cos(a32).astype(np.float64) * s
        s_p = np.sin(a32).astype(np.float64) * s
        rho32 = _frequency_rtol(spec, 2.0**-24) + 2.0**-23
        tol = abs(s) * (4 * u + 8 * 2.0**-24 + angle * rho32)
    else:
        c_p, s_p = _tables(spec, positions, "half", freqs)
        c_p, s_p = c_p[:, :pairs], s_p[:, :pairs]
        if s != freqs.attention_scaling:
            ratio = s / freqs.attention_scaling
            c_p, s_p = c_p * ratio, s_p * ratio
        tol = _value_tolerance(spec, s, angle, u)
        if u >= 2.0**-24:
            # tables stored in float32 or coarser were most likely computed so: a misreading
            # is told by its frequencies, whatever float32 arithmetic took the angles (HF's
            # rounding, rho32; or pair k's frequency as k float32 products, (2k + 8) ulps)
            rho32 = _frequency_rtol(spec, 2.0**-24) + 2.0**-23
            k = np.arange(pairs, dtype=np.float64)[None, :]
            rel = np.maximum(rho32, (2 * k + 8) * 2.0**-24)
            tol = np.maximum(tol, abs(s) * (4 * u + 8 * 2.0**-24 + angle * rel))
    c_p, s_p, tol = c_p[:, idx], s_p[:, idx], tol[:, idx]
    return bool(np.all(np.abs(tc - c_p) <= tol) and np.all(np.abs(ts - s_p) <= tol))


# --------------------------------------------------------------------------------------
# M-RoPE at multi-axis positions.


def compare_mrope(
    reading: Reading,
    position_ids: npt.NDArray[np.int64],
    cos: npt.NDArray[Any],
    sin: npt.NDArray[Any],
    *,
    source: str = "arrays",
    rounding: float | None = None,
) -> Verdict:
    """Compare one value per pair of an M-RoPE's tables at multi-axis positions.

    Pair ``k`` of the exact table turns by ``position_ids[axis(k)] * omega_k``, the axis
    from the reading's ``mrope_section`` and order
    (:func:`~posenc.families.rotary.multiaxis.mrope.mrope_axes`: Qwen2-VL's contiguous
    sections or Qwen3-VL's interleave). Their tables may also differ only as float32
    angles do (the cause says so). When they diverge, the known misreadings are tried:
    the other order of the sections, and text positions (the temporal axis) for every pair.

    Args:
        reading: an M-RoPE reading (``reading.mrope`` set).
        position_ids: ``(axes, rows)`` int positions (temporal, height, width).
        cos, sin: ``(rows, rotary_dim / 2)``, one value per pair in frequency order.
        source: how messages name the tables.
        rounding: the unit roundoff of their storage dtype (as in :func:`compare`).

    Raises:
        ValueError: not an M-RoPE reading, or arrays of the wrong shapes.
    """
    from posenc.families.rotary.multiaxis.mrope import mrope_axes

    if not reading.mrope:
        raise ValueError(f"{source}: position_ids given, but this RoPE is not an M-RoPE")
    spec = reading.spec
    pairs = spec.rotary_dim // 2
    pos = np.asarray(position_ids, dtype=np.int64)
    tc, ts = np.asarray(cos, dtype=np.float64), np.asarray(sin, dtype=np.float64)
    if pos.ndim != 2 or tc.shape != (pos.shape[1], pairs) or ts.shape != tc.shape:
        raise ValueError(
            f"{source}: cos and sin must be (rows, rotary_dim / 2) = ({pos.shape[-1]}, {pairs}) "
            f"with position_ids (axes, rows); got {tc.shape}, {ts.shape}, {pos.shape}"
        )
    u = rounding or _unit_roundoff(np.result_type(np.asarray(cos).dtype, np.asarray(sin).dtype))
    freqs = spec.frequencies(seq_len=int(pos.max()) + 1)
    scale = freqs.attention_scaling
    omega = freqs.inv_freq.astype(np.float64)
    section = tuple(int(s) for s in reading.mrope["section"])
    interleaved = bool(reading.mrope["interleaved"])

    def exact(axis: Sequence[int]) -> tuple[Any, Any, Any, Any]:
        """Exact cos, sin, angles, and the positions ``(rows, pairs)`` each pair reads."""
        p = pos[np.asarray(axis), :].T
        c, s = _tables(spec, p.reshape(-1), "half", freqs)
        k = np.arange(pairs)
        c = c[:, :pairs].reshape(p.shape[0], pairs, pairs)[:, k, k]
        s = s[:, :pairs].reshape(p.shape[0], pairs, pairs)[:, k, k]
        return c, s, p.astype(np.float64) * omega[None, :], p

    def within(c: Any, s: Any, tol: Any) -> tuple[Any, Any, Any]:
        dc, ds = np.abs(tc - c), np.abs(ts - s)
        return (dc > tol) | (ds > tol), dc, ds

    axis = mrope_axes(section, pairs, axes=pos.shape[0], interleaved=interleaved)
    c, s, angle, read = exact(axis)
    tol = _value_tolerance(spec, scale, angle, u)
    over, dc, ds = within(c, s, tol)
    largest = float(np.max(np.maximum(dc, ds)))
    order = "interleaved (Qwen3-VL)" if interleaved else "contiguous sections (Qwen2-VL)"
    where = f"{pos.shape[1]} multi-axis positions, mrope_section {list(section)}, {order}"
    if not over.any():
        worst = float(np.max(np.maximum(dc, ds) / tol))
        return Verdict(source, reading.layer_type, True,
                       f"{source}: agree ({where}; max |difference| / tolerance {worst:.2g})",
                       layout="pair", score=worst, largest=largest)  # fmt: skip
    # float32 angles: the engine's own arithmetic, as transformers computes them
    a32 = read.astype(np.float32) * omega.astype(np.float32)[None, :]
    rho32 = _frequency_rtol(spec, 2.0**-24) + 2.0**-23
    tol32 = abs(scale) * (4 * u + 8 * 2.0**-24 + np.abs(angle) * rho32)
    f32, _, _ = within(np.cos(a32) * scale, np.sin(a32) * scale, tol32)
    row, k = (int(v) for v in np.argwhere(over)[0])
    which = "cos" if dc[row, k] > tol[row, k] else "sin"
    theirs_v = (tc if which == "cos" else ts)[row, k]
    ours_v = (c if which == "cos" else s)[row, k]
    at = tuple(int(v) for v in pos[:, row])
    first: dict[str, Any] = {"row": row, "position": list(at), "channel": k,
             "table": which, "theirs": float(theirs_v), "posenc": float(ours_v),
             "difference": float(abs(theirs_v - ours_v)),
             "tolerance": float(tol[row, k])}  # fmt: skip
    summary = (
        f"{source}: DIVERGE ({where}): first at position (t, h, w) {at}, "
        f"pair {k} (axis {axis[k]}) of {which}: theirs {theirs_v:.17g}, posenc {ours_v:.17g}; "
        f"{int(over.sum())} of {over.size} values differ"
    )
    if not f32.any():
        f32_cause = ("float32 angles: their differences grow as position x omega x 2**-24; "
                     "they match float32 arithmetic of the same sections")  # fmt: skip
        return Verdict(source, reading.layer_type, False, summary, "pair", first, f32_cause,
                       largest=largest)  # fmt: skip
    cause: str | None = None
    others: list[tuple[str, Sequence[int]]] = [
        ("text positions only: every pair turns with the temporal position (the sections "
         "are not applied)", (0,) * pairs)]  # fmt: skip
    try:
        other = mrope_axes(section, pairs, axes=pos.shape[0], interleaved=not interleaved)
        name = "contiguous sections (Qwen2-VL)" if interleaved else "interleaved (Qwen3-VL)"
        others.append((f"the other order of the sections: {name}", other))
    except ValueError:
        pass
    for text, alt in others:
        ca, sa, angle_a, _ = exact(alt)
        tol_a = np.maximum(_value_tolerance(spec, scale, angle_a, u), tol32)
        if not within(ca, sa, tol_a)[0].any():
            cause = text
            break
    if cause is None:
        cause = _frozen(ts, s, read)
    return Verdict(source, reading.layer_type, False, summary, "pair", first, cause,
                   score=float(np.max(np.maximum(dc, ds) / tol)), largest=largest)  # fmt: skip
