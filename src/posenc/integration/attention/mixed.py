"""The compiled loop of the ``"mlp"`` operand: DAPE's scores refined by an MLP over the heads.

:class:`posenc.DAPE` scores a (query, key) pair as ``A_h = S_h + B_h + mlp([S ;
B])_h``, the MLP over the ``2 H`` channels of all heads' scaled scores ``S`` and base
bias ``B``. Its form's operand is ``"mlp"``: ``tensors`` the base's ``(heads, q_len
+ k_len - 1)`` table over ``key - query`` and the MLP's ``w1 (width, 2H)``, ``b1``,
``w2 (H, width)``, ``b2``; ``scalars[0]`` the LeakyReLU's negative slope. This module
is its :class:`~posenc.integration.attention.kernel.Reader`: ``core/csrc/mixed.c``'s
``attend_mixed`` and ``attend_mixed_backward`` (a block of queries over all heads at
once, the MLP per score in registers), registered as ``kernel.READERS["mlp"]`` by
the attention package.

:func:`ready` holds both passes to run (for a call ``kernel.reads`` admits: float32
CPU inputs, AVX-512): the compiled loop built, the call's only term DAPE's form,
float32 tensors, ``head_dim``
and ``v_dim`` multiples of 16, at most :data:`MAX_HEADS` heads and
:data:`MAX_WIDTH` hidden units. Elsewhere the call takes the checkpointed path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posenc.core.kernels import compiled, threads_for
from posenc.integration.attention.layout import Plan, loop_documents, loop_keys

#: The most heads and hidden units the loop takes (its vectors per pair in registers).
MAX_HEADS = 16
MAX_WIDTH = 64


def ready(
    plan: Plan, tensors: Sequence[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> bool:
    """Whether both passes run for these float32 CPU inputs (see the module docstring)."""
    if len(plan.forms) != 1 or plan.choose is not None or plan.forms[0].operand != "mlp":
        return False  # another term beside DAPE is read per block: the checkpointed path
    table, w1 = tensors[0], tensors[1]
    heads, width = q.shape[1], w1.shape[0]
    return (
        hasattr(compiled, "attend_mixed")
        and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in (q, k, v, *tensors))
        and q.shape[-1] % 16 == 0
        and v.shape[-1] % 16 == 0
        and heads <= MAX_HEADS
        and width <= MAX_WIDTH
        and tuple(table.shape) == (heads, q.shape[2] + k.shape[2] - 1)
        and tuple(w1.shape) == (width, 2 * heads)
    )


def _operands(
    plan: Plan, tensors: Sequence[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[tuple[torch.Tensor, ...], list[torch.Tensor], tuple[int, ...] | None]:
    """q, k, v (unit stride along the last dim), the reversed table and the MLP's four
    tensors (contiguous), the key mask (uint8) and the documents as the loop reads them."""
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    table, *mlp = (t.detach().contiguous() for t in tensors)
    # reversed, so that a key's row of queries reads it forwards (as attend's)
    held = [table.flip(-1).contiguous(), *mlp]
    mask = loop_keys(plan.mask.key_mask)
    if mask is not None:
        held.append(mask)
    docs = None
    found = loop_documents(plan.mask.docs, q.shape[0], plan.mask.offset, q.shape[2])
    if found is not None:
        held += found
        docs = (found[0].data_ptr(), found[1].data_ptr())
    return (q, k, v), held, docs


def _sizes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, width: int) -> list[int]:
    b, h, lq, d = q.shape
    return [b, h, k.shape[1], lq, k.shape[2], d, v.shape[-1], width]


def forward(
    plan: Plan, tensors: Sequence[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The output ``(B, H, LQ, DV)`` and log-sum-exp ``(B, H, LQ)`` of ``attend_mixed``;
    None where the loop declined (``kernel.forward`` raises then)."""
    assert compiled is not None
    (q, k, v), held, docs = _operands(plan, tensors, q, k, v)
    table, w1, b1, w2, b2 = held[:5]
    mask = held[5] if plan.mask.key_mask is not None else None
    b, h, lq, _ = q.shape
    out = torch.empty((b, h, lq, v.shape[-1]), dtype=torch.float32)
    lse = torch.empty((b, h, lq), dtype=torch.float32)
    threads = threads_for(b * ((lq + 63) // 64))
    done = compiled.attend_mixed(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
        table.data_ptr(), 0 if mask is None else mask.data_ptr(),
        (w1.data_ptr(), b1.data_ptr(), w2.data_ptr(), b2.data_ptr()), _sizes(q, k, v, w1.shape[0]),
        list(q.stride()[:3]), list(k.stride()[:3]), list(v.stride()[:3]),
        plan.mask.causal, plan.scale, plan.forms[0].scalars[0], threads, plan.mask.offset, docs,
    )  # fmt: skip
    return (out, lse) if done else None


def backward(
    plan: Plan,
    tensors: Sequence[torch.Tensor],
    wanted: Sequence[bool],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    delta: torch.Tensor,
) -> tuple[torch.Tensor | None, ...] | None:
    """dq, dk, dv and the gradients of the table, w1, b1, w2 and b2 (None where not
    ``wanted``) from ``attend_mixed_backward``; None where the loop declined."""
    assert compiled is not None
    (q, k, v), held, docs = _operands(plan, tensors, q, k, v)
    table, w1, b1, w2, b2 = held[:5]
    mask = held[5] if plan.mask.key_mask is not None else None
    b, h, lq, d = q.shape
    hk, lk = k.shape[1], k.shape[2]
    dq = torch.zeros((b, h, lq, d), dtype=torch.float32)
    dk = torch.zeros((b, hk, lk, d), dtype=torch.float32)
    dv = torch.zeros((b, hk, lk, v.shape[-1]), dtype=torch.float32)
    grads = [torch.zeros_like(t) for t in (table, w1, b1, w2, b2)]
    # the loop indexes lse, dout and delta as C-contiguous
    lse, dout, delta = lse.contiguous(), dout.contiguous(), delta.contiguous()
    threads = threads_for(b * ((lq + 63) // 64))
    done = compiled.attend_mixed_backward(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), lse.data_ptr(), dout.data_ptr(),
        delta.data_ptr(), table.data_ptr(), 0 if mask is None else mask.data_ptr(),
        (w1.data_ptr(), b1.data_ptr(), w2.data_ptr(), b2.data_ptr()),
        dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), tuple(g.data_ptr() for g in grads),
        _sizes(q, k, v, w1.shape[0]), list(q.stride()[:3]), list(k.stride()[:3]),
        list(v.stride()[:3]), plan.mask.causal, plan.scale, plan.forms[0].scalars[0], threads,
        plan.mask.offset, docs,
    )  # fmt: skip
    if not done:
        return None
    grads[0] = grads[0].flip(-1)  # the gradient of the table as the form holds it
    return (dq, dk, dv, *(g if w else None for g, w in zip(grads, wanted, strict=True)))
