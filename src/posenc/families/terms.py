"""Score terms: the one door through which a position signal changes attention's scores.

Softmax attention scores a query ``i`` against a key ``j`` as ``q_i . k_j * scale``;
every position signal that is not a rotation of q and k changes that score. A
*score term* is anything that implements :class:`ScoreTerm`: one method,
:meth:`~ScoreTerm.score_form`, that is given the call's sizes
(:class:`TermContext`) and says, in a :class:`TermForm`, everything an attention
engine needs from it:

- ``tensors``: the tensors autograd tracks through the engine (a bias table, FoX's
  cumulative gates, CoPE's embeddings ...);
- ``block``: its form on a block of scores, ``block(tensors, q_pos, k_pos)``, the
  value it adds to the scores of queries ``q_pos`` ``(n,)`` and keys ``k_pos``
  ``(m,)`` (both as key positions, queries bottom-right), broadcastable to
  ``(batch, heads, n, m)``;
- ``flex``: its FlexAttention form, ``flex(tensors)`` returning ``add(b, h, q_idx,
  kv_idx)``, the value added to a scaled score (FlexAttention's ``score_mod``,
  less the score), or None where it has none;
- ``operand``: what the compiled loop reads of it, ``"table"`` (``tensors[0]`` a
  ``(heads, q_len + k_len - 1)`` table over ``key - query``), ``"pieces"`` (a
  :class:`posenc.bias.ScaledForm`'s table, scale, slopes and intercepts, ``knots``
  beside them), ``"gate"`` (``tensors[0]`` a ``(batch, heads, k_len)`` tensor
  ``c``, the score gaining ``c[query] - c[key]``), or, for a term that also reads
  the scores, ``"counted"`` (gates on the scores counted into positions, CoPE's:
  ``tensors[0]`` the ``(head_dim, npos)`` embeddings, ``scalars[0]`` the factor of
  the position logits) or ``"mlp"`` (the scores of all heads refined by an MLP,
  DAPE's: ``tensors`` the base's ``(heads, q_len + k_len - 1)`` table over ``key -
  query`` and the MLP's ``w1, b1, w2, b2``, ``scalars[0]`` its LeakyReLU's
  negative slope); None where the loop cannot read it;
- ``read``: for a term that reads the scores themselves (CoPE, DAPE),
  ``read(tensors, z, q, q_pos, k_pos, unseen)`` returns its addition from the
  scaled scores ``z`` of a block; None for every other term; ``row_values``, the
  values it keeps per query row beyond the scores (what sizes the blocks);
- ``scalars``: the numbers an operand needs beside its tensors (see ``operand``).

Every bias module (:class:`posenc.bias.AttentionBias`), the Forgetting
Transformer's gates (:class:`posenc.bias.ForgetGateTerm`), :class:`posenc.CoPE`
and :class:`posenc.DAPE` implement it; :func:`posenc.attention` takes any list of
them as ``terms=`` and adds their values in order. A new method plugs in here, and
gets the compiled loop, the blockwise path, FlexAttention and training without a
line changed in the engines (which name no family: they read forms).

Shapes::

    q_pos    (n,)        key positions of a block's queries
    k_pos    (m,)        key positions of its keys
    block    (heads, n, m) or (batch, heads, n, m)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, runtime_checkable

import torch

__all__ = [
    "ScoreTerm",
    "TermContext",
    "TermForm",
]

#: The kinds of operand the compiled loop reads (see the module docstring).
OPERANDS: tuple[str, ...] = ("table", "pieces", "gate", "counted", "mlp")

Operand = Literal["table", "pieces", "gate", "counted", "mlp"]
BlockFn = Callable[[Sequence[torch.Tensor], torch.Tensor, torch.Tensor], torch.Tensor]
AddMod = Callable[[Any, Any, Any, Any], Any]
FlexFn = Callable[[Sequence[torch.Tensor]], AddMod]
ReadFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class TermContext:
    """What a term may know of one attention call when it states its form.

    Attributes:
        batch: the call's batch size.
        heads: q's heads.
        head_dim: the channels of a head.
        q_len: the queries' length.
        k_len: the keys' length.
        scale: the score scale.
        causal: whether each query sees keys up to its own position only.
        dtype: the scores' dtype; a term's values are cast to it.
        device: where the scores are.
        key_mask: ``(batch, k_len)`` bool, True for keys to attend, or None.
        docs: ``(1 or batch, k_len)`` each key position's document (numbered
            along a row from 0), or None without packing.
        positions: ``(1 or batch, k_len)`` each key position's position within
            its document, or None (every position is its key position).
        pieces: whether a term may give a ``"pieces"`` form (False where its
            value is read per block anyway, as for a term beside one that reads
            the scores).

    Examples:
        >>> import torch
        >>> import posenc
        >>> from posenc.terms import TermForm
        >>> class Probe:  # a term that adds nothing and shows what it is told
        ...     def score_form(self, ctx):
        ...         print(ctx.heads, ctx.q_len, ctx.k_len, ctx.offset, ctx.causal)
        ...         return TermForm()
        >>> q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
        >>> _ = posenc.attention(q, k, v, causal=True, terms=[Probe()])  # one decode step
        2 1 5 4 True
    """

    batch: int
    heads: int
    head_dim: int
    q_len: int
    k_len: int
    scale: float
    causal: bool
    dtype: torch.dtype
    device: torch.device
    key_mask: torch.Tensor | None = None
    docs: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    pieces: bool = True

    @property
    def offset(self) -> int:
        """The key position of query 0: queries are the last ``q_len`` keys."""
        return self.k_len - self.q_len


@dataclass(frozen=True)
class TermForm:
    """A term's form at one call: its tensors and how each engine reads them.

    See the module docstring for each field; a form with neither ``block`` nor
    ``read`` adds nothing (NoPE).

    Examples:
        >>> import torch
        >>> import posenc
        >>> from posenc.terms import TermContext
        >>> ctx = TermContext(batch=1, heads=2, head_dim=8, q_len=1, k_len=4, scale=8**-0.5,
        ...                   causal=True, dtype=torch.float32, device=torch.device("cpu"))
        >>> form = posenc.ALiBi(2).score_form(ctx)  # a TermForm
        >>> form.operand, form.tensors[0].shape  # a table over key - query = -3 .. 0
        ('table', torch.Size([2, 4]))
        >>> bias = form.block(form.tensors, torch.tensor([3]), torch.arange(4))  # (heads, 1, 4)
        >>> bias[:, 0]  # query 3 (the last key) against keys 0 .. 3, per head
        tensor([[-0.1875, -0.1250, -0.0625,  0.0000],
                [-0.0117, -0.0078, -0.0039,  0.0000]])
    """

    tensors: tuple[torch.Tensor, ...] = ()
    block: BlockFn | None = None
    flex: FlexFn | None = None
    operand: Operand | None = None
    knots: torch.Tensor | None = None
    read: ReadFn | None = None
    row_values: int = 0
    scalars: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.operand is not None and self.operand not in OPERANDS:
            raise ValueError(f"operand must be one of {OPERANDS} or None; got {self.operand!r}")
        if self.operand == "pieces" and self.knots is None:
            raise ValueError("a 'pieces' operand needs its knots")

    def without_tensors(self) -> TermForm:
        """The form with its tensors left out: what an engine keeps beside them."""
        return replace(self, tensors=())


@runtime_checkable
class ScoreTerm(Protocol):
    """Anything that changes attention's scores: it states its :class:`TermForm`.

    Examples:
        >>> import torch
        >>> import posenc
        >>> from posenc.terms import ScoreTerm, TermForm
        >>> class DistanceBias(torch.nn.Module):  # a learned bias per head and distance
        ...     def __init__(self, heads, max_distance=16):
        ...         super().__init__()
        ...         self.table = torch.nn.Parameter(torch.zeros(heads, max_distance + 1))
        ...     def score_form(self, ctx):
        ...         def block(tensors, q_pos, k_pos):  # (heads, n, m)
        ...             far = (q_pos[:, None] - k_pos[None, :]).clamp(0, tensors[0].shape[1] - 1)
        ...             return tensors[0][:, far]
        ...         return TermForm((self.table.to(ctx.dtype),), block)
        >>> term = DistanceBias(heads=2)
        >>> isinstance(term, ScoreTerm)
        True
        >>> q, k, v = torch.randn(3, 1, 2, 5, 8)  # (batch, heads, seq, head_dim) each
        >>> out = posenc.attention(q, k, v, causal=True, terms=[term])
        >>> out.shape
        torch.Size([1, 2, 5, 8])
        >>> out.sum().backward()  # the table learns
        >>> term.table.grad.shape
        torch.Size([2, 17])
    """

    def score_form(self, ctx: TermContext) -> TermForm:
        """The term's form at a call of these sizes.

        Raises:
            ValueError: a call the term cannot take part in (another head count,
                a non-causal call for a causal-only term ...), naming what is needed.
        """
        ...
