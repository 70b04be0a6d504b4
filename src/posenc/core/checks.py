"""numpy / torch dispatch and input validation shared by every family.

numpy in gives numpy out; torch in gives torch out on the same device. torch is
imported only when a torch object is seen or asked for.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from posenc.core.angles import EXACT_LIMIT

_NUMPY_FLOATS = {
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
}
_TORCH_ONLY = {"bfloat16"}


def is_torch(x: Any) -> bool:
    """True for a ``torch.Tensor`` (without importing torch when it is absent)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_torch_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` is a ``torch.dtype`` (False when torch is not imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(dtype, torch.dtype)


def dtype_name(dtype: Any) -> str:
    """Canonical name (``"float32"``...) of a str, numpy or torch float dtype.

    Raises:
        TypeError: for anything but float16, bfloat16, float32 and float64.
    """
    accepted = "one of float16, bfloat16 (torch only), float32, float64"
    if is_torch_dtype(dtype):
        name = str(dtype).removeprefix("torch.")
    elif isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            raise TypeError(f"dtype must be {accepted}; got {dtype!r}") from None
    if name not in _NUMPY_FLOATS and name not in _TORCH_ONLY:
        raise TypeError(f"dtype must be {accepted}; got {dtype!r}")
    return name


def wants_torch(positions: Any, dtype: Any) -> bool:
    """Whether the result is a torch tensor: torch positions, or a torch dtype."""
    return is_torch(positions) or is_torch_dtype(dtype)


def torch_dtype(name: str) -> Any:
    """The ``torch.dtype`` named ``name`` (``"float32"`` -> ``torch.float32``)."""
    import torch

    return getattr(torch, name)


def numpy_dtype(name: str) -> Any:
    """The numpy dtype named ``name``; a dtype only torch has (bfloat16) is a TypeError."""
    if name in _TORCH_ONLY:
        raise TypeError(f"dtype {name} needs torch output: pass torch positions or a torch dtype")
    return _NUMPY_FLOATS[name]


def check_int(value: Any, name: str, minimum: int = 0) -> int:
    """Validate an int parameter: a Python or numpy int (not a bool) of at least ``minimum``.

    Raises:
        TypeError: not an int.
        ValueError: below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= {minimum}; got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value}")
    return int(value)


#: Channel counts above this are refused before any work: every channel pair costs one
#: 40-digit frequency (about 40 us), and no model has this many channels.
MAX_CHANNELS = 1 << 16
#: Results of more elements (8 GiB of float32) are refused before any work.
MAX_ELEMENTS = 1 << 31


def check_channels(value: Any, name: str = "dim", minimum: int = 1) -> int:
    """A channel count: an int from ``minimum`` to :data:`MAX_CHANNELS`, checked before any work.

    Raises:
        TypeError: not an int.
        ValueError: below ``minimum`` or above :data:`MAX_CHANNELS`.
    """
    value = check_int(value, name, minimum)
    if value > MAX_CHANNELS:
        raise ValueError(
            f"{name} must be at most {MAX_CHANNELS} channels; got {value} (no model has this "
            "many, and each channel pair of an exact encoding costs a 40-digit frequency: "
            "posenc refuses before any work)"
        )
    return value


def check_elements(count: int, what: str) -> None:
    """Refuse a result of more than :data:`MAX_ELEMENTS` elements, before any work.

    Raises:
        ValueError: naming ``what`` and its size.
    """
    if count > MAX_ELEMENTS:
        raise ValueError(
            f"{what} would hold {count} elements ({count * 4 / 2**30:.3g} GiB as float32); "
            f"posenc refuses more than {MAX_ELEMENTS} before computing anything"
        )


def check_bool(value: Any, name: str) -> bool:
    """Reject anything but ``True`` or ``False`` (1, 0 and None included)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool; got {type(value).__name__} {value!r}")
    return value


def check_number(value: Any, name: str, *, positive: bool = False) -> float:
    """Validate a finite real scalar (positive if asked)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__} {value!r}")
    v = float(value)
    if not math.isfinite(v):  # math, not numpy: traceable by torch.compile
        raise ValueError(f"{name} must be finite; got {value!r}")
    if positive and v <= 0:
        raise ValueError(f"{name} must be > 0; got {value!r}")
    return v


def compiling() -> bool:
    """Whether torch.compile is tracing the caller (False when torch is not imported).

    Under tracing a tensor's values are unknown, so the checks that read them
    (ranges, exactness) are skipped; without torch nothing can be tracing.
    """
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.compiler.is_compiling())


def check_positions(positions: Any, offset: float = 0.0, *, name: str = "positions") -> Any:
    """Validate positions: a 1-D numeric array or tensor of finite values.

    Returns the numpy array (lists become arrays) or the tensor unchanged.

    Raises:
        TypeError: not an array/tensor/sequence of real numbers.
        ValueError: not 1-D, NaN or infinite values, or ``|position + offset|``
            at or beyond ``2**31`` (the range in which posenc is exact).
    """
    if is_torch(positions):
        if positions.is_complex() or positions.dtype == sys.modules["torch"].bool:
            raise TypeError(f"{name} must hold int or float values; got {positions.dtype}")
        arr = positions
    else:
        try:
            arr = np.asarray(positions)
        except Exception as exc:  # pragma: no cover - numpy raises various errors
            raise TypeError(f"{name} must be an int, a 1-D array or a tensor: {exc}") from None
        if arr.dtype.kind not in "iuf":
            raise TypeError(
                f"{name} must hold int or float values; got dtype {arr.dtype} "
                f"from {type(positions).__name__}"
            )
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (seq,); got shape {tuple(arr.shape)}")
    if arr.shape[0] and not compiling():
        check_range(arr, offset, name)
    return arr


def check_range(arr: Any, offset: float, name: str) -> tuple[float, float]:
    """Reject NaN, infinite and out-of-range values (syncs a device tensor once).

    Returns:
        ``(min, max)`` of ``arr`` (before the offset).
    """
    lo, hi = tensor_bounds(arr) if is_torch(arr) else (float(arr.min()), float(arr.max()))
    if not (math.isfinite(lo) and math.isfinite(hi)):  # NaN propagates through min and max
        raise ValueError(f"{name} must be finite; got NaN or infinite values")
    check_exact(lo + offset, hi + offset, f"{name} (plus offset {offset:g})" if offset else name)
    return lo, hi


def tensor_bounds(t: Any) -> tuple[float, float]:
    """``(min, max)`` of a non-empty int or float torch tensor, in one device sync.

    Every int dtype is read whole: int64 values exactly; uint16, uint32 and uint64,
    for which torch has no ``aminmax``, through float64 (exact below ``2**53``, so a
    uint64 value from ``2**63`` on does not wrap to a negative one).
    """
    import torch

    a = t.detach()
    if a.is_floating_point() or a.dtype in _wide_unsigned():
        a = a.double()
    if a.numel() == 1:  # a decode step's one position: one read, no reduction
        v = a.item()
        return v, v
    lo, hi = torch.stack(list(torch.aminmax(a))).tolist()
    return lo, hi


def _wide_unsigned() -> tuple[Any, ...]:
    import torch

    return tuple(getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n))


def check_exact(lo: float, hi: float, name: str) -> None:
    """Reject values from ``lo`` to ``hi`` that leave ``(-2**31, 2**31)``, where posenc is exact."""
    extreme = max(abs(lo), abs(hi))
    if not extreme < EXACT_LIMIT:
        raise ValueError(
            f"{name} must lie in (-2**31, 2**31), the range in which posenc is exact; "
            f"got values up to {extreme:.6g} in magnitude"
        )


def check_choice(value: Any, name: str, accepted: tuple[str, ...]) -> None:
    """Reject a value outside ``accepted``, naming the parameter and the choices."""
    if value not in accepted:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, accepted))}; got {value!r}")


def canonical_overrides(
    overrides: dict[str, Any],
    fields: tuple[str, ...],
    aliases: dict[str, str],
    flags: dict[str, tuple[str, str]],
) -> dict[str, Any]:
    """Map preset overrides (posenc names or the anchors' aliases) to field values.

    Args:
        overrides: the keyword arguments a user passed.
        fields: the dataclass fields that may be overridden.
        aliases: anchor name -> field name (``max_period`` -> ``base``).
        flags: boolean aliases -> (value when True, value when False), e.g.
            diffusers' ``flip_sin_to_cos`` -> ``("cos_sin", "sin_cos")``.

    Raises:
        ValueError: an unknown name (the valid ones are listed), or two names
            for one field.
        TypeError: a boolean alias given something else than a bool.
    """
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        name = aliases.get(key, key)
        if name not in fields:
            valid = ", ".join(fields + tuple(aliases))
            raise ValueError(f"unknown override {key!r}; valid overrides: {valid}")
        if key in flags:
            if not isinstance(value, bool):
                raise TypeError(f"{key} must be a bool; got {value!r}")
            value = flags[key][0] if value else flags[key][1]
        if name in out:
            raise ValueError(f"override {key!r} repeats {name!r}")
        out[name] = value
    return out


# --------------------------------------------------------------------------------------
# torch tensors (torch is imported only when these are called)


def check_device(device: Any, name: str = "device") -> Any:
    """A torch device: a ``torch.device``, a str (``"cpu"``, ``"cuda:0"``) or a device index.

    Raises:
        TypeError: anything else (None and bools included).
        ValueError: a str or index that names no torch device.
    """
    import torch

    if isinstance(device, torch.device):
        return device
    accepted = "a torch.device, a str such as 'cpu' or 'cuda:0', or a device index"
    if isinstance(device, bool) or not isinstance(device, (str, int, np.integer)):
        raise TypeError(f"{name} must be {accepted}; got {type(device).__name__} {device!r}")
    try:
        return torch.device(device if isinstance(device, str) else int(device))
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"{name} must be {accepted}; got {device!r} ({exc})") from None


def work_dtype(dtype: Any) -> Any:
    """The dtype torch paths compute in: float64 stays float64, every other float
    (bfloat16, float16, float32) works in float32 and is rounded once at the end."""
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


def check_float_tensor(t: Any, name: str) -> Any:
    """Reject anything but a floating-point torch tensor, naming the parameter."""
    if not is_torch(t) or not t.is_floating_point():
        shown = t.dtype if is_torch(t) else type(t).__name__
        raise TypeError(f"{name} must be a float tensor; got {shown}")
    return t


def check_position_tensor(
    t: Any, name: str = "positions", *, floats: bool = True, exact: bool = False
) -> Any:
    """A torch tensor of int (or, with ``floats``, int or float) positions.

    With ``exact``, its values must also be finite and lie in ``(-2**31, 2**31)``,
    where posenc is exact (not inspected while ``torch.compile`` traces).

    Raises:
        TypeError: not a tensor (``torch.as_tensor`` converts), or bool, complex
            or (without ``floats``) floating-point values.
        ValueError: with ``exact``, values out of range.
    """
    if not is_torch(t):
        raise TypeError(
            f"{name} must be a torch tensor (torch.as_tensor converts); got {type(t).__name__}"
        )
    if (
        t.dtype == sys.modules["torch"].bool
        or t.is_complex()
        or (t.is_floating_point() and not floats)
    ):
        kind = "int or float" if floats else "int"
        raise TypeError(f"{name} must hold {kind} values; got {t.dtype}")
    if exact and t.numel() and not compiling():
        check_range(t, 0.0, name)
    return t


def is_int_offset(offset: Any, name: str = "offset") -> bool:
    """Validate a KV-cache offset: True for an int (or a SymInt under torch.compile),
    False for a 0-d int tensor.

    Raises:
        TypeError: anything else (floats, bools, tensors of another shape or dtype).
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(offset, torch.Tensor):
        bad = offset.dtype == torch.bool or offset.is_floating_point() or offset.is_complex()
        if offset.ndim != 0 or bad:
            raise TypeError(
                f"{name} as a tensor must be a 0-d int tensor; got {offset.dtype} "
                f"of shape {tuple(offset.shape)}"
            )
        return False
    if torch is not None and isinstance(offset, torch.SymInt):
        return True
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise TypeError(
            f"{name} must be an int or a 0-d int tensor; got {type(offset).__name__} {offset!r}"
        )
    return True


def is_zero(offset: Any) -> bool:
    """True for the int 0 (the default offset), False for anything else, tensors included."""
    return isinstance(offset, (int, np.integer)) and not isinstance(offset, bool) and offset == 0
