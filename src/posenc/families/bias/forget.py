"""The Forgetting Transformer's forget gate: a bias on the scores that the tokens choose.

Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a Forget Gate"
(reference: zhixuan-lin/forgetting-transformer, the ``fgate_type="full"`` gate of
``ForgettingAttentionLayer`` in ``model/forgetting_transformer``). Each token t
gives every head a forget gate ``f_t = sigmoid(w . x_t + b)``; query ``i`` weighs
key ``j`` by the product of the gates after ``j`` up to ``i``, that is the score
gains ``sum_{j < t <= i} log f_t = c_i - c_j`` with ``c`` the gates' cumulative
log sum. :func:`posenc.attention` takes the log gates as ``log_fgate`` and adds
that term in its loops, without a ``(q_len, k_len)`` tensor.

Shapes::

    x         (batch, seq, hidden)
    log_fgate (batch, heads, seq)   float32 (float64 for float64 weights), <= 0
"""

from __future__ import annotations

import torch
from torch import nn

from posenc.core import checks

__all__ = ["ForgetGate"]


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

    Example::

        gate = ForgetGate(512, 8)
        out = posenc.attention(q, k, v, causal=True, log_fgate=gate(x))
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
