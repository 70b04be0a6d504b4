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

from posenc.families.bias.forget import ForgetGate, ForgetGateTerm
from posenc.families.contextual import DAPE, CoPE
from posenc.families.rotary.dual_chunk import DualChunkRotary
from posenc.families.rotary.pope import PoPE
from posenc.integration.path_layer import PaTHTransforms


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


class DualChunk(DualChunkRotary, PositionModule):
    """Dual Chunk Attention's rotation (An et al. 2024; Qwen2.5-1M), the layer's own.

    :class:`posenc.DualChunkRotary` with ``chunk_size`` the trained length and
    ``local_size`` a quarter of it: RoPE within every chunk of ``3/4`` of the trained
    length, so that training (one chunk or two) and longer tests see no distance beyond
    the trained length. ``h`` is not used.
    """

    def attend_inputs(self, h: torch.Tensor) -> dict[str, Any]:
        """``rotary``: this rotation, which attention applies to q and k."""
        return {"rotary": self}


class PolarPositions(PoPE, PositionModule):
    """PoPE (Gopalakrishnan et al. 2025), the layer's own: magnitudes and phases apart.

    :class:`posenc.PoPE` over the whole head (``dim = head_dim``) with a phase bias per
    head, zero at the start as in pope-pytorch and x-transformers; attention keeps the
    scale of the input head_dim. ``h`` is not used.
    """

    def attend_inputs(self, h: torch.Tensor) -> dict[str, Any]:
        """``rotary``: this PoPE, which attention applies to q and k."""
        return {"rotary": self}


class Householder(PaTHTransforms, PositionModule):
    """PaTH's Householder transforms (Yang et al. 2025) of every token, from the layer's input.

    :class:`posenc.integration.path_layer.PaTHTransforms`, as flash-linear-attention's
    ``PaTHAttention`` makes them: ``w`` a low-rank projection ``d_model -> 32 -> heads
    * head_dim`` without bias, a causal depthwise convolution of width 3 followed by
    SiLU (fla's ``ShortConvolution``), L2-normalised per head; ``beta = 2
    sigmoid(Linear(d_model, heads))`` in ``(0, 2)`` (above 1 the transform has a
    negative eigenvalue, which the paper's state tracking needs). With
    ``forget_gate`` also the gates ``log f = logsigmoid(Linear(d_model, heads))``:
    PaTH-FoX.

    Args:
        d_model: the layer's width.
        heads: attention heads (q, k and v have as many: no grouped queries).
        forget_gate: add the forget gates (PaTH-FoX).

    Raises:
        ValueError: ``d_model`` that does not split into ``heads``.
    """

    def __init__(self, d_model: int, heads: int, *, forget_gate: bool = False) -> None:
        if isinstance(d_model, int) and isinstance(heads, int) and heads and d_model % heads:
            raise ValueError(f"d_model ({d_model}) must split into heads ({heads})")
        super().__init__(d_model, heads, forget_gate=forget_gate)

    def attend_inputs(self, h: torch.Tensor) -> dict[str, Any]:
        """``w`` ``(batch, heads, seq, head_dim)``, ``beta`` ``(batch, heads, seq)`` and,
        with the forget gate, ``log_fgate`` ``(batch, heads, seq)``: the arguments of
        :func:`posenc.path_attention`."""
        w, beta, log_fgate = self.transforms(h)
        inputs: dict[str, Any] = {"w": w, "beta": beta}
        if log_fgate is not None:
            inputs["log_fgate"] = log_fgate
        return inputs
