"""Position ids of the encodings made for arithmetic: randomized, Abacus, coupled, index hints.

Digits carry their meaning by *significance* (units, tens, ...), not by their
index in the sequence: the third digit of the answer goes with the third digit
of each operand wherever the operands sit. These schemes give a model that
alignment directly, each by ids it computes from the layout of the numbers:

- :func:`randomized_positions`: Ruoss et al. 2023 ("Randomized Positional
  Encodings Boost Length Generalization of Transformers", ACL), section 3: the
  positions of ``length`` tokens are a sorted random subset of ``0 ..
  max_positions - 1``, so that positions beyond the trained lengths are seen in
  training. Any encoding that reads positions (a rotation, a table) reads these.
- :func:`abacus_positions`: McLeish et al. 2024 ("Transformers Can Do Arithmetic
  with the Right Embeddings", NeurIPS; code ``mcleish7/arithmetic``, ``abacus.py``),
  section 3.1: every digit's id is its index within its own number, from 1 at the
  first digit written (the units, as the numbers are written least significant
  digit first), plus an offset; tokens that are not digits get 0.
- :func:`coupled_positions`: Cho et al. 2024 ("Position Coupling: Improving
  Length Generalization of Arithmetic Transformers Using Task Structure",
  NeurIPS; code ``HanseulJo/position-coupling``), section 3: digits of the same
  significance in the operands and the answer share one id, the token written
  right after a number (``+``, ``=``) takes the id after its units digit.
- :func:`index_hints`: Zhou et al. 2024 ("Transformers Can Achieve Length
  Generalization But Not Robustly"), section 3: a hint token before each digit
  names its place, the same hint for digits of the same significance. Hints are
  tokens, not position ids: the task writes them (the base encoding still reads
  the positions).

How a task describes its layout: ``significance`` ``(..., seq)`` int64, for each
token a digit's power of ten (0 for the units), :data:`AFTER_NUMBER` (-1) for
the token right after a number (its operator, or ``=``), and :data:`OUTSIDE`
(any value below -1) for a token outside every number (BOS, EOS, padding).
Every scheme reads that alone, so a new task format is new ``significance``,
never a new scheme.

Training and evaluation differ in one thing, the offset: in training it is
random (:func:`random_offsets`, from a seeded ``torch.Generator``), so that the
ids of the longest test numbers are trained; at evaluation it is the scheme's
fixed start. Each function's docstring says which values its paper draws.
"""

from __future__ import annotations

from typing import Any

import torch

from posenc.core import checks

__all__ = [
    "AFTER_NUMBER",
    "OUTSIDE",
    "abacus_positions",
    "coupled_positions",
    "index_hints",
    "random_offsets",
    "randomized_positions",
]

#: ``significance`` of the token written right after a number (``+``, ``*``, ``=``).
AFTER_NUMBER = -1
#: ``significance`` of a token outside every number (any value below -1 reads the same).
OUTSIDE = -2


def _check_significance(significance: Any) -> torch.Tensor:
    if not isinstance(significance, torch.Tensor) or significance.is_floating_point():
        kind = type(significance).__name__
        raise TypeError(
            f"significance must be an integer torch.Tensor (..., seq); got {kind}"
            + (f" of {significance.dtype}" if isinstance(significance, torch.Tensor) else "")
        )
    if significance.dim() == 0:
        raise ValueError("significance must have a sequence axis: (..., seq); got a 0-d tensor")
    return significance.long()


def _check_offset(offset: Any, name: str, rows: torch.Size, minimum: int) -> torch.Tensor | int:
    """An int, or a tensor broadcasting against ``rows`` (the batch dims), each >= minimum."""
    if isinstance(offset, torch.Tensor):
        if offset.is_floating_point():
            raise TypeError(f"{name} must be an int or an integer tensor; got {offset.dtype}")
        if offset.numel() and int(offset.min()) < minimum:
            raise ValueError(f"{name} must be >= {minimum}; got {int(offset.min())}")
        try:
            fits = torch.broadcast_shapes(offset.shape, rows) == rows
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"{name} must be an int or one per row: shape {tuple(rows)} or broadcasting to "
                f"it; got {tuple(offset.shape)}"
            )
        return offset.long()
    return checks.check_int(offset, name, minimum=minimum)


def _per_row(offset: torch.Tensor | int, like: torch.Tensor) -> torch.Tensor | int:
    """``offset`` with a trailing axis, to broadcast over ``like``'s sequence axis."""
    if isinstance(offset, int):
        return offset
    return offset.to(like.device)[..., None]


def random_offsets(
    high: int, generator: torch.Generator, rows: int | None = None
) -> torch.Tensor | int:
    """Offsets drawn uniformly from ``0 .. high`` (inclusive), from ``generator`` alone.

    One int for the whole batch (``rows=None``: McLeish et al. draw one ``k`` per
    batch) or a ``(rows,)`` int64 tensor, one per example (Cho et al. draw one start
    per example).

    Raises:
        TypeError, ValueError: ``high`` not an int >= 0, ``rows`` not an int >= 1,
            ``generator`` not a ``torch.Generator``.

    Examples:
        >>> import torch
        >>> from posenc.arithmetic import random_offsets
        >>> g = torch.Generator().manual_seed(0)
        >>> random_offsets(99, g)  # one for the batch (Abacus)
        44
        >>> random_offsets(10, g, rows=3).tolist()  # one per example (position coupling)
        [7, 1, 3]
    """
    high = checks.check_int(high, "high", minimum=0)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator; got {type(generator).__name__}")
    if rows is None:
        return int(torch.randint(0, high + 1, (1,), generator=generator))
    rows = checks.check_int(rows, "rows", minimum=1)
    return torch.randint(0, high + 1, (rows,), generator=generator, device=generator.device)


def randomized_positions(
    length: int, max_positions: int, generator: torch.Generator
) -> torch.Tensor:
    """Ruoss et al. (2023)'s positions: a sorted random subset of ``0 .. max_positions - 1``.

    Section 3 of the paper: "we sample a random set of positions from [0, L]
    and sort them", ``L`` well beyond the longest test sequence, for every
    sequence in training and in evaluation alike; the encoding (a rotation, a
    table) then reads these positions instead of ``0 .. length - 1``. Example:
    ``length=4, max_positions=16`` may give ``[1, 5, 6, 13]``.

    Args:
        length: positions to draw, ``1 <= length <= max_positions``.
        max_positions: the range drawn from.
        generator: the only randomness (its device is the result's).

    Returns:
        ``(length,)`` int64, strictly rising.

    Raises:
        ValueError: ``length`` over ``max_positions`` (there are not that many
            positions to draw), either below 1.
        TypeError: a non-int size or a ``generator`` that is not a ``torch.Generator``.

    Examples:
        >>> import torch
        >>> import posenc
        >>> from posenc.arithmetic import randomized_positions
        >>> positions = randomized_positions(4, 16, torch.Generator().manual_seed(0))
        >>> positions.tolist()
        [6, 9, 10, 12]
        >>> q, k = torch.randn(2, 1, 2, 4, 8)  # (batch, heads, seq, head_dim) each
        >>> q, k = posenc.Rotary(8)(q, k, positions=positions)  # rotated at those positions
    """
    length = checks.check_int(length, "length", minimum=1)
    max_positions = checks.check_int(max_positions, "max_positions", minimum=1)
    if length > max_positions:
        raise ValueError(
            f"length ({length}) must be <= max_positions ({max_positions}): randomized "
            "positions are distinct draws from 0 .. max_positions - 1"
        )
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator; got {type(generator).__name__}")
    checks.check_elements(
        max_positions, f"randomized_positions' draw of max_positions={max_positions}"
    )
    draw = torch.randperm(max_positions, generator=generator, device=generator.device)
    return draw[:length].sort().values


def abacus_positions(
    significance: torch.Tensor, offset: int | torch.Tensor = 0, *, max_positions: int | None = None
) -> torch.Tensor:
    """McLeish et al. (2024)'s Abacus ids: a digit's index in its number, from 1, plus ``offset``.

    Every run of consecutive digits is a number; its first digit written gets
    ``1 + offset``, the next ``2 + offset``, and so on; every other token gets 0
    (the embedding's row 0). With the numbers written least significant digit
    first, as the paper writes operands and answer, a digit's id is its
    significance plus one: the paper's example (figure 2) ``3 2 1 + 6 5 4 = 9 7 5``
    (123 + 456 = 579, reversed) has ids ``1 2 3 0 1 2 3 0 1 2 3``.

    Training draws ``offset`` uniformly from ``0 .. k`` once per batch
    (``abacus.py``: ``k = random.randint(0, max_k)``, ``max_k = 99`` for 20-digit
    training; :func:`random_offsets`); evaluation uses 0.

    Args:
        significance: ``(..., seq)`` int: the task's layout (module docstring);
            only which tokens are digits (``>= 0``) is read.
        offset: an int, or one per row (``significance.shape[:-1]``), ``>= 0``.
        max_positions: the rows of the table the ids index: an id at or over it
            is a ValueError (None: no check).

    Returns:
        ``significance``'s shape, int64.

    Raises:
        TypeError: ``significance`` not an integer tensor; ``offset`` not an int
            or an integer tensor.
        ValueError: a negative ``offset``; an id beyond ``max_positions - 1`` (a
            number longer than the table covers).

    Examples:
        >>> import torch
        >>> from posenc.arithmetic import abacus_positions
        >>> significance = torch.tensor([0, 1, 2, -1, 0, 1, 2, -1, 0, 1, 2])  # 321+654=975
        >>> abacus_positions(significance).tolist()
        [1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]
        >>> abacus_positions(significance, offset=10).tolist()  # training: a random offset
        [11, 12, 13, 0, 11, 12, 13, 0, 11, 12, 13]
    """
    significance = _check_significance(significance)
    offset = _check_offset(offset, "offset", significance.shape[:-1], 0)
    digit = significance >= 0
    # index within each run of digits: position minus the position where the run began
    index = torch.arange(significance.shape[-1], device=significance.device).expand_as(digit)
    starts = digit & ~torch.nn.functional.pad(digit[..., :-1], (1, 0), value=False)
    began = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values
    ids = torch.where(digit, index - began + 1 + _per_row(offset, index), 0)
    return _within(ids, max_positions, "abacus_positions")


def coupled_positions(
    significance: torch.Tensor, start: int | torch.Tensor = 1, *, max_positions: int | None = None
) -> torch.Tensor:
    """Cho et al. (2024)'s coupled ids: digits of the same significance share one id.

    With ``width`` the row's columns (its largest significance plus one: the
    answer's digits), a digit of significance ``j`` gets ``start + width - 1 -
    j``; the token right after a number gets ``start + width`` (the column after
    the units), every other token 0. So the highest column is ``start`` and the
    units ``start + width - 1``, in the operands and the answer alike, whichever
    way each is written. The paper's example (figure 1): 653 + 49 = 702, the
    operands zero-padded to 3 digits and the answer to 4 and reversed, ``6 5 3
    + 0 4 9 = 2 0 7 0``, has ids ``2 3 4 5 2 3 4 5 4 3 2 1`` at ``start = 1``.
    These are the reference's ids for addition and N x M multiplication
    (``end = start + width``; every id ``end - 1 - j``); for its multi-operand
    addition they are the reference's shifted by a constant (its answer's extra
    overflow digits push its columns below ``start``).

    Training draws ``start`` per example, uniformly from ``1 .. max_positions -
    width - 1`` (``torch.randint(1, max_position - max_len)`` in the reference;
    :func:`random_offsets` plus 1); evaluation uses 1.

    Args:
        significance: ``(..., seq)`` int, the task's layout (module docstring).
        start: the id of the highest column: an int or one per row, ``>= 1``
            (0 is the id of the tokens outside the numbers).
        max_positions: the rows of the table the ids index: an id at or over it
            is a ValueError (None: no check).

    Returns:
        ``significance``'s shape, int64.

    Raises:
        TypeError: ``significance`` not an integer tensor; ``start`` not an int
            or an integer tensor.
        ValueError: ``start`` below 1; an id beyond ``max_positions - 1``.

    Examples:
        >>> import torch
        >>> from posenc.arithmetic import coupled_positions
        >>> significance = torch.tensor([2, 1, 0, -1, 2, 1, 0, -1, 0, 1, 2, 3])  # 653+049=2070
        >>> coupled_positions(significance).tolist()
        [2, 3, 4, 5, 2, 3, 4, 5, 4, 3, 2, 1]
    """
    significance = _check_significance(significance)
    start = _check_offset(start, "start", significance.shape[:-1], 1)
    width = significance.amax(dim=-1, keepdim=True).clamp(min=0) + 1
    placed = significance >= AFTER_NUMBER
    ids = torch.where(placed, _per_row(start, significance) + width - 1 - significance, 0)
    return _within(ids, max_positions, "coupled_positions")


def index_hints(
    significance: torch.Tensor, start: int | torch.Tensor = 0, *, hints: int | None = None
) -> torch.Tensor:
    """Zhou et al. (2024)'s index hints: the hint (a number) written before each digit.

    A digit of significance ``j`` gets hint ``start + j``, the same in every
    number, so hints pair the digits to add; tokens that are not digits get -1
    (no hint). The paper writes hints as letters before digits, ``42 + 39 = 81``
    as ``a4b2 + a3b9 = a8b1``; here, with the numbers zero-padded to 3 digits and
    written least significant digit first, ``2 4 0 + 9 3 0 = 1 8 0`` has hints
    ``0 1 2 -1 0 1 2 -1 0 1 2`` at ``start = 0``: hint ``h`` is the task's
    ``h``-th hint token.

    Training draws ``start`` per example, uniformly from ``0 .. hints - width``
    (as the position-coupling reference draws the first hint of its index-hint
    baseline), so that every hint up to the last is trained; evaluation uses 0.

    Args:
        significance: ``(..., seq)`` int, the task's layout (module docstring).
        start: the hint of the units: an int or one per row, ``>= 0``.
        hints: how many hint tokens the task has: a hint at or over it is a
            ValueError (None: no check).

    Returns:
        ``significance``'s shape, int64; -1 where a token gets no hint.

    Raises:
        TypeError: ``significance`` not an integer tensor; ``start`` not an int
            or an integer tensor.
        ValueError: a negative ``start``; a hint beyond ``hints - 1``.

    Examples:
        >>> import torch
        >>> from posenc.arithmetic import index_hints
        >>> significance = torch.tensor([0, 1, 2, -1, 0, 1, 2, -1, 0, 1, 2])  # 240+930=180
        >>> index_hints(significance).tolist()
        [0, 1, 2, -1, 0, 1, 2, -1, 0, 1, 2]
    """
    significance = _check_significance(significance)
    start = _check_offset(start, "start", significance.shape[:-1], 0)
    out = torch.where(significance >= 0, significance + _per_row(start, significance), -1)
    return _within(out, hints, "index_hints", what="hint tokens")


def _within(
    ids: torch.Tensor, limit: int | None, name: str, what: str = "positions"
) -> torch.Tensor:
    if limit is None:
        return ids
    limit = checks.check_int(limit, "max_positions" if what == "positions" else "hints", minimum=1)
    if ids.numel() and int(ids.max()) >= limit:
        raise ValueError(
            f"{name}: an id of {int(ids.max())} needs more than the {limit} {what} the scheme "
            f"covers (ids 0 .. {limit - 1}); a number this long, at this offset, is beyond it"
        )
    return ids
