"""``posenc.attention``: softmax attention with rotary encodings and score terms, in linear memory.

Shapes::

    q     (batch, heads, q_len, head_dim)
    k     (batch, kv_heads, k_len, head_dim)     heads % kv_heads == 0 (GQA)
    v     (batch, kv_heads, k_len, v_dim)
    out   (batch, heads, q_len, v_dim)

Queries are aligned bottom-right: query ``i`` sits at key position ``i + k_len -
q_len`` (a KV cache holds the earlier keys). ``scores = q . k * scale + terms``,
each term a :class:`posenc.families.terms.ScoreTerm` (every bias module, the
Forgetting Transformer's gates, CoPE, DAPE, or a user's own).

The engine is this package; its parts, none of which names a family:

- :mod:`~posenc.integration.attention.layout`: checks, padding, packed
  documents, chunks, the rotation, a block's mask;
- :mod:`~posenc.integration.attention.softmax`: the softmax engine, blockwise
  forward and backward and the autograd function;
- :mod:`~posenc.integration.attention.kernel`: the compiled loop's operands
  (``"kernel"``: CPU, float32, flash-attention 2 forward and backward), and
  ``READERS``, the loops of the operand kinds that read the scores
  (:mod:`~posenc.integration.attention.counted`,
  :mod:`~posenc.integration.attention.mixed`);
- :mod:`~posenc.integration.attention.flex`: FlexAttention (``"flex"``, what
  ``"auto"`` takes on GPUs; on CPU forward only);
- :mod:`~posenc.integration.attention.checkpointed`: terms that read the scores
  where their loop does not run, block by block under checkpointing;
- :mod:`~posenc.integration.attention.stick_breaking` and
  :mod:`~posenc.integration.attention.path`: engines with their own
  normaliser or scores, on the same layout.

No path builds a ``(batch, heads, q_len, k_len)`` tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from posenc.core import checks
from posenc.families.bias.forget import ForgetGateTerm
from posenc.families.bias.modules import AttentionBias
from posenc.families.contextual import DAPE, CoPE
from posenc.families.terms import ScoreTerm, TermContext
from posenc.integration.attention import checkpointed, counted, flex, kernel, layout, mixed
from posenc.integration.attention.layout import Plan
from posenc.integration.attention.softmax import SoftmaxAttention

# the loops of the operand kinds that read the scores (kernel imports none of them)
kernel.READERS.update(counted=counted, mlp=mixed)

#: What ``attention(backend=)`` accepts: ``"auto"`` picks by device and input.
BACKENDS = ("auto", "kernel", "blockwise", "flex")

# inputs FlexAttention takes as they are and the other paths compute in float32
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    bias: ScoreTerm | None = None,
    cope: ScoreTerm | None = None,
    terms: Sequence[ScoreTerm] = (),
    rotary: Any = None,
    causal: bool = False,
    scale: float | None = None,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    chunk_size: int | None = None,
    log_fgate: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Softmax attention with a rotary encoding and/or score terms, without quadratic memory.

    ``softmax(q . k * scale + terms + mask) v`` per head, queries aligned
    bottom-right (query ``i`` is key position ``i + k_len - q_len``): a KV
    cache (``q_len < k_len``) gets the distances and the causal mask right.

    Args:
        q: ``(batch, heads, q_len, head_dim)``.
        k: ``(batch, kv_heads, k_len, head_dim)``; ``heads`` a multiple of
            ``kv_heads`` (grouped-query attention).
        v: ``(batch, kv_heads, k_len, v_dim)``.
        bias: an :class:`posenc.bias.AttentionBias` with ``heads`` heads (ALiBi,
            T5Bias, KERPLE, FIRE, Sandwich, NoPE), added to the scaled scores;
            or a :class:`posenc.DAPE`, whose MLP reads the scores and its base
            bias. Shorthand for its place in ``terms``.
        cope: a :class:`posenc.CoPE` (needs ``causal=True``): positions counted
            by gates on the scores, their embeddings' logits added to the
            scores. Combines with padding, packed documents, ``chunk_size``,
            ``rotary`` (its gates read the rotated q and k), a bias and
            ``log_fgate``; not with a DAPE bias, nor ``backend="flex"``.
        terms: more score terms (:class:`posenc.families.terms.ScoreTerm`),
            added after ``cope``, ``bias`` and ``log_fgate`` in order.
        rotary: any :class:`posenc.rotary.rotation.Rotation` (a
            :class:`posenc.Rotary`, :class:`posenc.FoPE`,
            :class:`posenc.rotary.rotation.RotaryTables`), or a
            :class:`posenc.rotary.rotation.PairRotation`, which treats q and k
            each its own way (:class:`posenc.PoPE`'s polar channels,
            :class:`posenc.DualChunkRotary`'s query per chunk distance);
            rotates q at positions ``k_len - q_len .. k_len - 1`` and k at ``0 ..
            k_len - 1`` (pass keys already rotated, and no rotary, if your cache
            stores them rotated). The default scale is of the inputs' head_dim.
        causal: each query sees keys up to its own position only.
        scale: score scale; ``1 / sqrt(head_dim)`` by default (T5 uses 1.0).
        attention_mask: ``(batch, k_len)`` bool or int, 1 / True for keys to
            attend, 0 / False for padding (HF's convention). A query that sees
            no key gets a zero output. A NaN or infinite input gives what
            softmax gives, never a zero: a NaN or +inf score makes its
            query's row NaN, an infinite value its column infinite.
        cu_seqlens: packed documents: ``(n + 1,)`` ints rising from 0 to
            ``k_len`` (flash-attn's varlen convention), the same for every row
            of the batch. Each query attends only to keys of its own document,
            and rotary positions and the terms restart with each document: the
            result equals running every document alone.
        document_ids: packed documents as ids: ``(k_len,)`` or ``(batch, k_len)``
            ints, a new document wherever the id changes along a row (HF's
            ``seq_idx``); as ``cu_seqlens`` otherwise.
        chunk_size: chunked attention (Llama 4's RoPE layers, HF
            ``attention_chunk_size``): a query at position ``p`` sees only keys
            ``j`` with ``j // chunk_size == p // chunk_size`` (and, causal,
            ``j <= p``). Positions are the rotary ones: key positions, or
            positions within each document when packed (a document's chunks
            start with it). Rotary positions and the terms stay as they are: a
            chunk restarts neither. Needs ``q_len <= k_len``.
        log_fgate: the Forgetting Transformer's log forget gates (Lin et al.
            2025, :class:`posenc.ForgetGate` makes them), ``(batch, heads,
            k_len)``: shorthand for a :class:`posenc.bias.ForgetGateTerm` in
            ``terms``. Query ``i`` at key position ``p`` and key ``j`` score
            ``c[p] - c[j]`` more (``c`` the gates' cumulative sum, float32 or
            float64 for float64 inputs): the sum of the gates over ``(j, p]``.
            Causal only; gates of padding count as 0, and ``c`` restarts with
            each packed document. Gradients reach it.
        backend: ``"auto"``, ``"kernel"`` (CPU float32; falls back to blockwise
            where it does not apply), ``"blockwise"`` or ``"flex"`` (compiled
            FlexAttention; on CPU forward only). ``"auto"`` takes ``"kernel"`` on
            CPU and ``"flex"`` on other devices, except with a term that reads the
            scores (``cope``, a DAPE bias), which takes ``"blockwise"`` there. On
            CPU such a term runs its compiled loop (float32, head_dim and v_dim
            multiples of 16, the term alone beside the mask) or else the
            checkpointed blocks.

    Returns:
        ``(batch, heads, q_len, v_dim)`` in q's dtype. On ``"flex"``
        float16/bfloat16 q, k and v go to FlexAttention in their own dtype: it
        computes the scores, the softmax and its sums in float32, as
        FlashAttention does (the terms are float32 too), rounding the weights to
        that dtype for their product with v. ``"kernel"`` and ``"blockwise"``
        compute float16/bfloat16 inputs in float32. float64 inputs are computed
        in float64 (the terms too). An empty batch, no heads or ``v_dim = 0``
        give the empty result on every backend.

    Raises:
        TypeError: non-float or mixed-dtype q/k/v; a bias that is not an
            AttentionBias or a DAPE; a ``cope`` that is not a CoPE; a term that
            is no ScoreTerm; a ``rotary`` that is no Rotation; a bad mask type.
        ValueError: shapes that do not match (batch, head_dim, lengths, heads
            not a multiple of kv_heads); ``head_dim = 0``; a term's heads not
            q's; a causal request with ``q_len > k_len``; a mask of the wrong
            shape; an unknown backend; a non-positive scale; ``cu_seqlens`` not
            rising from 0 to ``k_len``, or given with ``document_ids``;
            ``chunk_size`` not an int >= 1, or with ``q_len > k_len``;
            ``log_fgate`` of another shape or device, or without ``causal``;
            ``cope`` without ``causal``, of another head_dim, or with a DAPE
            bias; a term that reads the scores with ``backend="flex"``, or with a
            rotation that changes q's channels; a rotation with several query
            variants with ``backend="flex"``.

    Examples:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(3, 2, 4, 8, 16).unbind(0)  # (batch, heads, seq, head_dim)
        >>> alibi = posenc.ALiBi(4)
        >>> out = posenc.attention(q, k, v, bias=alibi, causal=True)
        >>> out.shape
        torch.Size([2, 4, 8, 16])
        >>> mask = alibi.bias(8, 8) + torch.full((8, 8), float("-inf")).triu(1)
        >>> torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-5)
        True
    """
    layout.check_qkv(q, k, v)
    checks.check_choice(backend, "backend", BACKENDS)
    checks.check_bool(causal, "causal")
    b, h, lq, d = q.shape
    lk = k.shape[2]
    if causal and lq > lk:
        raise ValueError(
            f"causal attention needs q_len <= k_len (queries are the last keys); got "
            f"q_len={lq}, k_len={lk}"
        )
    scale = checks.check_number(
        1.0 / math.sqrt(d) if scale is None else scale, "scale", positive=True
    )
    given = _terms(bias, cope, log_fgate, terms)
    key_mask = None if attention_mask is None else layout.key_mask(attention_mask, b, lk, q.device)
    docs = layout.documents(cu_seqlens, document_ids, b, lk, q.device)
    offset = lk - lq
    positions = None if docs is None else docs[1]
    pair = None if rotary is None else layout.rotate(rotary, q, k, offset, positions)
    if pair is not None:
        q, k = pair.q, pair.k
    if chunk_size is not None:
        # after the rotation: chunks confine the keys as documents do, but restart no position
        docs = layout.chunks(docs, layout.check_chunk_size(chunk_size, lq, lk), lk, q.device)
    dtype = q.dtype
    # float16/bfloat16 stay as they are on the flex path only; their terms are float32
    work = torch.float32 if dtype in _LOW_PRECISION else dtype
    ctx = TermContext(
        b, h, d, lq, lk, scale, causal, work, q.device, key_mask,
        None if docs is None else docs[0], positions,
    )  # fmt: skip
    forms = [t.score_form(ctx) for t in given]
    reads = any(f.read is not None for f in forms)
    variants = pair is not None and pair.variants > 1
    if reads and q.shape[-1] != d:
        raise ValueError(
            f"a term that reads the scores (cope, a DAPE bias) reads q's {d} channels; the "
            f"rotation gives {q.shape[-1]}: use a rotation that keeps them"
        )
    if backend == "auto":
        # the compiled loop on CPU, FlexAttention elsewhere; a term that reads the
        # scores, or several query variants, have no FlexAttention form: the blockwise
        # path on every device
        on_cpu = q.device.type == "cpu"
        backend = "kernel" if on_cpu else "blockwise" if reads or variants else "flex"
    if reads:
        if backend == "flex":
            raise ValueError(
                "a term that reads the scores (cope, a DAPE bias) needs the blockwise torch "
                "path: backend must be one of ('auto', 'kernel', 'blockwise') ('kernel' falls "
                f"back to it); got {backend!r}"
            )
        # the other terms are read per block there: a scaled form is made per score instead
        plain = replace(ctx, pieces=False)
        forms = [
            t.score_form(plain) if f.operand == "pieces" else f
            for t, f in zip(given, forms, strict=True)
        ]
    mask = layout.Mask(causal, key_mask, offset, ctx.docs)
    plan, tensors = Plan.of(mask, scale, forms, pair)
    if backend == "flex" and b * h * v.shape[-1] > 0:
        return flex.attend(q, k, v, plan, tensors).to(dtype)
    q, k, v = q.to(work), k.to(work), v.to(work)
    if reads and not (backend == "kernel" and kernel.reads(plan, tensors, q, k, v)):
        # the checkpointed path, unless the reading term's operand has a loop that runs
        per_query = sum(f.row_values for f in forms)
        return checkpointed.attend(q, k, v, plan, tensors, per_query).to(dtype)
    if torch.compiler.is_compiling():
        # the compiled loop is opaque to the tracer: a graph break around it, and
        # autograd records it as in eager mode (CPU FlexAttention has no backward,
        # and inductor's CPU flex template cannot read a table made in the graph)
        return _eager_apply(q, k, v, plan, backend == "kernel", *tensors).to(dtype)
    out: torch.Tensor = SoftmaxAttention.apply(q, k, v, plan, backend == "kernel", *tensors)
    return out.to(dtype)


def _terms(bias: Any, cope: Any, log_fgate: Any, terms: Sequence[Any]) -> list[ScoreTerm]:
    """The call's score terms in order: cope, bias, the forget gates, then ``terms``.

    Raises:
        TypeError: a bias, cope or term of the wrong kind.
        ValueError: cope with a DAPE bias.
    """
    out: list[ScoreTerm] = []
    if cope is not None:
        if not isinstance(cope, CoPE):
            raise TypeError(f"cope must be a posenc.CoPE; got {type(cope).__name__}")
        if isinstance(bias, DAPE):
            raise ValueError("cope and a DAPE bias cannot be combined: pass one of them")
        out.append(cope)
    if bias is not None:
        if not isinstance(bias, AttentionBias | DAPE):
            raise TypeError(
                f"bias must be a posenc.bias.AttentionBias or a posenc.DAPE; "
                f"got {type(bias).__name__}"
            )
        out.append(bias)
    if log_fgate is not None:
        out.append(ForgetGateTerm(log_fgate))
    if isinstance(terms, ScoreTerm) or not isinstance(terms, Sequence):
        raise TypeError(f"terms must be a sequence of score terms; got {type(terms).__name__}")
    for n, term in enumerate(terms):
        if not isinstance(term, ScoreTerm):
            raise TypeError(
                f"terms[{n}] must have score_form(ctx) (posenc.families.terms.ScoreTerm); "
                f"got {type(term).__name__}"
            )
        out.append(term)
    return out


_DISABLED: list[Any] = []


def _eager_apply(*args: Any) -> torch.Tensor:
    """:class:`SoftmaxAttention` outside the tracer; ``torch.compiler.disable`` is made on
    the first compiled call, so a process that never compiles never imports dynamo."""
    if not _DISABLED:
        _DISABLED.append(torch.compiler.disable(SoftmaxAttention.apply))
    out: torch.Tensor = _DISABLED[0](*args)
    return out
