"""The lab's per-layer position modules: what one layer's attention call gets from its input.

A :class:`PositionModule` belongs to one layer of the lab's model and is called on
that layer's normalised input ``h`` ``(batch, seq, d_model)`` in every forward pass;
:meth:`PositionModule.attend_inputs` returns the keyword arguments of the layer's
attention call: ``terms``, the score terms :func:`posenc.attention` adds (FoX's
gates, CoPE, DAPE), or the inputs of another kernel (PaTH's Householder transforms).
:data:`posenc.lab.encodings.PER_LAYER` names the builder of each, so that a new
per-layer method is a module here and one entry there.

The FoX, CoPE and DAPE modules subclass posenc's own (their parameters, and so the
names in a saved model, are those of :class:`posenc.ForgetGate`, :class:`posenc.CoPE`
and :class:`posenc.DAPE`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from posenc.core import checks
from posenc.families.bias.forget import ForgetGate, ForgetGateTerm
from posenc.families.contextual import DAPE, CoPE

__all__ = [
    "CoPETerm",
    "DAPETerm",
    "ForgetGates",
    "Householder",
    "PositionModule",
]


class PositionModule(nn.Module):
    """One layer's position module: the inputs of its attention call, from the layer's input.

    A subclass implements :meth:`attend_inputs`; its parameters train with the model
    (saved under the layer's ``position``).
    """

    def attend_inputs(self, h: torch.Tensor) -> dict[str, Any]:
        """Keyword arguments of the layer's attention call, for its input ``h``.

        ``h`` is the layer's normalised input ``(batch, seq, d_model)`` at every
        position (the keys'), also when the call computes the last queries only.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement attend_inputs")


class ForgetGates(ForgetGate, PositionModule):
    """FoX's forget gates (Lin et al. 2025) of the layer's input, as a score term.

    :class:`posenc.ForgetGate` ``(d_model, heads)``: every key's log gate, summed
    between key and query by :class:`posenc.bias.ForgetGateTerm`.
    """

    def attend_inputs(self, h: torch.Tensor) -> dict[str, Any]:
        """``terms``: the gates of ``h`` as one :class:`~posenc.bias.ForgetGateTerm`."""
        return {"terms": [ForgetGateTerm(self(h))]}


class CoPETerm(CoPE, PositionModule):
    """CoPE (Golovneva et al. 2024), the layer's own: positions counted by its gates.

    The term reads the scores alone: ``h`` is not used.
    """

    def attend_inputs(self, h: torch.Tensor) -> dict[str, Any]:
        """``terms``: this CoPE."""
        return {"terms": [self]}


class DAPETerm(DAPE, PositionModule):
    """DAPE (Zheng et al. 2024), the layer's own: an MLP adapting its base bias to the scores.

    The term reads the scores alone: ``h`` is not used.
    """

    def attend_inputs(self, h: torch.Tensor) -> dict[str, Any]:
        """``terms``: this DAPE."""
        return {"terms": [self]}


class Householder(PositionModule):
    """PaTH's Householder transforms (Yang et al. 2025) of every token, from the layer's input.

    As flash-linear-attention's ``PaTHAttention`` makes them (fla's
    ``fla/layers/path_attn.py``): ``w`` a low-rank projection ``d_model -> 32 ->
    heads * head_dim`` without bias, a causal depthwise convolution of width 3
    followed by SiLU (fla's ``ShortConvolution``), L2-normalised per head;
    ``beta = 2 sigmoid(Linear(d_model, heads))`` in ``(0, 2)`` (above 1 the
    transform has a negative eigenvalue, which the paper's state tracking needs).
    With ``forget_gate`` also FoX's gates ``log f = logsigmoid(Linear(d_model,
    heads))`` (:class:`posenc.ForgetGate`): PaTH-FoX.

    Args:
        d_model: the layer's width.
        heads: attention heads (q, k and v have as many: no grouped queries).
        forget_gate: add FoX's forget gates (PaTH-FoX).
        rank: the width of the low-rank projection of ``w`` (fla's 32).
        conv: the width of the causal convolution (fla's 3).
    """

    def __init__(
        self, d_model: int, heads: int, *, forget_gate: bool = False, rank: int = 32, conv: int = 3
    ) -> None:
        super().__init__()
        self.d_model = checks.check_int(d_model, "d_model", minimum=1)
        self.heads = checks.check_int(heads, "heads", minimum=1)
        if d_model % heads:
            raise ValueError(f"d_model ({d_model}) must split into heads ({heads})")
        checks.check_int(rank, "rank", minimum=1)
        self.conv_width = checks.check_int(conv, "conv", minimum=1)
        self.w_proj = nn.Sequential(
            nn.Linear(d_model, rank, bias=False), nn.Linear(rank, d_model, bias=False)
        )
        self.w_conv = nn.Conv1d(d_model, d_model, conv, groups=d_model, bias=False)
        self.beta_proj = nn.Linear(d_model, heads, bias=True)
        self.gate = ForgetGate(d_model, heads) if forget_gate else None

    def attend_inputs(self, h: torch.Tensor) -> dict[str, Any]:
        """``w`` ``(batch, heads, seq, head_dim)``, ``beta`` ``(batch, heads, seq)`` and,
        with the forget gate, ``log_fgate`` ``(batch, heads, seq)``: the arguments of
        :func:`posenc.path_attention`."""
        b, t, d = h.shape
        w = self.w_proj(h).transpose(1, 2)  # (batch, channels, seq) for the convolution
        # causal: the left padding makes token t see tokens t - conv + 1 .. t only
        w = nn.functional.silu(self.w_conv(nn.functional.pad(w, (self.conv_width - 1, 0))))
        w = w.view(b, self.heads, d // self.heads, t).transpose(2, 3)
        inputs: dict[str, Any] = {
            "w": nn.functional.normalize(w, dim=-1),
            "beta": 2 * torch.sigmoid(self.beta_proj(h)).transpose(1, 2),
        }
        if self.gate is not None:
            inputs["log_fgate"] = self.gate(h)
        return inputs
