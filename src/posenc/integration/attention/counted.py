"""The compiled loop of the operand kind ``"counted"``: CoPE's attention, forward and backward.

``core/csrc/counted.c`` (``attend_counted`` and ``attend_counted_backward``) runs
:class:`posenc.CoPE`'s causal attention for float32 on the CPU in one pass over the
keys per block of queries, without the checkpointed path's per-block autograd: the
gates ``sigmoid(z)``, their counts from the diagonal back, the position logits
interpolated from ``q . pos_emb`` and the online softmax. Its backward returns
the gradients of q, k, v and ``pos_emb`` (see the C file's header for how the
gates' gradient, a prefix over the keys, meets the forward's descending counts).

:func:`ready` says whether both passes will run; the call then never reaches the
blockwise backward, which has none for a term that reads the scores. Registered in
:data:`posenc.integration.attention.kernel.READERS` by the attention package.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posenc.core.kernels import compiled, threads_for
from posenc.integration.attention.layout import Plan, loop_documents, loop_keys

#: The most positions the loop takes: each thread keeps ``q . pos_emb`` and its
#: gradient for a block of 64 queries, 256 bytes per position each.
MAX_POSITIONS = 8192


def _counted_at(plan: Plan) -> int:
    """The index of the counted form among the plan's forms (its tensors start there)."""
    start = 0
    for form, size in zip(plan.forms, plan.sizes, strict=True):
        if form.operand == "counted":
            return start
        start += size
    raise ValueError("the plan has no 'counted' form")


def ready(
    plan: Plan, tensors: Sequence[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> bool:
    """Whether both compiled passes run for a call ``kernel.reads`` admits (float32 CPU
    inputs, AVX-512): head_dim and v_dim multiples of 16, contiguous last dims, causal,
    one query variant, and no other term that adds to the scores."""
    if compiled is None or not hasattr(compiled, "attend_counted"):
        return False
    if not plan.mask.causal or plan.choose is not None or plan.variants != 1:
        return False
    for form in plan.forms:
        if form.operand != "counted" and (form.read is not None or form.block is not None):
            return False  # the loop adds CoPE's term alone
    emb = tensors[_counted_at(plan)]
    b, h, _, d = q.shape
    if b * h * v.shape[-1] == 0 or d % 16 or v.shape[-1] % 16:
        return False
    if emb.ndim != 2 or emb.shape[0] != d or emb.shape[1] > MAX_POSITIONS:
        return False
    return all(t.stride(-1) == 1 for t in (q, k, v))


def _common(
    plan: Plan, tensors: Sequence[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], list[object]]:
    """pos_emb transposed ``(npos, D)``, the documents (held through the call) and the
    arguments both functions end with."""
    emb = tensors[_counted_at(plan)].detach().float()
    form = next(f for f in plan.forms if f.operand == "counted")
    b, h, lq, d = q.shape
    hk, lk = k.shape[1], k.shape[2]
    docs = loop_documents(plan.mask.docs, b, plan.mask.offset, lq) or ()
    threads = threads_for(b * h * ((lq + 63) // 64))
    args: list[object] = [
        [b, h, hk, lq, lk, d, v.shape[-1]],
        list(q.stride()[:3]), list(k.stride()[:3]), list(v.stride()[:3]),
        emb.shape[1], form.scalars[0], plan.scale, threads, plan.mask.offset,
        tuple(t.data_ptr() for t in docs) if docs else None,
    ]  # fmt: skip
    return emb.t().contiguous(), docs, args


def forward(
    plan: Plan, tensors: Sequence[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The output ``(B, H, LQ, DV)`` and log-sum-exp ``(B, H, LQ)`` of a call :func:`ready`
    accepted; None where the loop declined (``kernel.forward`` raises then: no other
    path has this term's forward)."""
    assert compiled is not None  # ready() saw it
    emb_t, _docs, args = _common(plan, tensors, q, k, v)
    mask = loop_keys(plan.mask.key_mask)
    b, h, lq, _ = q.shape
    out = torch.empty((b, h, lq, v.shape[-1]), dtype=torch.float32)
    lse = torch.empty((b, h, lq), dtype=torch.float32)
    done = compiled.attend_counted(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
        emb_t.data_ptr(), 0 if mask is None else mask.data_ptr(), *args,
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
    """dq, dk, dv and the gradient of ``pos_emb`` (None where not ``wanted``, as for
    every other tracked tensor, which adds nothing to the scores); None where the loop
    declined."""
    assert compiled is not None  # ready() saw it
    emb_t, _docs, args = _common(plan, tensors, q, k, v)
    mask = loop_keys(plan.mask.key_mask)
    at = _counted_at(plan)
    b, h, lq, d = q.shape
    dq = torch.empty((b, h, lq, d), dtype=torch.float32)
    dk = torch.zeros(k.shape, dtype=torch.float32)
    dv = torch.zeros(v.shape, dtype=torch.float32)
    demb = torch.zeros(emb_t.shape, dtype=torch.float32) if wanted[at] else None
    # the loop indexes lse, dout and delta as C-contiguous
    lse, dout, delta = lse.contiguous(), dout.contiguous(), delta.contiguous()
    done = compiled.attend_counted_backward(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), emb_t.data_ptr(),
        0 if mask is None else mask.data_ptr(), lse.data_ptr(), dout.data_ptr(),
        delta.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
        0 if demb is None else demb.data_ptr(), *args,
    )  # fmt: skip
    if not done:
        return None
    grads: list[torch.Tensor | None] = [None] * len(tensors)
    if demb is not None:
        grads[at] = demb.t().to(tensors[at].dtype)
    return (dq, dk, dv, *grads)
