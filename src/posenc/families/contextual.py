"""Position signals that read the attention scores: CoPE and DAPE.

Both need ``q . k`` itself, not only positions, so they are not an
:class:`posenc.bias.AttentionBias`: they are score terms
(:class:`posenc.families.terms.ScoreTerm`) whose form *reads* the scores.
:func:`posenc.attention` takes a :class:`CoPE` as ``cope=``, a :class:`DAPE` as
``bias=`` (either in ``terms=``). Their forms name an operand kind (``"counted"``,
``"mlp"``) whose compiled loop runs float32 CPU calls it can take, forward and
backward; every other call goes block by block on the checkpointed path, which
``read`` serves. The modules here hold the parameters and the formulas of one
block of scores.

Shapes::

    q       (batch, heads, n, head_dim)     a block of n queries
    scores  (batch, heads, n, m)            z = q . k * scale against m keys

This module imports torch; ``import posenc`` does not import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn
from torch.nn import functional as F

from posenc.core import checks
from posenc.core.buffers import DerivedBuffers
from posenc.families.bias.modules import AttentionBias
from posenc.families.terms import TermContext, TermForm


class CoPE(DerivedBuffers):
    """CoPE (Golovneva et al. 2024): positions counted by gates on the keys, per query.

    The paper's listing (facebookresearch/RAM,
    ``projects/cope/src/cope/context_position.py``): a gate
    ``g_ik = sigmoid(q_i . k_k * scale)`` per causal key ``k <= i`` (the query's
    own key included; 0 for masked keys), the position of key ``j`` seen from
    query ``i`` is ``p_ij = sum_{k=j..i} g_ik`` (a reverse cumulative sum along
    the keys) clamped to ``npos_max - 1``, and the score gains
    ``(1 - w) q_i . e[floor p_ij] + w q_i . e[ceil p_ij]`` with ``w = p_ij -
    floor p_ij``: the position embeddings ``e = pos_emb`` interpolated at a
    fractional position (the indices carry no gradient, ``w`` does). ``pos_emb``
    is ``(head_dim, npos_max)``, zero at the start, shared by the heads of a layer.

    Use it through :func:`posenc.attention` with ``cope=module, causal=True``.

    Args:
        head_dim: channels of q and k.
        npos_max: positions with an embedding (``0 .. npos_max - 1``); the
            reference code takes the block size plus one.
        scale_with_logits: multiply the position term by the attention scale
            along with ``q . k``, ``(q . k + pos) * scale`` (the reference
            repository's default); False adds it unscaled, ``q . k * scale +
            pos``, as the paper's listing does.

    Raises:
        ValueError: ``head_dim`` or ``npos_max`` below 1, or a ``pos_emb`` of more
            than :data:`posenc.core.checks.MAX_ELEMENTS` values (refused before any
            work).
        TypeError: ``scale_with_logits`` not a bool.

    Examples:
        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> cope = posenc.CoPE(16, npos_max=9)
        >>> q, k, v = torch.randn(3, 1, 4, 8, 16).unbind(0)  # (batch, heads, seq, head_dim)
        >>> posenc.attention(q, k, v, cope=cope, causal=True).shape
        torch.Size([1, 4, 8, 16])
        >>> gates = torch.ones(1, 4, 8, 8).tril()  # every gate open: CoPE counts the tokens
        >>> cope.positions(gates)[0, 0, -1].tolist()
        [8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
        >>> cope(q, gates).shape  # the position logits, added to the scores
        torch.Size([1, 4, 8, 8])
    """

    def __init__(self, head_dim: int, npos_max: int, *, scale_with_logits: bool = False) -> None:
        super().__init__()
        self.head_dim = checks.check_channels(head_dim, "head_dim")
        self.npos_max = checks.check_int(npos_max, "npos_max", minimum=1)
        checks.check_elements(
            self.head_dim * self.npos_max,
            f"pos_emb (head_dim={self.head_dim} x npos_max={self.npos_max})",
        )
        self.scale_with_logits = checks.check_bool(scale_with_logits, "scale_with_logits")
        self.pos_emb = nn.Parameter(torch.empty(self.head_dim, self.npos_max))
        self.reset_parameters()

    def _init_parameters(self) -> None:
        self.pos_emb.zero_()

    def positions(self, gates: torch.Tensor) -> torch.Tensor:
        """``p_ij = sum_{k >= j} g_ik`` clamped to ``npos_max - 1``: gates ``(..., n, m)``.

        The gates of keys a query does not see (after it, padding, other
        documents) must be 0.
        """
        return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=self.npos_max - 1)

    def forward(self, q: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """The position logits ``(batch, heads, n, m)`` of queries ``q`` and their key gates.

        Args:
            q: ``(batch, heads, n, head_dim)``.
            gates: ``(batch, heads, n, m)``, ``sigmoid(q . k * scale)`` on the keys
                each query sees and 0 elsewhere.

        Raises:
            ValueError: q without ``head_dim`` channels, or gates whose leading
                dimensions are not q's.
        """
        if q.shape[-1] != self.head_dim:
            raise ValueError(
                f"cope has head_dim={self.head_dim}; q has {q.shape[-1]} channels "
                f"(shape {tuple(q.shape)})"
            )
        if gates.shape[:-1] != q.shape[:-1]:
            raise ValueError(
                f"gates must be (batch, heads, n, m) with q's (batch, heads, n) = "
                f"{tuple(q.shape[:-1])}; got {tuple(gates.shape)}"
            )
        p = self.positions(gates)
        at_positions = torch.matmul(q, self.pos_emb.to(q.dtype))  # (..., n, npos_max)
        low = p.detach().floor()
        w = p - low  # the interpolation weight carries the gates' gradient
        below = at_positions.gather(-1, low.long())
        above = at_positions.gather(-1, p.detach().ceil().long())
        return above * w + below * (1 - w)

    def score_form(self, ctx: TermContext) -> TermForm:
        """CoPE as a score term: its parameters tracked, its logits read from the scores.

        The gates are ``sigmoid`` of the scaled scores ``z`` on the keys a query
        sees (0 elsewhere); the addition is the position logits (times the scale
        when ``scale_with_logits``). Its operand is ``"counted"``: ``pos_emb`` and
        that factor, which the compiled loop
        (:mod:`posenc.integration.attention.counted`) reads for float32 on the CPU;
        ``read`` is the checkpointed path's form everywhere else.

        Raises:
            ValueError: a non-causal call (its positions count the keys up to the
                query), or q's head_dim not this module's.
        """
        if not ctx.causal:
            raise ValueError(
                "cope needs causal=True: CoPE's positions sum the gates of the keys "
                "from each key up to the query (Golovneva et al. 2024)"
            )
        if ctx.head_dim != self.head_dim:
            raise ValueError(f"cope has head_dim={self.head_dim}; q and k have {ctx.head_dim}")
        own = dict(self.named_parameters())
        names = tuple(own)
        factor = ctx.scale if self.scale_with_logits else 1.0

        def read(
            tensors: Sequence[torch.Tensor],
            z: torch.Tensor,
            q: torch.Tensor,
            q_pos: torch.Tensor,
            k_pos: torch.Tensor,
            unseen: torch.Tensor | None,
        ) -> torch.Tensor:
            gates = torch.sigmoid(z)  # the paper's gates: 0 on the keys not seen
            if unseen is not None:
                gates = gates.masked_fill(unseen, 0.0)
            # the parameters enter as the block's inputs: torch.func.functional_call works
            call = dict(zip(names, tensors, strict=True))
            pos = torch.func.functional_call(self, call, (q, gates))
            return pos * factor if factor != 1.0 else pos

        tensors = tuple(own.values())
        # q . pos_emb, gathered from
        return TermForm(
            tensors,
            read=read,
            row_values=ctx.heads * self.npos_max,
            operand="counted",
            scalars=(factor,),
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, npos_max={self.npos_max}, "
            f"scale_with_logits={self.scale_with_logits}"
        )


class DAPE(nn.Module):
    """DAPE (Zheng et al. 2024): a base bias refined by an MLP of the scores and the bias.

    ``A = S + B + mlp([S ; B])`` per (query, key) pair, the MLP over the ``2 H``
    channels of all heads (``Linear(2H, width)``, LeakyReLU, ``Linear(width, H)``),
    ``S`` the scaled scores ``q . k * scale`` before any mask and ``B`` the base
    bias as :func:`posenc.attention` adds it (zero above the diagonal when
    causal): the reference modules ``AliBi_DAPE``, ``ParallelKerpleLog_DAPE`` and
    ``FIRE_DAPE`` of chuanyang-Zheng/DAPE (``DAPE.py``) with any base. (That
    ``FIRE_DAPE`` gives FIRE's own MLP a LeakyReLU; :class:`posenc.FIRE` keeps the
    FIRE paper's ReLU.)

    Pass it to :func:`posenc.attention` as ``bias=``.

    Args:
        base_bias: any :class:`posenc.bias.AttentionBias` (ALiBi, KERPLE, FIRE, T5Bias,
            Sandwich; NoPE gives ``B = 0``): held as ``.base``, trained with it.
        width: the MLP's hidden width (32 in the paper).

    Raises:
        TypeError: a base that is not an AttentionBias.
        ValueError: ``width`` below 1, or an MLP weight of more than
            :data:`posenc.core.checks.MAX_ELEMENTS` values (refused before any work).

    Examples:
        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> dape = posenc.DAPE(posenc.ALiBi(4))
        >>> q, k, v = torch.randn(3, 1, 4, 8, 16).unbind(0)  # (batch, heads, seq, head_dim)
        >>> out = posenc.attention(q, k, v, bias=dape, causal=True)
        >>> scores = dape(q @ k.mT / 4, dape.base.bias(8, 8).tril())  # S + B + mlp([S; B])
        >>> causal = torch.ones(8, 8, dtype=torch.bool).tril()
        >>> ref = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        >>> torch.allclose(out, ref, atol=1e-5)
        True
    """

    def __init__(self, base_bias: AttentionBias, width: int = 32) -> None:
        super().__init__()
        if not isinstance(base_bias, AttentionBias):
            raise TypeError(
                f"base_bias must be a posenc.bias.AttentionBias (ALiBi, KERPLE, FIRE ...); "
                f"got {type(base_bias).__name__}"
            )
        self.width = checks.check_int(width, "width", minimum=1)
        self.num_heads = base_bias.num_heads
        checks.check_elements(
            2 * self.num_heads * self.width,
            f"the MLP's first weight (2 x num_heads={self.num_heads} x width={self.width})",
        )
        self.base = base_bias
        heads = self.num_heads
        self.mlp = nn.Sequential(
            nn.Linear(2 * heads, self.width), nn.LeakyReLU(), nn.Linear(self.width, heads)
        )

    def forward(self, scores: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``S + B + mlp([S ; B])``: scores ``(batch, heads, n, m)``, bias ``(heads, n, m)``.

        The MLP runs in the scores' dtype (its weights cast to it); ``bias=None``
        is a zero bias.

        Raises:
            ValueError: scores without ``num_heads`` heads, or a bias of another shape.
        """
        heads = self.num_heads
        if scores.ndim != 4 or scores.shape[1] != heads:
            raise ValueError(
                f"scores must be (batch, heads={heads}, n, m); got {tuple(scores.shape)}"
            )
        if bias is None:
            bias = scores.new_zeros(scores.shape[1:])
        if tuple(bias.shape[-3:]) != tuple(scores.shape[1:]) or bias.ndim not in (3, 4):
            raise ValueError(
                f"bias must be (heads, n, m) = {tuple(scores.shape[1:])} (or with the batch "
                f"first); got {tuple(bias.shape)}"
            )
        return scores + self._refine(scores, bias, tuple(self.mlp.parameters()))

    def _refine(
        self, scores: torch.Tensor, bias: torch.Tensor, params: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        """``B + mlp([S ; B])`` with the MLP's weights and biases ``params``, in S's dtype."""
        dtype = scores.dtype
        bias = bias.to(dtype)
        both = torch.cat((scores, bias.expand_as(scores)), 1).movedim(1, -1)  # (b, n, m, 2H)
        w1, b1, w2, b2 = (p.to(dtype) for p in params)
        act = self.mlp[1]
        assert isinstance(act, nn.LeakyReLU)
        hidden = F.leaky_relu(F.linear(both, w1, b1), act.negative_slope)
        return bias + F.linear(hidden, w2, b2).movedim(-1, 1)

    def score_form(self, ctx: TermContext) -> TermForm:
        """DAPE as a score term: its base's tensors and its MLP's tracked, ``B + mlp([S ;
        B])`` read from the scaled scores ``S`` (``B`` zero above the diagonal when causal,
        as the reference's lower-triangular base bias).

        Where the base's form is a ``"table"`` over ``key - query`` (ALiBi, T5Bias,
        KERPLE, Sandwich, FIRE below its threshold), the form's operand is ``"mlp"``:
        ``tensors`` the table and the MLP's ``w1, b1, w2, b2``, ``scalars`` the
        LeakyReLU's negative slope, what the compiled loop reads
        (:mod:`posenc.integration.attention.mixed`); ``read`` reads the same tensors
        on the checkpointed path. Other bases (FIRE past its threshold, NoPE) have no
        operand: the checkpointed path.

        Raises:
            ValueError: ``num_heads`` not the call's heads.
        """
        base = self.base.score_form(replace(ctx, pieces=False))
        n_base = len(base.tensors)
        causal = ctx.causal

        def read(
            tensors: Sequence[torch.Tensor],
            z: torch.Tensor,
            q: torch.Tensor,
            q_pos: torch.Tensor,
            k_pos: torch.Tensor,
            unseen: torch.Tensor | None,
        ) -> torch.Tensor:
            bias = z.new_zeros(z.shape[1:])
            if base.block is not None:
                bias = base.block(tensors[:n_base], q_pos, k_pos)
                if causal:
                    bias = bias.masked_fill(k_pos[None, :] > q_pos[:, None], 0.0)
            return self._refine(z, bias, tensors[n_base:])

        tensors = (*base.tensors, *self.mlp.parameters())
        # [S ; B] and the MLP's hidden units
        row_values = (3 * ctx.heads + self.width) * ctx.k_len
        if base.operand != "table":
            return TermForm(tensors, read=read, row_values=row_values)
        act = self.mlp[1]
        assert isinstance(act, nn.LeakyReLU)
        return TermForm(
            tensors,
            read=read,
            row_values=row_values,
            operand="mlp",
            scalars=(float(act.negative_slope),),
        )

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, width={self.width}"
