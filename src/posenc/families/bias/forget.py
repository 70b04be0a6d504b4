"""The Forgetting Transformer's forget gate: a bias on the scores that the tokens choose.

Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a Forget Gate"
(reference: zhixuan-lin/forgetting-transformer, the ``fgate_type="full"`` gate of
``ForgettingAttentionLayer`` in ``model/forgetting_transformer``). Each token t
gives every head a forget gate ``f_t = sigmoid(w . x_t + b)``; query ``i`` weighs
key ``j`` by the product of the gates after ``j`` up to ``i``, that is the score
gains ``sum_{j < t <= i} log f_t = c_i - c_j`` with ``c`` the gates' cumulative
log sum. :func:`posenc.attention` takes the log gates as ``log_fgate`` and adds
that term in its loops, without a ``(q_len, k_len)`` tensor: :class:`ForgetGateTerm`
is the score term (:class:`posenc.families.terms.ScoreTerm`) it makes of them, and
the one home of the gates' cumulative sum.

Shapes::

    x         (batch, seq, hidden)
    log_fgate (batch, heads, seq)   float32 (float64 for float64 weights), <= 0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from posenc.core import checks
from posenc.families.terms import AddMod, TermContext, TermForm


class ForgetGate(nn.Module):
    """``log f = logsigmoid(Linear(x))`` per head: the log forget gates of FoX.

    The projection is the reference's ``fgate_proj`` (``nn.Linear(hidden,
    heads, bias=True)``), initialised as its ``_initialize_weights`` does:
    weight ~ N(0, ``init_std``), bias 0, so every gate starts near
    ``sigmoid(0) = 1/2``. The logits go to float32 before ``logsigmoid`` (the
    reference casts them too: bfloat16 gates summed over thousands of tokens
    lose the decay).

    Args:
        hidden: the size of the hidden states ``x``.
        heads: attention heads (q's heads); one gate per head and token.
        init_std: the standard deviation of the weight at initialisation
            (the reference's ``initializer_range``, 0.02).

    Examples:
        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> gate = posenc.ForgetGate(64, 4)
        >>> x = torch.randn(2, 10, 64)  # hidden states (batch, seq, hidden)
        >>> log_f = gate(x)
        >>> log_f.shape, log_f.dtype, bool((log_f < 0).all())
        (torch.Size([2, 4, 10]), torch.float32, True)
        >>> q, k, v = torch.randn(3, 2, 4, 10, 16).unbind(0)  # (batch, heads, seq, head_dim)
        >>> posenc.attention(q, k, v, causal=True, log_fgate=log_f).shape
        torch.Size([2, 4, 10, 16])
    """

    def __init__(self, hidden: int, heads: int, *, init_std: float = 0.02) -> None:
        super().__init__()
        self.hidden = checks.check_int(hidden, "hidden", minimum=1)
        self.heads = checks.check_int(heads, "heads", minimum=1)
        self.init_std = checks.check_number(init_std, "init_std", positive=True)
        self.proj = nn.Linear(self.hidden, self.heads, bias=True)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight ~ N(0, init_std), bias 0 (the reference's initialisation)."""
        nn.init.normal_(self.proj.weight, mean=0.0, std=self.init_std)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The log forget gates ``(batch, heads, seq)`` of hidden states ``(batch, seq, hidden)``.

        float32, or float64 for float64 weights and input; every value <= 0.

        Raises:
            TypeError: ``x`` not a float tensor.
            ValueError: ``x`` not ``(batch, seq, hidden)``.
        """
        checks.check_float_tensor(x, "x")
        if x.ndim != 3 or x.shape[-1] != self.hidden:
            raise ValueError(
                f"x must be (batch, seq, hidden) with hidden={self.hidden}; got {tuple(x.shape)}"
            )
        logits = self.proj(x)
        wide = torch.float64 if logits.dtype == torch.float64 else torch.float32
        return torch.nn.functional.logsigmoid(logits.to(wide)).transpose(1, 2)

    def extra_repr(self) -> str:
        return f"hidden={self.hidden}, heads={self.heads}, init_std={self.init_std}"


def forget_cumsum(
    log_fgate: torch.Tensor,
    key_mask: torch.Tensor | None,
    positions: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """c, the forget gates' cumulative sum along the keys ``(batch, heads, k_len)``.

    Summed in float64 (float32 on MPS, which has none), so that restarting it at
    each document (subtracting the sum before the document) cancels nothing, then
    cast to ``dtype``. Gates of padding (``key_mask`` False) are 0: a left-padded
    row's c starts at its first token, as the Forgetting Transformer's reference
    sets them. ``positions`` ``(1 or batch, k_len)``: each key's position within
    its packed document (c restarts with each), or None.
    """
    b, h, k_len = log_fgate.shape
    wide = torch.float32 if log_fgate.device.type == "mps" else torch.float64
    gates = log_fgate.to(wide)
    if key_mask is not None:
        gates = gates.masked_fill(~key_mask[:, None], 0.0)
    c = gates.cumsum(-1)
    if positions is not None:
        # each key's document starts at its position minus its position in the document
        start = torch.arange(k_len, device=c.device) - positions
        before = torch.nn.functional.pad(c, (1, 0))
        c = c - before.gather(-1, start[:, None].expand(b, h, k_len))
    return c.to(dtype)


@dataclass(frozen=True, eq=False)
class ForgetGateTerm:
    """The Forgetting Transformer's decay as a score term: query ``p`` and key ``j``
    score ``c[p] - c[j]`` more, the log gates summed over ``(j, p]``.

    What :func:`posenc.attention` makes of ``log_fgate=``; pass it in ``terms=``
    to combine it with other terms explicitly. ``c`` is :func:`forget_cumsum` of the
    gates (float32, float64 for float64 scores), restarting with each packed
    document; causal calls only. The compiled loop reads ``c`` as its ``"gate"``
    operand and sums the gate's gradient as each position's row sum of the score
    gradient minus its column sum.

    Attributes:
        log_fgate: ``(batch, heads, k_len)`` log forget gates (<= 0), one per key
            position and head (q's heads), from :class:`ForgetGate`.

    Examples:
        >>> import torch
        >>> import posenc
        >>> from posenc.bias import ALiBi, ForgetGate, ForgetGateTerm
        >>> _ = torch.manual_seed(0)
        >>> x, (q, k, v) = torch.randn(1, 6, 32), torch.randn(3, 1, 2, 6, 16)
        >>> term = ForgetGateTerm(ForgetGate(32, 2)(x))  # (batch, heads, seq) log gates
        >>> out = posenc.attention(q, k, v, causal=True, terms=[term, ALiBi(2)])
        >>> out.shape
        torch.Size([1, 2, 6, 16])
        >>> same = posenc.attention(q, k, v, causal=True, log_fgate=term.log_fgate, bias=ALiBi(2))
        >>> torch.allclose(out, same, atol=1e-6)
        True
    """

    log_fgate: torch.Tensor

    def score_form(self, ctx: TermContext) -> TermForm:
        """The gate's form: ``c`` tracked, and ``c[query] - c[key]`` on every block.

        Raises:
            ValueError: a non-causal call; ``log_fgate`` not ``(batch, heads, k_len)``
                or on another device.
            TypeError: ``log_fgate`` not a float tensor.
        """
        log_fgate = self.log_fgate
        if not ctx.causal:
            raise ValueError(
                "log_fgate (the Forgetting Transformer) needs causal=True: a query "
                "decays the keys before it"
            )
        checks.check_float_tensor(log_fgate, "log_fgate")
        want = (ctx.batch, ctx.heads, ctx.k_len)
        if tuple(log_fgate.shape) != want:
            raise ValueError(
                f"log_fgate must be (batch, heads, k_len) = {want}; got {tuple(log_fgate.shape)}"
            )
        if log_fgate.device != ctx.device:
            raise ValueError(
                f"log_fgate must be on q's device {ctx.device}; got {log_fgate.device}"
            )
        dtype = torch.float64 if ctx.dtype == torch.float64 else torch.float32
        c = forget_cumsum(log_fgate, ctx.key_mask, ctx.positions, dtype).to(ctx.dtype)
        offset = ctx.offset

        def block(
            tensors: Sequence[torch.Tensor], q_pos: torch.Tensor, k_pos: torch.Tensor
        ) -> torch.Tensor:
            gate = tensors[0]
            return gate[:, :, q_pos, None] - gate[:, :, None, k_pos]

        def flex(tensors: Sequence[torch.Tensor]) -> AddMod:
            # the queries' c is a copy of its own: FlexAttention's backward scatters the
            # gradient of a captured tensor by index and takes each tensor indexed once
            at_keys = tensors[0]
            at_queries = at_keys[:, :, offset:].clone()

            def add(bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
                return at_queries[bi, hi, qi] - at_keys[bi, hi, ki]

            return add

        return TermForm((c,), block, flex, "gate")
