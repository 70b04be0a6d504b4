"""Sinusoidal positional encodings on one axis, in every convention real code uses.

Every convention is a point in one parameter space, :class:`Sinusoid`:

``omega_k = scale * min_timescale * (base / min_timescale) ** (-k / (w / 2 - shift))``

for ``k = 0 .. K - 1``, where ``w`` is the width the exponent is measured
over (``2 * (dim // 2)``, or ``dim`` and ``dim + 1`` for the odd-dim
policies ``"extend"`` and ``"truncate"``). Channel ``k`` of the sine block
holds ``amplitude * sin((position + offset) * omega_k)``, the cosine block
likewise, and ``layout``/``order`` say where each block goes:

- ``layout="interleaved"``: pairs side by side, ``[a0, b0, a1, b1, ...]``
  (the paper's ``PE(p, 2i)`` / ``PE(p, 2i + 1)``);
- ``layout="half"``: ``[a0 .. a(K-1), b0 .. b(K-1)]`` (concatenated, as
  tensor2tensor, fairseq and diffusers do);
- ``order="sin_cos"`` puts sine first (``a = sin``), ``"cos_sin"`` cosine.

Odd ``dim`` policies: ``"zero"`` appends one zero channel, ``"extend"``
evaluates the paper's formula on all ``dim`` channels (the first block gets
the extra channel, as HF Marian does), ``"truncate"`` computes ``dim + 1``
channels and drops the last (positional-encodings), ``"error"`` refuses.

The named presets (:data:`PRESETS`) reproduce the implementations they are
named after; each preset's ``anchor`` text says which function and which
convention (layout, order, denominator, odd dims).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from posenc.core import checks
from posenc.core.angles import (
    Turns,
    geometric_turns,
    progression_blocks,
    progression_table,
    sincos_numpy,
    sincos_torch,
)

#: Sines and cosines interleaved channel by channel, or in two halves.
Layout = Literal["interleaved", "half"]
#: Which comes first in each pair or half: sin or cos.
Order = Literal["sin_cos", "cos_sin"]
#: An odd channel count: a zero last channel, one more frequency, one less, or refused.
OddPolicy = Literal["zero", "extend", "truncate", "error"]

_LAYOUTS = ("interleaved", "half")
_ORDERS = ("sin_cos", "cos_sin")
_ODD = ("zero", "extend", "truncate", "error")


@dataclass(frozen=True)
class Slots:
    """Where the ``K`` frequency pairs of one ``dim`` land in the output row.

    ``first`` holds the channels of the first member of each pair (``sin``
    for ``order="sin_cos"``), ``second`` the other; ``n_first`` may exceed
    ``n_second`` by one for odd dims. ``zero`` is the index of an all-zero
    channel or ``None``.
    """

    dim: int
    n_freq: int
    n_first: int
    n_second: int
    first: slice
    second: slice
    zero: int | None
    denominator: float

    def indices(self) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
        """Channel indices of the first and second members, pair by pair."""
        idx = np.arange(self.dim)
        return idx[self.first], idx[self.second]


@dataclass(frozen=True)
class Sinusoid:
    """One sinusoidal convention, a point of its fields' space: every preset is one.

    Attributes:
        layout: ``"interleaved"`` or ``"half"``.
        order: ``"sin_cos"`` or ``"cos_sin"``: which function comes first.
        base: the maximum timescale (``max_period`` in diffusers, ``theta``).
        min_timescale: tensor2tensor's ``min_timescale``, usually 1; as in its
            code it multiplies every frequency (``omega_0 = min_timescale``).
        shift: subtracted from the exponent denominator ``w / 2``
            (diffusers' ``downscale_freq_shift``; 1 gives ``h - 1``).
        scale: multiplies every angle (diffusers' ``scale``).
        amplitude: multiplies every output value; ``"rsqrt_dim"`` means
            ``dim ** -0.5`` (x-transformers' initial scale).
        offset: added to every position (tensor2tensor's ``start_index``).
        odd: the odd-``dim`` policy.
        anchor: where the convention comes from.

    Examples:
        >>> import numpy as np
        >>> import posenc
        >>> spec = posenc.Sinusoid(layout="half", base=100.0)  # [sin ..., cos ...], max period 100
        >>> posenc.sinusoidal(2, 4, preset=spec).round(4)
        array([[0.    , 0.    , 1.    , 1.    ],
               [0.8415, 0.0998, 0.5403, 0.995 ]], dtype=float32)
        >>> same = posenc.sinusoidal(2, 4, layout="half", base=100.0)  # its fields as overrides
        >>> np.array_equal(posenc.sinusoidal(2, 4, preset=spec), same)
        True
    """

    layout: Layout = "interleaved"
    order: Order = "sin_cos"
    base: float = 10000.0
    min_timescale: float = 1.0
    shift: float = 0.0
    scale: float = 1.0
    amplitude: float | Literal["rsqrt_dim"] = 1.0
    offset: float = 0.0
    odd: OddPolicy = "extend"
    anchor: str = ""

    def __post_init__(self) -> None:
        checks.check_choice(self.layout, "layout", _LAYOUTS)
        checks.check_choice(self.order, "order", _ORDERS)
        checks.check_choice(self.odd, "odd", _ODD)
        checks.check_number(self.base, "base", positive=True)
        checks.check_number(self.min_timescale, "min_timescale", positive=True)
        checks.check_number(self.shift, "shift")
        checks.check_number(self.scale, "scale")
        checks.check_number(self.offset, "offset")
        if self.amplitude != "rsqrt_dim":
            checks.check_number(self.amplitude, "amplitude")

    def replace(self, **overrides: Any) -> Sinusoid:
        """A copy with some fields changed (names and aliases as in :func:`sinusoidal`).

        Raises:
            ValueError: an unknown name, or a diffusers-only alias
                (:data:`DIFFUSERS_ONLY`) on a convention that does not lay channels
                out as diffusers does.
        """
        spec = dataclasses.replace(self, **_canonical_overrides(overrides))
        _check_diffusers_layout(spec, overrides)
        return spec

    def slots(self, dim: int) -> Slots:
        """The channel placement and exponent denominator for ``dim`` channels.

        Raises:
            TypeError: ``dim`` not an int.
            ValueError: ``dim`` below 1 or above
                :data:`posenc.core.checks.MAX_CHANNELS` (refused before any
                frequency is computed), or odd where the convention refuses it.
        """
        dim = checks.check_channels(dim, "dim")
        h, odd = divmod(dim, 2)
        if odd and self.odd == "error":
            raise ValueError(
                f"dim must be even for this convention (odd='error'); got {dim}. "
                "Pass odd='zero', 'extend' or 'truncate' to choose a policy."
            )
        width = {"zero": 2 * h, "error": 2 * h, "extend": dim, "truncate": dim + odd}[self.odd]
        n_freq = h + (odd if self.odd in ("extend", "truncate") else 0)
        denominator = width / 2 - self.shift
        if n_freq > 1 and denominator <= 0:
            raise ValueError(
                f"the exponent denominator {width}/2 - shift must be > 0; got shift="
                f"{self.shift:g} with dim={dim}"
            )
        n_first, n_second = n_freq, h
        if self.layout == "interleaved":
            first, second = slice(0, 2 * n_first - 1, 2), slice(1, 2 * n_second, 2)
        else:
            first, second = slice(0, n_first), slice(n_first, n_first + n_second)
        zero = dim - 1 if odd and self.odd == "zero" else None
        return Slots(dim, n_freq, n_first, n_second, first, second, zero, denominator)

    def sin_cos_channels(self, dim: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
        """The channels holding ``sin(omega_k p)`` and ``cos(omega_k p)``, pair by pair.

        :meth:`Slots.indices` gives them in row order; which of the two is the
        sine depends on ``order``.
        """
        first, second = self.slots(dim).indices()
        return (first, second) if self.order == "sin_cos" else (second, first)

    def turns(self, dim: int) -> Turns:
        """The exact frequencies (in turns) of the ``dim``-channel encoding."""
        s = self.slots(dim)
        return geometric_turns(
            s.n_freq, float(self.base), float(self.min_timescale), s.denominator, float(self.scale)
        )

    def inv_freq(self, dim: int) -> npt.NDArray[np.float64]:
        """The angular frequencies ``omega_k`` (radians per position), float64."""
        return self.turns(dim).radians.copy()

    def amplitude_for(self, dim: int) -> float:
        """The factor the values are multiplied by at ``dim`` channels (``d**-0.5`` for
        x-transformers' ``"rsqrt_dim"``)."""
        return dim**-0.5 if self.amplitude == "rsqrt_dim" else float(self.amplitude)


#: The named conventions, by name (``posenc presets`` lists them with their sources).
PRESETS: dict[str, Sinusoid] = {
    "vaswani": Sinusoid(
        anchor="Vaswani et al. 2017 section 3.5, the PyTorch tutorial, the Annotated "
        "Transformer, HF DistilBERT: interleaved sin/cos, 10000^(-2k/d); odd dim evaluates "
        "the formula on every channel"
    ),
    "tensor2tensor": Sinusoid(
        layout="half",
        shift=1.0,
        odd="zero",
        anchor="tensor2tensor get_timing_signal_1d: [sin, cos], "
        "min_ts * (max_ts/min_ts)^(-k/max(h-1, 1)), zero channel for odd dim",
    ),
    "fairseq": Sinusoid(
        layout="half",
        shift=1.0,
        odd="zero",
        anchor="fairseq SinusoidalPositionalEmbedding.get_embedding (HF M2M100): [sin, cos], "
        "exp(-k ln(1e4)/(h-1)); rows are position numbers (real tokens start at "
        "padding_idx + 1); at dim 2 and 3 fairseq divides by zero, posenc uses omega_0 = 1",
    ),
    "marian": Sinusoid(
        layout="half",
        anchor="HF Marian/Pegasus: p / 10000^(2(j//2)/d) with sin in the first ceil(d/2) "
        "channels and cos in the rest",
    ),
    "whisper": Sinusoid(
        layout="half",
        shift=1.0,
        odd="error",
        anchor="Whisper sinusoids(length, channels): [sin, cos], exp(-k ln(1e4)/(h-1))",
    ),
    "musicgen": Sinusoid(
        layout="half",
        order="cos_sin",
        shift=1.0,
        odd="zero",
        anchor="HF MusicGen: [cos, sin], exp(-k ln(1e4)/(h-1)), zero channel for odd dim",
    ),
    "ddpm": Sinusoid(
        layout="half",
        shift=1.0,
        odd="zero",
        anchor="diffusers get_timestep_embedding defaults (flip_sin_to_cos=False, "
        "downscale_freq_shift=1), original DDPM: [sin, cos], exp(-ln(1e4) k/(h-1))",
    ),
    "ldm": Sinusoid(
        layout="half",
        order="cos_sin",
        odd="zero",
        anchor="guided-diffusion / Stable Diffusion / DiT timestep_embedding "
        "(diffusers flip_sin_to_cos=True, downscale_freq_shift=0): [cos, sin], exp(-ln(1e4) k/h)",
    ),
    "annotated-diffusion": Sinusoid(
        layout="half",
        shift=1.0,
        odd="zero",
        anchor="The Annotated Diffusion Model SinusoidalPositionEmbeddings: [sin, cos], "
        "exp(-k ln(1e4)/(h-1)); the original returns dim-1 channels for odd dim, posenc "
        "appends a zero channel",
    ),
    "positional-encodings": Sinusoid(
        odd="truncate",
        anchor="positional-encodings PositionalEncoding1D (>= 5.1): interleaved, "
        "1/10000^(2k/C) with C = 2 ceil(d/2), truncated to d",
    ),
    "x-transformers": Sinusoid(
        layout="half",
        odd="error",
        amplitude="rsqrt_dim",
        anchor="x-transformers ScaledSinusoidalEmbedding at initialisation: [sin, cos], "
        "theta^(-k/h), times a learnable scale initialised to d^-0.5",
    ),
}

_FIELDS = tuple(f.name for f in dataclasses.fields(Sinusoid) if f.name != "anchor")
#: Names users know from the anchors, mapped to posenc's fields. ``max_period``
#: (diffusers), ``max_timescale`` (tensor2tensor) and ``theta`` are ``base``, and
#: ``start_index`` (tensor2tensor) is ``offset``, on every preset; diffusers' ``scale``
#: is posenc's field of that name. diffusers' ``flip_sin_to_cos`` (``order``) and
#: ``downscale_freq_shift`` (``shift``) are accepted only where the layout is
#: diffusers' (:data:`DIFFUSERS_ONLY`).
ALIASES = {
    "max_period": "base",
    "max_timescale": "base",
    "theta": "base",
    "downscale_freq_shift": "shift",
    "start_index": "offset",
    "flip_sin_to_cos": "order",
}
#: diffusers' ``get_timestep_embedding`` knobs. Their meaning includes diffusers' layout,
#: ``[sin, cos]`` halves with a zero channel for odd dim; on the default interleaved
#: convention ``flip_sin_to_cos=True, downscale_freq_shift=0`` would silently give
#: Vaswani's layout instead, so they are accepted only where the layout is ``"half"``
#: and an odd dim gets a zero channel (or is refused): ``preset="ddpm"`` (diffusers'
#: defaults) and ``preset="ldm"`` (``flip_sin_to_cos=True, downscale_freq_shift=0``),
#: among others.
DIFFUSERS_ONLY = ("flip_sin_to_cos", "downscale_freq_shift")


def _canonical_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    return checks.canonical_overrides(
        overrides, _FIELDS, ALIASES, {"flip_sin_to_cos": ("cos_sin", "sin_cos")}
    )


def _check_diffusers_layout(spec: Sinusoid, overrides: dict[str, Any]) -> None:
    """Refuse a diffusers-only alias where the layout is not diffusers' (:data:`DIFFUSERS_ONLY`)."""
    given = [name for name in DIFFUSERS_ONLY if name in overrides]
    if given and (spec.layout != "half" or spec.odd not in ("zero", "error")):
        raise ValueError(
            f"{given[0]} is diffusers' get_timestep_embedding knob and means its layout: "
            "[sin, cos] halves, a zero channel for odd dim; this convention has "
            f"layout={spec.layout!r}, odd={spec.odd!r}. Pass preset='ddpm' (diffusers' "
            "defaults) or preset='ldm' (flip_sin_to_cos=True, downscale_freq_shift=0), or "
            "layout='half', odd='zero' with it; order= and shift= change the convention "
            "without implying a layout"
        )


def resolve(preset: str | Sinusoid = "vaswani", **overrides: Any) -> Sinusoid:
    """The :class:`Sinusoid` named by ``preset`` with ``overrides`` applied."""
    if isinstance(preset, Sinusoid):
        spec = preset
    elif isinstance(preset, str) and preset in PRESETS:
        spec = PRESETS[preset]
    else:
        raise ValueError(
            f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)} (or a Sinusoid)"
        )
    return spec.replace(**overrides) if overrides else spec


# --------------------------------------------------------------------------------------
# Evaluation


def sinusoidal(
    positions: Any,
    dim: int,
    *,
    preset: str | Sinusoid = "vaswani",
    dtype: Any = None,
    device: Any = None,
    **overrides: Any,
) -> Any:
    """Sinusoidal positional encodings, exact at any position below 2**31.

    Args:
        positions: an int ``n`` (positions ``0 .. n-1``), or a 1-D array,
            sequence or tensor of int or float positions (negative values are
            offsets and valid; float values are e.g. diffusion timesteps).
        dim: number of channels (a positive int, at most
            :data:`posenc.core.checks.MAX_CHANNELS`).
        preset: a name from :data:`PRESETS` or a :class:`Sinusoid`.
        dtype: output dtype (float16, bfloat16 for torch, float32, float64);
            float32 by default. A torch dtype with int or numpy positions gives
            a CPU torch tensor.
        device: a torch device (``torch.device``, ``"cuda:0"`` ...): the result
            is a torch tensor there, as if torch positions on that device had
            been passed (torch positions elsewhere are moved there). ``None``
            keeps the rule of the Returns section.
        **overrides: any :class:`Sinusoid` field (``layout``, ``order``,
            ``base``, ``min_timescale``, ``shift``, ``scale``, ``amplitude``,
            ``offset``, ``odd``) or an alias from :data:`ALIASES`
            (``max_period``, ``flip_sin_to_cos``, ``downscale_freq_shift`` ...).
            diffusers' ``flip_sin_to_cos`` and ``downscale_freq_shift`` bring
            diffusers' layout with them: they are refused on a convention that
            lays channels out otherwise, such as the default interleaved one
            (use ``preset="ddpm"`` or ``"ldm"``, see :data:`DIFFUSERS_ONLY`).

    Returns:
        ``(len(positions), dim)``: numpy for numpy, list or int input, torch on
        the positions' device for torch input (or on ``device``). Each value is
        the float64-exact encoding rounded once to ``dtype``.

    Raises:
        TypeError: ``dim`` not an int, ``positions`` not numeric, bad ``dtype``
            or ``device``.
        ValueError: ``positions`` not 1-D, NaN/inf, beyond ``2**31``; ``dim``
            above :data:`posenc.core.checks.MAX_CHANNELS` or a result of more
            than :data:`posenc.core.checks.MAX_ELEMENTS` values (refused before
            any work); unknown preset or override; invalid override values; a
            diffusers-only alias on a layout that is not diffusers'; a ``device``
            that names no torch device.

    Examples:
        >>> import posenc
        >>> posenc.sinusoidal(3, 4).round(4)
        array([[ 0.    ,  1.    ,  0.    ,  1.    ],
               [ 0.8415,  0.5403,  0.01  ,  1.    ],
               [ 0.9093, -0.4161,  0.02  ,  0.9998]], dtype=float32)
    """
    spec = resolve(preset, **overrides)
    slots = spec.slots(dim)
    name = checks.dtype_name("float32" if dtype is None else dtype)
    where = None if device is None else checks.check_device(device)
    if isinstance(positions, (int, np.integer)) and not isinstance(positions, bool):
        n = int(positions)
        if n < 0:
            raise ValueError(f"positions as an int is a length and must be >= 0; got {n}")
        if n and not abs(spec.offset) + n - 1 < 2**31:
            raise ValueError(
                f"positions 0..{n - 1} plus offset {spec.offset:g} reach beyond 2**31, "
                "the range in which posenc is exact"
            )
        arr, rows = None, n
    else:
        arr = checks.check_positions(positions, spec.offset)
        rows = int(arr.shape[0])
    checks.check_elements(rows * slots.dim, f"the encoding of {rows} positions x dim={dim}")
    if arr is None:
        as_torch = checks.is_torch_dtype(dtype) or where is not None
        if not as_torch:
            checks.numpy_dtype(name)  # bfloat16 needs torch output
        # bfloat16 has no numpy type: round the float64 table once, in torch
        table = _table(n, spec, slots, "float64" if name == "bfloat16" else name)
        if as_torch:
            import torch

            return torch.from_numpy(table).to(device=where, dtype=checks.torch_dtype(name))
        return table
    if checks.wants_torch(arr, dtype) or where is not None:
        if not checks.is_torch(arr):
            import torch

            arr = torch.from_numpy(np.ascontiguousarray(arr))
        if where is not None:
            arr = arr.to(where)
        return _direct_torch(arr, spec, slots, name)
    return _direct_numpy(arr, spec, slots, checks.numpy_dtype(name))


def _phasor_form(spec: Sinusoid, dim: int) -> tuple[complex, bool]:
    """``w = first + i second`` as ``coefficient * z`` or ``coefficient * conj(z)``.

    ``z = cos + i sin``; for ``order="sin_cos"``, ``sin + i cos = i conj(z)``.
    """
    amp = spec.amplitude_for(dim)
    return (complex(0.0, amp), True) if spec.order == "sin_cos" else (complex(amp, 0.0), False)


def _write_numpy(out: npt.NDArray[Any], w: npt.NDArray[np.complex128], slots: Slots) -> None:
    """Write pairs ``w = first + i second`` (rows, K) into ``out`` (rows, dim)."""
    pairs = slots.n_second
    if slots.first.step == 2 and out.dtype in (np.float32, np.float64) and pairs:
        # interleaved pairs are one complex array: a single contiguous cast
        ctype = np.complex64 if out.dtype == np.float32 else np.complex128
        out[:, : 2 * pairs].view(ctype)[...] = w[:, :pairs]
        if slots.n_first > pairs:
            out[:, 2 * pairs] = w[:, pairs].real
    else:
        out[:, slots.first] = w.real[:, : slots.n_first]
        out[:, slots.second] = w.imag[:, : slots.n_second]
    if slots.zero is not None:
        out[:, slots.zero] = 0


_DIRECT_ROWS = 128  # below this many rows a table is evaluated position by position


def _table(n: int, spec: Sinusoid, slots: Slots, name: str) -> npt.NDArray[Any]:
    if n < _DIRECT_ROWS:
        return _direct_numpy(np.arange(n), spec, slots, checks.numpy_dtype(name))
    out = np.empty((n, slots.dim), dtype=checks.numpy_dtype(name))
    coefficient, conjugate = _phasor_form(spec, slots.dim)
    turns = spec.turns(slots.dim)
    first = (slots.first.start, slots.first.step or 1, slots.n_first)
    second = (slots.second.start, slots.second.step or 1, slots.n_second)
    if progression_table(
        spec.offset, n, turns, out, first, second, coefficient=coefficient, conjugate=conjugate
    ):
        if slots.zero is not None:
            out[:, slots.zero] = 0
        return out
    target = _pair_view(out, slots)
    if target is not None:
        # interleaved pairs are complex numbers: the products land in place
        progression_blocks(
            spec.offset, n, turns, target=target, coefficient=coefficient, conjugate=conjugate
        )
        if slots.zero is not None:
            out[:, slots.zero] = 0
        return out

    def emit(row0: int, w: npt.NDArray[np.complex128]) -> None:
        _write_numpy(out[row0 : row0 + w.shape[0]], w, slots)

    progression_blocks(spec.offset, n, turns, emit, coefficient=coefficient, conjugate=conjugate)
    return out


def _pair_view(out: npt.NDArray[Any], slots: Slots) -> npt.NDArray[Any] | None:
    """``out``'s interleaved (first, second) pairs as one complex array, if it has one.

    Exists when every frequency has both members side by side (interleaved
    layout, no lone channel) and the dtype has a complex counterpart.
    """
    if slots.first.step != 2 or slots.n_first != slots.n_second or not slots.n_first:
        return None
    ctype = {np.dtype(np.float32): np.complex64, np.dtype(np.float64): np.complex128}
    if out.dtype not in ctype:
        return None
    return out[:, : 2 * slots.n_second].view(ctype[out.dtype])


def _direct_numpy(
    positions: npt.NDArray[Any], spec: Sinusoid, slots: Slots, dtype: Any
) -> npt.NDArray[Any]:
    p = positions.astype(np.float64) + spec.offset
    s, c = sincos_numpy(p, spec.turns(slots.dim))
    w = np.empty(s.shape, dtype=np.complex128)
    w.real, w.imag = (s, c) if spec.order == "sin_cos" else (c, s)
    w *= spec.amplitude_for(slots.dim)
    out = np.empty((p.shape[0], slots.dim), dtype=dtype)
    _write_numpy(out, w, slots)
    return out


def _direct_torch(positions: Any, spec: Sinusoid, slots: Slots, name: str) -> Any:
    import torch

    p = positions
    if spec.offset:
        integral = float(spec.offset).is_integer() and not p.is_floating_point()
        p = p.to(torch.int64) + int(spec.offset) if integral else p.double() + spec.offset
    s, c = sincos_torch(p, spec.turns(slots.dim))
    first, second = (s, c) if spec.order == "sin_cos" else (c, s)
    amp = spec.amplitude_for(slots.dim)
    if amp != 1.0:
        first, second = first * amp, second * amp
    out = torch.empty(
        (p.shape[0], slots.dim), dtype=checks.torch_dtype(name), device=positions.device
    )
    out[:, slots.first] = first[:, : slots.n_first]
    out[:, slots.second] = second[:, : slots.n_second]
    if slots.zero is not None:
        out[:, slots.zero] = 0
    return out


# --------------------------------------------------------------------------------------
# The shift operator


def shift_matrix(
    offset: float, dim: int, *, preset: str | Sinusoid = "vaswani", **overrides: Any
) -> npt.NDArray[np.float64]:
    """The matrix ``M`` with ``sinusoidal(p + offset) == sinusoidal(p) @ M.T`` for every p.

    Each (sin, cos) pair of frequency ``omega`` is rotated by ``offset * omega``;
    the blocks sit where the preset's layout puts the pair. This answers the
    question in the paper's section 3.5: one sine column at ``p + k`` is *not*
    a linear function of the same column at ``p``, but the pair is, exactly:
    ``sin(a + b) = sin a cos b + cos a sin b``.

    Args:
        offset: the shift ``k`` in positions (int or float; negative shifts back).
        dim: number of channels.
        preset: as in :func:`sinusoidal`; ``**overrides`` likewise.

    Returns:
        ``(dim, dim)`` float64 numpy array; a zero channel maps to itself.

    Raises:
        ValueError: for odd ``dim`` with a lone channel (``odd="extend"`` or
            ``"truncate"``): its partner is missing, so no such matrix exists;
            a matrix of more than :data:`posenc.core.checks.MAX_ELEMENTS`
            entries (refused before any work).

    Examples:
        >>> import numpy as np
        >>> import posenc
        >>> pe = posenc.sinusoidal(10, 8, dtype="float64")
        >>> M = posenc.shift_matrix(3, 8)  # maps PE(p) to PE(p + 3)
        >>> M.shape
        (8, 8)
        >>> np.allclose(pe[:-3] @ M.T, pe[3:])
        True
    """
    spec = resolve(preset, **overrides)
    slots = spec.slots(dim)
    checks.check_elements(slots.dim * slots.dim, f"shift_matrix's (dim, dim) matrix, dim={dim}")
    k = checks.check_number(offset, "offset")
    if slots.n_first != slots.n_second:
        raise ValueError(
            f"dim={dim} with odd={spec.odd!r} leaves a lone channel without its partner, so "
            "no linear shift operator exists; use an even dim or odd='zero'"
        )
    s, c = sincos_numpy(np.array([k]), spec.turns(dim))
    s, c = s[0], c[0]
    sign = 1.0 if spec.order == "sin_cos" else -1.0
    first, second = slots.indices()
    m = np.zeros((dim, dim), dtype=np.float64)
    m[first, first] = c
    m[first, second] = sign * s
    m[second, second] = c
    m[second, first] = -sign * s
    if slots.zero is not None:
        m[slots.zero, slots.zero] = 1.0
    return m
