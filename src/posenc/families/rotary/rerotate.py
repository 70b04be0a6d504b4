"""Re-rotating cached keys when a length-dependent RoPE schedule changes its frequencies.

HF's ``dynamic`` NTK scaling grows its base as the sequence grows past
``max_position_embeddings``, and LongRoPE (Phi-3's ``longrope``) switches from
``short_factor`` to ``long_factor`` past ``original_max_position_embeddings``
(:mod:`posenc.rotary.dynamic`); keys already in a KV cache keep the tables they
were rotated with. A key ``k`` at position ``p``, cached as ``a_old R(p omega_old) k``
(``a`` the attention scaling that multiplies cos and sin: YaRN's mscale,
LongRoPE's factor), becomes the key the new tables give by one more rotation,
since the rotations of a channel pair commute:

    a_new R(p omega_new) k = (a_new / a_old) R(p (omega_new - omega_old)) [a_old R(p omega_old) k]

The angle ``p (omega_new - omega_old)`` is evaluated by the exact angle engine
(:mod:`posenc.core.angles`) from the difference of the exact (40-digit)
frequencies, reduced modulo one turn, not as the difference of two float32
angles (each off by about ``p omega 2**-24``: 6e-3 radians at position 1e5). The
re-rotated keys therefore equal the keys recomputed from the unrotated ones
with the new tables within float32 rounding at any position below ``2**31``:
one float32 rotation of a pair ``(x1, x2)`` by tables rounded once is within
``3 * 2**-24 * a * |(x1, x2)|`` of exact per channel (the tables' rounding,
the two products', the sum's), so the cached keys, their re-rotation and the
recomputation together differ by at most ``9 * 2**-24 * a_new * |(x1, x2)|``.

:func:`rerotation_cos_sin` gives the tables of that rotation (for a kernel of
one's own), :func:`rerotate_keys` applies them; :meth:`posenc.Rotary.rerotate`
and :func:`posenc.hf.rerotate_cache` read the frequencies from a module or an HF
config and cache.
"""

from __future__ import annotations

import decimal
import functools
from typing import Any

import torch

from posenc.core import checks
from posenc.core.angles import decimal_context
from posenc.families.rotary.apply import apply_rotary
from posenc.families.rotary.schedules import RopeFrequencies
from posenc.families.rotary.tables import LAYOUTS, Layout, check_size, cos_sin

__all__ = [
    "rerotate_keys",
    "rerotation_cos_sin",
]


def _check_frequencies(old: Any, new: Any) -> None:
    for name, f in (("old", old), ("new", new)):
        if not isinstance(f, RopeFrequencies):
            raise TypeError(
                f"{name} must be RopeFrequencies (posenc.rotary.schedules.frequencies(...), "
                f"RopeSpec.frequencies(seq_len)); got {type(f).__name__}"
            )
        checks.check_number(f.attention_scaling, f"{name}.attention_scaling", positive=True)
    if len(old.omega) != len(new.omega):
        raise ValueError(
            f"old and new must have as many frequencies (rotary_dim / 2); got {len(old.omega)} "
            f"and {len(new.omega)}"
        )


def _difference(old: RopeFrequencies, new: RopeFrequencies) -> RopeFrequencies:
    """``omega_new - omega_old`` (exact, 40 digits) with the scaling ratio ``a_new / a_old``."""
    ratio = float(new.attention_scaling) / float(old.attention_scaling)
    return _exact_difference(tuple(old.omega), tuple(new.omega), ratio)


# a serving loop re-rotates by the same pair of tables layer after layer, step after step:
# the decimal subtraction and the engine's split of the difference are made once per pair
@functools.lru_cache(maxsize=64)
def _exact_difference(
    old: tuple[decimal.Decimal, ...], new: tuple[decimal.Decimal, ...], ratio: float
) -> RopeFrequencies:
    ctx = decimal_context()
    return RopeFrequencies(tuple(ctx.subtract(n, o) for o, n in zip(old, new, strict=True)), ratio)


def rerotation_cos_sin(
    positions: torch.Tensor,
    old: RopeFrequencies,
    new: RopeFrequencies,
    *,
    layout: Layout = "half",
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cos/sin tables that turn keys rotated by ``old`` into keys rotated by ``new``.

    ``cos`` and ``sin`` of ``p (omega_new - omega_old)``, the angle difference
    evaluated exactly, times ``new.attention_scaling / old.attention_scaling``, in
    the layout order of :func:`posenc.rotary.tables.cos_sin`: what
    :func:`posenc.rotary.apply.apply_rotary` (or HF's ``apply_rotary_pos_emb`` for
    ``"half"``) takes to re-rotate cached keys.

    Args:
        positions: int or float tensor of any shape: the keys' positions.
        old: the frequencies the keys were rotated with.
        new: the frequencies they should carry.
        layout: ``"half"`` or ``"interleaved"``.
        dtype: result dtype (float32 by default).

    Returns:
        ``(cos, sin)``, each ``positions.shape + (rotary_dim,)``.

    Raises:
        TypeError: ``old`` or ``new`` not :class:`RopeFrequencies`; ``positions`` not
            an int or float tensor.
        ValueError: different frequency counts, a non-positive attention scaling,
            unknown ``layout``, positions beyond ``2**31`` in magnitude; tables of
            more than :data:`posenc.core.checks.MAX_ELEMENTS` values
            (``positions.numel() * rotary_dim``, refused before any work).

    Examples:
        >>> import torch
        >>> import posenc
        >>> from posenc.rotary.rerotate import rerotate_keys, rerotation_cos_sin
        >>> from posenc.rotary.schedules import frequencies
        >>> params = {"factor": 2.0, "max_position_embeddings": 8}
        >>> old, new = (frequencies("dynamic", 16, 10000.0, params, seq_len=n) for n in (8, 16))
        >>> cos, sin = rerotation_cos_sin(torch.arange(8), old, new)
        >>> cos.shape
        torch.Size([8, 16])
        >>> keys = torch.randn(1, 2, 8, 16)  # cached keys, rotated with old's tables
        >>> moved = posenc.apply_rotary(keys, cos, sin)  # or a kernel of one's own
        >>> torch.equal(moved, rerotate_keys(keys, torch.arange(8), old, new))
        True
    """
    _check_frequencies(old, new)
    checks.check_choice(layout, "layout", LAYOUTS)
    positions = checks.check_position_tensor(positions, "positions")
    check_size(positions, 2 * len(old.omega))  # before the values are read
    checks.check_position_tensor(positions, "positions", exact=True)
    c, s = cos_sin(positions, _difference(old, new), layout=layout, dtype=dtype)
    return c, s


def rerotate_keys(
    keys: torch.Tensor,
    positions: torch.Tensor,
    old: RopeFrequencies,
    new: RopeFrequencies,
    *,
    layout: Layout = "half",
    seq_dim: int = -2,
) -> torch.Tensor:
    """Keys cached with the tables of ``old``, rotated as the tables of ``new`` rotate them.

    Equal to rotating the unrotated keys with ``new``'s tables (attention scaling
    included) within float32 rounding, ``9 * 2**-24 * a_new`` times the norm of
    each channel pair, at any position below ``2**31`` (module docstring). The
    first ``2 * len(old.omega)`` channels rotate (``rotary_dim``); the rest
    (GPT-NeoX's partial rotary) are returned unchanged. bfloat16 and float16
    keys are rotated in float32 and rounded once.

    Args:
        keys: ``(batch, kv_heads, seq, head_dim)`` (``seq_dim=-2``, HF's cache
            layout) or ``(batch, seq, kv_heads, head_dim)`` (``seq_dim=-3``:
            flash-attn's, vLLM's blocks); a batch-less form drops the first dim.
        positions: ``(seq,)`` or ``(batch, seq)`` int (or float) positions of the
            keys (left-padded batches have their own).
        old: the frequencies the keys were rotated with
            (``RopeSpec.frequencies(seq_len)``, :func:`posenc.rotary.schedules.frequencies`).
        new: the frequencies they should carry.
        layout: ``"half"`` (GPT-NeoX, HF) or ``"interleaved"`` (GPT-J, Meta).
        seq_dim: ``-2`` or ``-3``, as above.

    Returns:
        The re-rotated keys, shaped and typed like ``keys`` (a new tensor).

    Raises:
        TypeError: ``keys`` not a float tensor, ``positions`` not an int or float
            tensor, ``old``/``new`` not :class:`RopeFrequencies`.
        ValueError: ``old`` and ``new`` of different sizes or with more pairs
            than ``keys`` has channels, shapes of ``positions`` that do not
            match ``keys``, unknown ``layout`` or ``seq_dim``, positions beyond
            ``2**31``.

    Examples:
        >>> import torch
        >>> from posenc.rotary.rerotate import rerotate_keys
        >>> from posenc.rotary.schedules import frequencies
        >>> params = {"factor": 2.0, "max_position_embeddings": 8}  # dynamic NTK past 8
        >>> old, new = (frequencies("dynamic", 16, 10000.0, params, seq_len=n) for n in (8, 16))
        >>> _ = torch.manual_seed(0)
        >>> keys = torch.randn(1, 2, 8, 16)  # (batch, kv_heads, seq, head_dim), rotated with old
        >>> moved = rerotate_keys(keys, torch.arange(8), old, new)
        >>> moved.shape
        torch.Size([1, 2, 8, 16])
        >>> torch.allclose(rerotate_keys(moved, torch.arange(8), new, old), keys, atol=1e-6)
        True
    """
    keys = checks.check_float_tensor(keys, "keys")
    _check_frequencies(old, new)
    checks.check_choice(layout, "layout", LAYOUTS)
    if isinstance(seq_dim, bool) or seq_dim not in (-2, -3):
        raise ValueError(
            f"seq_dim must be -2 (batch, kv_heads, seq, head_dim) or -3 "
            f"(batch, seq, kv_heads, head_dim); got {seq_dim!r}"
        )
    rotary_dim = 2 * len(old.omega)
    if keys.ndim < -seq_dim or keys.shape[-1] < rotary_dim:
        raise ValueError(
            f"keys must have at least {-seq_dim} dims (seq_dim={seq_dim}) and rotary_dim = "
            f"{rotary_dim} channels (2 per frequency); got shape {tuple(keys.shape)}"
        )
    positions = checks.check_position_tensor(positions, "positions")
    seq = keys.shape[seq_dim]
    batched = positions.ndim == 2
    ok = positions.ndim in (1, 2) and positions.shape[-1] == seq
    if batched:
        ok = ok and keys.ndim == 4 and positions.shape[0] in (1, keys.shape[0])
    if not ok:
        raise ValueError(
            f"positions must be (seq,) or (batch, seq) matching keys {tuple(keys.shape)} "
            f"(seq_dim={seq_dim}); got shape {tuple(positions.shape)}"
        )
    work = checks.work_dtype(keys.dtype)
    c, s = rerotation_cos_sin(positions.to(keys.device), old, new, layout=layout, dtype=work)
    if batched and seq_dim == -2:
        c, s = c.unsqueeze(1), s.unsqueeze(1)  # (batch, 1, seq, r): one table for all heads
    if seq_dim == -3:
        c, s = c.unsqueeze(-2), s.unsqueeze(-2)
    return apply_rotary(keys, c, s, layout=layout, rotary_dim=rotary_dim)
