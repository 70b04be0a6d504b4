"""A bias as the attention engines read it: a table over ``key - query``, or linear pieces.

:meth:`posenc.bias.AttentionBias.score_form` states every bias module's
:class:`posenc.families.terms.TermForm` with these:

- :func:`table_form`: a bias of ``key - query`` (ALiBi, T5, KERPLE, Sandwich, FIRE
  below its threshold), evaluated once per call over the ``q_len + k_len - 1``
  relative positions ``-(k_len - 1) .. q_len - 1`` into a ``(heads, n)`` table
  that every block, the compiled loop and FlexAttention index;
- :func:`pieces_form`: FIRE past its threshold, its MLP as linear pieces of ``x =
  table[key - query] * scale[query]`` (:class:`posenc.bias.ScaledForm`).

:func:`table_block` and :func:`pieces_block` are their block functions, which ring
attention also calls on the slices of a table that a pair of chunks sees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from posenc.families.terms import AddMod, BlockFn, TermContext, TermForm


@dataclass(frozen=True)
class ScaledForm:
    """A bias of queries ``q_pos`` and relative positions ``rel`` in linear pieces.

    ``bias_h(i, r) = slopes[h, s] * x + intercepts[h, s]`` with ``x = table[r] *
    scale[i]`` and ``s`` the number of ``knots`` below ``x`` (``torch.bucketize``):
    piecewise linear in ``x``, continuous at the knots. Every tensor but the knots
    carries the module's gradient.

    Attributes:
        table: ``(n_rel,)``, over the relative positions ``rel`` it was made for.
        scale: ``(n_q,)``, over the query positions ``q_pos``.
        knots: ``(n_knots,)`` ascending, no gradient.
        slopes: ``(heads, n_knots + 1)``, each piece's slope.
        intercepts: ``(heads, n_knots + 1)``, each piece's intercept.

    Examples:
        >>> import torch
        >>> from posenc.bias import FIRE
        >>> _ = torch.manual_seed(0)
        >>> fire, pos = FIRE(2, init_L=4.0), torch.arange(8)
        >>> form = fire.scaled_form(pos, torch.arange(-7, 8))  # every key - query of 8 tokens
        >>> x = form.table[pos[None, :] - pos[:, None] + 7] * form.scale[:, None]
        >>> piece = torch.bucketize(x, form.knots)
        >>> bias = form.slopes[:, piece] * x + form.intercepts[:, piece]  # (heads, 8, 8)
        >>> torch.allclose(bias, fire(pos[:, None], pos[None, :]), atol=1e-6)
        True
    """

    table: torch.Tensor
    scale: torch.Tensor
    knots: torch.Tensor
    slopes: torch.Tensor
    intercepts: torch.Tensor


def table_block(base: int) -> BlockFn:
    """The block function of a table over ``key - query``: entry ``base`` is distance 0.

    Queries and keys are given by key position (query ``i`` at ``i + offset``);
    ``base = q_len - 1 + offset``, ``k_len - 1`` bottom-right aligned.
    """

    def from_table(
        params: Sequence[torch.Tensor], q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> torch.Tensor:
        return params[0][:, k_pos[None, :] - q_pos[:, None] + base]

    return from_table


def pieces_block(base: int, offset: int, knots: torch.Tensor) -> BlockFn:
    """The block function of a scaled form's table, scale, slopes and intercepts.

    The table as :func:`table_block`'s; the scale per query (query ``i`` at key
    position ``i + offset``).
    """

    def from_pieces(
        params: Sequence[torch.Tensor], q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> torch.Tensor:
        table, row_scale, slope, intercept = params
        x = table[k_pos[None, :] - q_pos[:, None] + base] * row_scale[q_pos - offset, None]
        piece = torch.bucketize(x, knots)
        return slope[:, piece] * x + intercept[:, piece]

    return from_pieces


def table_form(table: torch.Tensor, ctx: TermContext, name: str) -> TermForm:
    """The form of a ``(heads, q_len + k_len - 1)`` table over ``key - query``.

    Raises:
        ValueError: a table of another shape (``name`` is the module that made it).
    """
    if tuple(table.shape) != (ctx.heads, ctx.q_len + ctx.k_len - 1):
        raise ValueError(
            f"{name}.relative_bias gave shape {tuple(table.shape)}; expected "
            f"({ctx.heads}, {ctx.q_len + ctx.k_len - 1})"
        )
    # FlexAttention guards on captured Python numbers (a recompile at each new value);
    # a 0-d tensor is an input it does not guard on
    base = torch.full((), ctx.q_len - 1, device=ctx.device)

    def flex(tensors: Sequence[torch.Tensor]) -> AddMod:
        # contiguous: one layout for every bias (T5's table comes transposed), one graph
        t = tensors[0].contiguous()

        def add(bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
            return t[hi, ki - qi + base]

        return add

    return TermForm((table,), table_block(ctx.k_len - 1), flex, "table")


def pieces_form(form: ScaledForm, ctx: TermContext, factor: float) -> TermForm:
    """The form of a scaled form's table, scale, slopes and intercepts (times ``factor``).

    Raises:
        ValueError: a scaled form whose tensors do not have the call's shapes.
    """
    heads, q_len, k_len = ctx.heads, ctx.q_len, ctx.k_len
    pieces = form.knots.numel() + 1
    shapes = {
        "table": (form.table, (q_len + k_len - 1,)),
        "scale": (form.scale, (q_len,)),
        "slopes": (form.slopes, (heads, pieces)),
        "intercepts": (form.intercepts, (heads, pieces)),
    }
    for name, (t, want) in shapes.items():
        if tuple(t.shape) != want:
            raise ValueError(
                f"the scaled form's {name} has shape {tuple(t.shape)}; expected {want}"
            )
    dtype = ctx.dtype
    slopes, intercepts = form.slopes.to(dtype), form.intercepts.to(dtype)
    if factor != 1.0:
        slopes, intercepts = slopes * factor, intercepts * factor
    knots = form.knots.detach().to(dtype)
    tensors = (form.table.to(dtype), form.scale.to(dtype), slopes, intercepts)
    base = torch.full((), q_len - 1, device=ctx.device)

    def flex(tensors: Sequence[torch.Tensor]) -> AddMod:
        rel_table, row_scale, slope, intercept = tensors
        # the knots padded with +inf to a power of two (at least 64, so that the
        # shapes, and the compiled graph, stay as the number of knots changes): a
        # branchless binary search counts the knots below x, as torch.bucketize does
        n = knots.numel()
        size = 1 << max(6, n.bit_length())
        padded = torch.full((size,), math.inf, dtype=rel_table.dtype, device=ctx.device)
        padded[:n] = knots
        steps = [size >> i for i in range(1, size.bit_length())]
        pad = (0, size - slope.shape[1])
        slope = torch.nn.functional.pad(slope, pad)
        intercept = torch.nn.functional.pad(intercept, pad)

        def add(bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
            x = rel_table[ki - qi + base] * row_scale[qi]
            piece = (padded[steps[0] - 1] < x) * steps[0]
            for step in steps[1:]:
                piece = piece + (padded[piece + step - 1] < x) * step
            return slope[hi, piece] * x + intercept[hi, piece]

        return add

    block = pieces_block(k_len - 1, ctx.offset, knots)
    return TermForm(tensors, block, flex, "pieces", knots)
