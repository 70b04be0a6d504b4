"""Attention whose position signal reads the scores: CoPE and DAPE, block by block.

:func:`posenc.attention` checks and prepares the inputs (rotary, padding,
packed documents, the base bias as a block function) and hands a call with
``cope=`` or a :class:`posenc.DAPE` bias to :func:`attend`. The position term
needs ``q . k`` itself (CoPE's gates, DAPE's MLP of the scores), which neither the
compiled loop nor a FlexAttention score mod can give per score, so this path is
exact softmax attention in torch ops over blocks of queries, every key at once:

- a block of ``n`` queries builds its scores ``(batch, heads, n, k_len)`` and
  the position term (CoPE: the gates and their reverse cumulative sum along the
  keys, exact per query row; DAPE: the MLP over the heads of each (query, key)
  pair), its softmax and its output; no ``(batch, heads, q_len, k_len)`` tensor
  exists beyond a block;
- training: each block runs under ``torch.utils.checkpoint`` (non-reentrant),
  which keeps only the block's inputs (views of q, k and v, the bias tensors
  and the modules' parameters) and recomputes the block in the backward, so
  memory stays one block's beyond the O(q_len) inputs and outputs; autograd
  differentiates the recomputed block, reaching q, k, v, ``pos_emb``, DAPE's
  MLP and the base bias's parameters. CoPE's and DAPE's parameters enter each
  block as inputs, so ``torch.func.functional_call`` reaches them too.

Shapes as :mod:`posenc.integration.attention`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint

from posenc.families.contextual import DAPE, CoPE
from posenc.integration._blocks import allowed, grouped

__all__ = ["attend", "check"]

# Scores (and their companions) per block: 4 MiB of float32 values
_BLOCK_SCORES = 1 << 20

BACKENDS = ("auto", "kernel", "blockwise")

BiasFn = Callable[[Sequence[torch.Tensor], torch.Tensor, torch.Tensor], torch.Tensor]


def check(cope: object, bias: object, causal: bool, backend: str, head_dim: int) -> None:
    """Refuse a ``cope`` or DAPE request :func:`attend` cannot compute.

    Raises:
        TypeError: ``cope`` not a :class:`posenc.CoPE`.
        ValueError: ``cope`` without ``causal=True`` (its positions count the keys
            up to the query), with a head_dim other than q's, or with a DAPE bias;
            either with ``backend="flex"``.
    """
    if cope is None and not isinstance(bias, DAPE):
        return
    if cope is not None:
        if not isinstance(cope, CoPE):
            raise TypeError(f"cope must be a posenc.CoPE; got {type(cope).__name__}")
        if not causal:
            raise ValueError(
                "cope needs causal=True: CoPE's positions sum the gates of the keys "
                "from each key up to the query (Golovneva et al. 2024)"
            )
        if cope.head_dim != head_dim:
            raise ValueError(f"cope has head_dim={cope.head_dim}; q and k have {head_dim}")
        if isinstance(bias, DAPE):
            raise ValueError("cope and a DAPE bias cannot be combined: pass one of them")
    if backend not in BACKENDS:
        what = "cope" if cope is not None else "a DAPE bias"
        raise ValueError(
            f"{what} reads the scores, which only the blockwise torch path computes: "
            f"backend must be one of {BACKENDS} ('kernel' falls back to it); got {backend!r}"
        )


@dataclass(frozen=True)
class _Plan:
    """How to score a block: everything but the tensors autograd tracks."""

    cope: CoPE | None
    dape: DAPE | None
    bias_fn: BiasFn | None  # (params, q_pos (n,), k_pos (m,)) -> (heads, n, m)
    causal: bool
    scale: float
    key_mask: torch.Tensor | None  # (batch, k_len) bool, True = attend
    docs: torch.Tensor | None  # (1 or batch, k_len): each key position's document
    # a block's tensors, in order: the bias function's, the gate's c (when gated),
    # CoPE's and DAPE's parameters by name
    n_bias: int = 0
    gated: bool = False
    cope_names: tuple[str, ...] = ()
    dape_names: tuple[str, ...] = ()

    def split(self, tensors: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        """A block's tensors as (bias tensors, gate or None, CoPE's, DAPE's by name)."""
        bias, rest = tuple(tensors[: self.n_bias]), list(tensors[self.n_bias :])
        gate = rest.pop(0) if self.gated else None
        n = len(self.cope_names)
        cope = dict(zip(self.cope_names, rest[:n], strict=True))
        dape = dict(zip(self.dape_names, rest[n:], strict=True))
        return bias, gate, cope, dape


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    params: Sequence[torch.Tensor],
    *,
    cope: CoPE | None,
    dape: DAPE | None,
    bias_fn: BiasFn | None,
    causal: bool,
    scale: float,
    key_mask: torch.Tensor | None,
    docs: torch.Tensor | None,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention of prepared inputs with CoPE or DAPE, queries bottom-right.

    q, k and v are rotated already and of one float dtype (the work dtype);
    ``bias_fn(params, q_pos, k_pos)`` gives the base bias ``(heads, n, m)`` of
    queries and keys at key positions (scaled already where the bias says
    ``scale_with_logits``), None for none. ``gate``: the Forgetting
    Transformer's cumulative log forget gates c ``(batch, heads, k_len)``, a
    score gaining ``c[query] - c[key]`` after the position term, or None. A
    query that sees no key gets a zero output.

    Returns:
        ``(batch, heads, q_len, v_dim)``.
    """
    # the modules' parameters enter every block as its inputs (recomputed in the
    # backward from these, not from the module's attributes: torch.func's
    # functional_call works)
    own = {} if cope is None else dict(cope.named_parameters())
    mlp = {} if dape is None else dict(dape.mlp.named_parameters(prefix="mlp"))
    plan = _Plan(
        cope, dape, bias_fn, causal, scale, key_mask, docs,
        len(params), gate is not None, tuple(own), tuple(mlp),
    )  # fmt: skip
    tensors = (*params, *([] if gate is None else [gate]), *own.values(), *mlp.values())
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    per_query = h * lk  # the scores of one query row
    if cope is not None:
        per_query += h * cope.npos_max  # q . pos_emb, gathered from
    if dape is not None:
        per_query += (3 * h + dape.width) * lk  # [S ; B] and the MLP's hidden units
    step = max(1, min(lq, _BLOCK_SCORES // max(1, b * per_query)))
    tracked = [q, k, v, *tensors]
    recompute = torch.is_grad_enabled() and any(t.requires_grad for t in tracked)
    blocks = []
    for i0 in range(0, lq, step):
        i1 = min(lq, i0 + step)
        q_pos = torch.arange(i0, i1, device=q.device) + (lk - lq)
        run = partial(_block, plan, q_pos)
        if recompute:
            out = checkpoint(run, q[:, :, i0:i1], k, v, *tensors, use_reentrant=False)
        else:
            out = run(q[:, :, i0:i1], k, v, *tensors)
        blocks.append(out)
    return torch.cat(blocks, 2)


def _block(
    plan: _Plan,
    q_pos: torch.Tensor,
    qb: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *tensors: torch.Tensor,
) -> torch.Tensor:
    """The output ``(B, H, n, v_dim)`` of a block of queries ``qb`` (B, H, n, D)."""
    params, gate, cope_params, dape_params = plan.split(tensors)
    hk = k.shape[1]
    k_pos = torch.arange(k.shape[2], device=k.device)
    z = torch.matmul(grouped(qb, hk), k.unsqueeze(2).transpose(-1, -2)).flatten(1, 2)
    z = z * plan.scale
    seen = allowed(plan.causal, plan.key_mask, plan.docs, q_pos, k_pos)
    unseen = None if seen is None else ~seen
    s = z
    if plan.cope is not None:
        # the paper's gates: sigmoid of the scaled scores, 0 on the keys not seen
        gates = torch.sigmoid(z)
        if unseen is not None:
            gates = gates.masked_fill(unseen, 0.0)
        pos = functional_call(plan.cope, cope_params, (qb, gates))
        s = z + (pos * plan.scale if plan.cope.scale_with_logits else pos)
    bias = None if plan.bias_fn is None else plan.bias_fn(params, q_pos, k_pos)
    if plan.dape is not None:
        if bias is not None and plan.causal:  # the reference's base bias is lower-triangular
            bias = bias.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], 0.0)
        s = functional_call(plan.dape, dape_params, (z, bias))
    elif bias is not None:
        s = s + bias
    if gate is not None:
        s = s + (gate[:, :, q_pos, None] - gate[:, :, None, k_pos])
    if unseen is not None:
        s = s.masked_fill(unseen, float("-inf"))
    # softmax whose rows without a key give 0 (the max is only a shift: no gradient)
    top = s.detach().amax(-1, keepdim=True)
    top = top.masked_fill(top == float("-inf"), 0.0)
    e = torch.exp(s - top)
    total = e.sum(-1, keepdim=True)
    p = e / torch.where(total > 0, total, torch.ones_like(total))
    return torch.matmul(grouped(p, hk), v.unsqueeze(2)).flatten(1, 2)
