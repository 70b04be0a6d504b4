"""The image-grid lab task: where is the second marked cell, relative to the first?

An example is an ``height x width`` grid of cells read row by row (the patch tokens of
a ViT, flattened as ``x.flatten(2).transpose(1, 2)`` flattens a patch embedding's
output): every cell holds a random distractor token (``0 .. DISTRACTORS - 1``) but two,
:data:`FIRST` and :data:`SECOND`, which share a row or a column. The class is where the
second lies from the first: one of :data:`DIRECTIONS` (``right``: the same row, a larger
column; ``below``: the same column, a larger row). No single cell, and no bag of cells,
gives the answer: a model must read the two cells' relative 2-D position, and a model
that reads no position at all is at chance (1 in 4).

Examples are drawn on the fly from a ``torch.Generator``, so one seed gives one
sequence of batches at every grid size. The pair is drawn uniformly: a row or a
column (even odds), one line of it, then two distinct cells of the line in order, so
each direction has probability 1/4 and every distance up to the grid's side occurs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posenc.core import checks

if TYPE_CHECKING:  # torch is imported on first use: the command line lists the study without it
    import torch

#: The classes, in label order: where the second marked cell lies from the first.
DIRECTIONS = ("right", "left", "below", "above")
#: Distractor tokens ``0 .. DISTRACTORS - 1``.
DISTRACTORS = 8
#: The two marked cells' tokens.
FIRST, SECOND = DISTRACTORS, DISTRACTORS + 1
#: Tokens of the task.
VOCAB = DISTRACTORS + 2


def make_grids(
    height: int, width: int, batch: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` grids of ``height x width`` cells and their classes.

    Args:
        height: rows of the grid (at least 2: a column pair needs two rows).
        width: columns (at least 2).
        batch: examples.
        generator: the draws' source; the same state gives the same batch.

    Returns:
        ``(tokens, labels)``: ``tokens`` ``(batch, height * width)`` int64, cell ``(r, c)``
        at ``r * width + c``; ``labels`` ``(batch,)`` int64 indices into
        :data:`DIRECTIONS`.

    Raises:
        ValueError: a size below 2 (``batch``: below 1).

    Examples:
        >>> import torch
        >>> from posenc.faces.lab.grid_tasks import DIRECTIONS, directions, make_grids
        >>> tokens, labels = make_grids(4, 4, 3, torch.Generator().manual_seed(0))
        >>> tokens.shape, labels.shape
        (torch.Size([3, 16]), torch.Size([3]))
        >>> bool((directions(tokens, 4, 4) == labels).all())
        True
    """
    import torch

    height = checks.check_int(height, "height", minimum=2)
    width = checks.check_int(width, "width", minimum=2)
    batch = checks.check_int(batch, "batch", minimum=1)
    tokens = torch.randint(0, DISTRACTORS, (batch, height * width), generator=generator)
    vertical = torch.rand(batch, generator=generator) < 0.5
    side = torch.where(vertical, height, width)  # cells along the pair's line
    lines = torch.where(vertical, width, height)  # lines of that orientation
    line = (torch.rand(batch, generator=generator) * lines).long()
    # two distinct cells of the line, uniformly: a, then b among the other side - 1
    a = (torch.rand(batch, generator=generator) * side).long()
    b = (torch.rand(batch, generator=generator) * (side - 1)).long()
    b = b + (b >= a).long()
    row_a = torch.where(vertical, a, line)
    col_a = torch.where(vertical, line, a)
    row_b = torch.where(vertical, b, line)
    col_b = torch.where(vertical, line, b)
    rows = torch.arange(batch)
    tokens[rows, row_a * width + col_a] = FIRST
    tokens[rows, row_b * width + col_b] = SECOND
    # right 0, left 1 (a row pair); below 2, above 3 (a column pair)
    labels = 2 * vertical.long() + (b < a).long()
    return tokens, labels


def directions(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The class of each grid, read from where its two marked cells are.

    The task's rule, written apart from :func:`make_grids`'s draws (the tests check
    one against the other, and both against hand-made grids).

    Args:
        tokens: ``(batch, height * width)`` grids, one :data:`FIRST` and one
            :data:`SECOND` each, in one row or one column.
        height: rows.
        width: columns.

    Returns:
        ``(batch,)`` int64 indices into :data:`DIRECTIONS`.

    Raises:
        ValueError: ``tokens`` of another shape, a grid without exactly one of each
            marker, or markers in neither one row nor one column.

    Examples:
        >>> import torch
        >>> from posenc.faces.lab.grid_tasks import DIRECTIONS, FIRST, SECOND, directions
        >>> grid = torch.zeros(3, 3, dtype=torch.long)
        >>> grid[2, 0], grid[0, 0] = FIRST, SECOND  # the second two rows above the first
        >>> DIRECTIONS[int(directions(grid.flatten()[None], 3, 3)[0])]
        'above'
    """
    import torch

    if tokens.ndim != 2 or tokens.shape[1] != height * width:
        raise ValueError(
            f"tokens must be (batch, {height} * {width}); got shape {tuple(tokens.shape)}"
        )
    out = []
    for row in tokens:
        firsts, seconds = (row == FIRST).nonzero(), (row == SECOND).nonzero()
        if len(firsts) != 1 or len(seconds) != 1:
            raise ValueError("tokens: every grid needs exactly one FIRST and one SECOND cell")
        (ra, ca), (rb, cb) = divmod(int(firsts[0]), width), divmod(int(seconds[0]), width)
        if ra == rb:
            out.append(0 if cb > ca else 1)
        elif ca == cb:
            out.append(2 if rb > ra else 3)
        else:
            raise ValueError("tokens: the marked cells must share a row or a column")
    return torch.tensor(out, dtype=torch.long)


def distances(tokens: torch.Tensor, width: int) -> torch.Tensor:
    """How many cells apart the two marked cells of each grid are, along their row or column.

    Args:
        tokens: ``(batch, height * width)`` grids of :func:`make_grids`.
        width: columns.

    Returns:
        ``(batch,)`` int64, from 1 to the grid's side minus 1 (a grid of side ``n`` trains
        distances up to ``n - 1`` only).
    """
    first = (tokens == FIRST).long().argmax(1)
    second = (tokens == SECOND).long().argmax(1)
    same_row = first // width == second // width
    gap = (first - second).abs()
    return gap.where(same_row, gap // width)
