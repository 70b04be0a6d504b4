"""cos and sin tables of rotary embeddings, exact, in HF's and Meta's orders."""

from __future__ import annotations

from typing import Any, Literal

from posenc.core import checks
from posenc.core.angles import sincos_torch
from posenc.families.rotary.schedules import RopeFrequencies

#: The half (GPT-NeoX, HF) or interleaved (GPT-J, Meta) order of rotated pairs.
Layout = Literal["half", "interleaved"]
#: Every layout's name.
LAYOUTS = ("half", "interleaved")


def check_size(
    positions: Any, rotary_dim: int, name: str = "positions", what: str = "the (cos, sin) tables"
) -> None:
    """Refuse ``(cos, sin)`` tables (or ``what``) of ``positions`` of more than
    :data:`posenc.core.checks.MAX_ELEMENTS` values each, from the shape alone.

    Call it before anything reads the positions (their range check included). Not
    while ``torch.compile`` traces, where the sizes may be symbolic.

    Raises:
        ValueError: ``positions.numel() * rotary_dim`` above the limit, naming ``name``.
    """
    import torch

    if torch.compiler.is_compiling():
        return
    count = positions.numel() * rotary_dim
    if count > checks.MAX_ELEMENTS:  # the message only when it is needed
        checks.check_elements(
            count, f"{what} of {name} (shape {tuple(positions.shape)}) x rotary_dim={rotary_dim}"
        )


def cos_sin(
    positions: Any,
    freqs: RopeFrequencies,
    *,
    layout: Layout = "half",
    dtype: Any = None,
    arithmetic: str = "auto",
) -> tuple[Any, Any]:
    """``cos`` and ``sin`` of ``positions * omega``, times the attention scaling.

    Args:
        positions: int or float tensor of any shape (``(seq,)``, ``(batch, seq)``
            ...), on any device.
        freqs: the schedule's frequencies.
        layout: ``"half"`` repeats the angles as ``cat(theta, theta)`` (GPT-NeoX,
            HF: pairs ``(i, i + rotary_dim / 2)``); ``"interleaved"`` as
            ``theta0, theta0, theta1, theta1 ...`` (GPT-J, Meta, torchtune).
        dtype: result dtype (torch float dtype); float32 by default.
        arithmetic: as in :func:`posenc.core.angles.sincos_torch`.

    Returns:
        ``(cos, sin)`` of shape ``positions.shape + (rotary_dim,)``, each value
        exact before one rounding to ``dtype``.

    Raises:
        ValueError: an unknown ``layout``; tables of more than
            :data:`posenc.core.checks.MAX_ELEMENTS` values (``positions.numel() *
            rotary_dim``, refused before any work).
    """
    import torch

    checks.check_choice(layout, "layout", LAYOUTS)
    check_size(positions, 2 * len(freqs.omega))
    s, c = sincos_torch(positions, freqs.turns, arithmetic)
    if layout == "half":
        c, s = torch.cat([c, c], dim=-1), torch.cat([s, s], dim=-1)
    else:
        c, s = c.repeat_interleave(2, dim=-1), s.repeat_interleave(2, dim=-1)
    if freqs.attention_scaling != 1.0:
        c, s = c * freqs.attention_scaling, s * freqs.attention_scaling
    out = torch.float32 if dtype is None else dtype
    return c.to(out), s.to(out)
