"""Context parallelism: which positions each rank holds, and ring attention across ranks.

Under context parallelism (ring attention) each of ``world_size`` ranks holds a
slice of the sequence: its queries, keys and values, and the position numbers they
were at in the whole sequence. An encoding applied on a shard is exact only with
those *global* positions; numbering a shard from 0 is the classic bug. This
module gives the positions, cuts tensors into shards and puts them back:

- ``layout="contiguous"``: the sequence cut into ``world_size`` chunks, rank ``r``
  holding chunk ``r``.
- ``layout="zigzag"``: the sequence cut into ``2 * world_size`` chunks, rank ``r``
  holding chunks ``r`` and ``2 * world_size - 1 - r``, in that order: Megatron-LM's
  load balancing for causal attention (``get_batch_on_this_cp_rank``) and the
  head-tail load balancer of ``torch.distributed.tensor.experimental.context_parallel``.
  Every rank then holds as many early as late queries, so the causal work is even.

Position-dependent values of every posenc encoding (sinusoidal rows, rotary cos/sin,
bias rows ``bias(q_pos, k_pos)``) are computed per position, so a shard with its
global positions gives exactly the rows of the unsharded computation. The exception
is a rotary schedule that depends on the length of the call (``dynamic`` NTK,
``longrope``: HF's ``dynamic_rope_update`` reads ``max(position_ids) + 1``): a shard
reaches a smaller maximum than the sequence, so its frequencies would differ per rank.
For those, compute cos/sin for the whole sequence and shard the rows, as Megatron's
``get_pos_emb_on_this_cp_rank`` does for every schedule::

    cos, sin = rope.cos_sin(torch.arange(seq_len))
    cos, sin = (shard(t, 0, world_size, rank, "zigzag") for t in (cos, sin))
    q, k = (apply_rotary(t, cos, sin, layout=rope.layout) for t in (q, k))

Shapes: any tensor, sharded along the ``dim`` that holds the sequence: ``-1`` for
``(seq,)``, ``(batch, seq)`` and M-RoPE's ``(3, batch, seq)`` position ids, ``-2``
for ``(batch, heads, seq, head_dim)`` queries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from posenc.core import checks
from posenc.families.bias.forms import pieces_block, table_block
from posenc.families.bias.modules import AttentionBias, NoPE
from posenc.families.terms import TermContext, TermForm
from posenc.integration.attention import softmax
from posenc.integration.attention.layout import Mask, Plan, check_qkv, rotate

__all__ = [
    "LAYOUTS",
    "gather",
    "ring_attention",
    "shard",
    "shard_positions",
    "unshard",
]

CpLayout = Literal["contiguous", "zigzag"]
#: the ways a sequence is cut among ranks (see the module docstring)
LAYOUTS: tuple[str, ...] = ("contiguous", "zigzag")


def _chunks(world_size: Any, rank: Any, layout: Any) -> tuple[int, tuple[int, ...]]:
    """``(number of chunks, the chunks rank holds in order)`` of a layout, checked."""
    world_size = checks.check_int(world_size, "world_size", minimum=1)
    rank = checks.check_int(rank, "rank")
    if rank >= world_size:
        raise ValueError(f"rank must lie in [0, world_size={world_size}); got {rank}")
    checks.check_choice(layout, "layout", LAYOUTS)
    if layout == "contiguous":
        return world_size, (rank,)
    return 2 * world_size, (rank, 2 * world_size - 1 - rank)


def _chunk_size(seq_len: int, chunks: int, layout: str, name: str) -> int:
    """The length of one chunk; a length that does not divide says how much to pad."""
    if seq_len % chunks:
        pad = -seq_len % chunks
        raise ValueError(
            f"{name} = {seq_len} must be a multiple of {chunks} to shard it "
            f"{layout!r} ({chunks} equal chunks); pad it by {pad} to {seq_len + pad}"
        )
    return seq_len // chunks


def _seq_dim(x: torch.Tensor, dim: Any, name: str) -> int:
    """``dim`` as a non-negative axis of ``x``."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int; got {type(dim).__name__} {dim!r}")
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(
            f"dim must be an axis of {name} (shape {tuple(x.shape)}), in [{-x.ndim}, "
            f"{x.ndim}); got {dim}"
        )
    return dim % x.ndim


def shard_positions(
    seq_len: int,
    world_size: int,
    rank: int,
    layout: CpLayout = "contiguous",
    *,
    device: Any = None,
) -> torch.Tensor:
    """The global positions of the tokens rank ``rank`` holds, in its order.

    ``shard(torch.arange(seq_len), -1, world_size, rank, layout)``: with ``seq_len =
    8``, two ranks and ``"zigzag"``, rank 0 holds ``[0, 1, 6, 7]`` and rank 1 ``[2, 3,
    4, 5]``. Pass these to the encodings of the rank's tokens (``positions=`` of
    :class:`posenc.Rotary` and :class:`posenc.SinusoidalEmbedding`, the query rows of
    a bias module).

    Args:
        seq_len: the length of the whole sequence.
        world_size: ranks sharing it (the context-parallel group's size).
        rank: this rank, ``0 <= rank < world_size``.
        layout: ``"contiguous"`` or ``"zigzag"`` (see the module docstring).
        device: where the positions go (CPU by default).

    Returns:
        int64 ``(seq_len // world_size,)``.

    Raises:
        TypeError: non-int sizes.
        ValueError: ``rank`` outside ``[0, world_size)``, an unknown ``layout``,
            ``seq_len`` not a multiple of ``world_size`` (``2 * world_size`` for
            ``"zigzag"``), saying how much padding makes it one; ``seq_len`` above
            ``2**31``, where posenc's encodings are exact.

    Examples:
        >>> import torch
        >>> import posenc
        >>> from posenc.context_parallel import shard, shard_positions
        >>> positions = shard_positions(8, 2, 0, "zigzag")  # rank 0 of 2
        >>> positions.tolist()
        [0, 1, 6, 7]
        >>> q, k = torch.randn(2, 1, 2, 8, 16)  # (batch, heads, seq, head_dim) each
        >>> rope = posenc.Rotary(16)
        >>> q0, k0 = rope(*(shard(t, -2, 2, 0, "zigzag") for t in (q, k)), positions=positions)
        >>> torch.equal(q0, shard(rope(q, k)[0], -2, 2, 0, "zigzag"))  # its rows of the whole
        True
    """
    seq_len = checks.check_int(seq_len, "seq_len")
    checks.check_exact(0, seq_len - 1, "positions 0 .. seq_len - 1")
    count, held = _chunks(world_size, rank, layout)
    size = _chunk_size(seq_len, count, layout, "seq_len")
    where = torch.device("cpu") if device is None else checks.check_device(device)
    index = torch.arange(size, dtype=torch.int64, device=where)
    return torch.cat([index + c * size for c in held])


def shard(
    x: torch.Tensor, dim: int, world_size: int, rank: int, layout: CpLayout = "contiguous"
) -> torch.Tensor:
    """Rank ``rank``'s slice of ``x`` along the sequence dim ``dim``.

    The tokens at :func:`shard_positions` (a view for ``"contiguous"``, a copy for
    ``"zigzag"``).

    Args:
        x: any tensor holding the sequence along ``dim``: position ids (``-1``, also
            M-RoPE's ``(3, batch, seq)``), hidden states, queries, cos/sin tables.
        dim: the sequence dim.
        world_size: ranks sharing the sequence.
        rank: this rank.
        layout: ``"contiguous"`` or ``"zigzag"``.

    Returns:
        ``x`` with ``x.shape[dim] // world_size`` tokens along ``dim``.

    Raises:
        TypeError: ``x`` not a tensor, non-int ``dim`` or sizes.
        ValueError: ``dim`` not an axis of ``x``, bad ``rank`` or ``layout``,
            ``x.shape[dim]`` not a multiple of the chunk count (naming the padding).

    Examples:
        >>> import torch
        >>> from posenc.context_parallel import shard
        >>> tokens = torch.arange(8)
        >>> [shard(tokens, -1, 2, rank, "zigzag").tolist() for rank in range(2)]
        [[0, 1, 6, 7], [2, 3, 4, 5]]
        >>> shard(torch.randn(1, 2, 8, 16), -2, 4, 0).shape  # rank 0 of 4: its queries
        torch.Size([1, 2, 2, 16])
    """
    if not checks.is_torch(x):
        raise TypeError(f"x must be a torch tensor; got {type(x).__name__}")
    axis = _seq_dim(x, dim, "x")
    count, held = _chunks(world_size, rank, layout)
    size = _chunk_size(x.shape[axis], count, layout, f"x.shape[{dim}]")
    parts = [x.narrow(axis, c * size, size) for c in held]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=axis)


def unshard(
    shards: Sequence[torch.Tensor], dim: int, layout: CpLayout = "contiguous"
) -> torch.Tensor:
    """The whole sequence from the shards of every rank, in rank order.

    The inverse of :func:`shard`: ``unshard([shard(x, d, w, r, layout) for r in
    range(w)], d, layout)`` is ``x``.

    Args:
        shards: one tensor per rank (``world_size`` of them), all of one shape.
        dim: the sequence dim.
        layout: the layout they were sharded with.

    Returns:
        The tensor of ``len(shards) * shards[0].shape[dim]`` tokens along ``dim``.

    Raises:
        TypeError: ``shards`` not a sequence of tensors, non-int ``dim``.
        ValueError: no shards, shards of different shapes, ``dim`` not an axis, an
            unknown ``layout``, an odd shard length for ``"zigzag"`` (two chunks each).

    Examples:
        >>> import torch
        >>> from posenc.context_parallel import shard, unshard
        >>> hidden = torch.randn(1, 8, 32)  # (batch, seq, hidden)
        >>> shards = [shard(hidden, 1, 4, rank, "zigzag") for rank in range(4)]
        >>> shards[0].shape
        torch.Size([1, 2, 32])
        >>> torch.equal(unshard(shards, 1, "zigzag"), hidden)
        True
    """
    if not isinstance(shards, Sequence) or not all(checks.is_torch(s) for s in shards):
        raise TypeError("shards must be a list of tensors, one per rank")
    if not shards:
        raise ValueError("shards must hold one tensor per rank; got none")
    shapes = {tuple(s.shape) for s in shards}
    if len(shapes) != 1:
        raise ValueError(f"shards must all have one shape; got {sorted(shapes)}")
    axis = _seq_dim(shards[0], dim, "shards[0]")
    world_size = len(shards)
    count, _ = _chunks(world_size, 0, layout)
    per_rank = count // world_size
    size = _chunk_size(shards[0].shape[axis], per_rank, layout, f"shards[0].shape[{dim}]")
    chunks: list[torch.Tensor | None] = [None] * count
    for r, s in enumerate(shards):
        for i, c in enumerate(_chunks(world_size, r, layout)[1]):
            chunks[c] = s.narrow(axis, i * size, size)
    return torch.cat([c for c in chunks if c is not None], dim=axis)


def gather(
    x_local: torch.Tensor, dim: int, layout: CpLayout = "contiguous", group: Any = None
) -> torch.Tensor:
    """The whole sequence from every rank's shard: an all-gather, then :func:`unshard`.

    A collective: every rank of ``group`` calls it with its shard (of one shape) and
    gets the same whole tensor. Not differentiable (``torch.distributed.all_gather``);
    for gradients gather with ``torch.distributed.nn.functional.all_gather`` and
    :func:`unshard` the result.

    Args:
        x_local: this rank's shard.
        dim: the sequence dim.
        layout: the layout of the shards.
        group: the context-parallel process group; the default group when None.

    Raises:
        ValueError: ``torch.distributed`` not available or not initialised (no
            ``group`` to gather over); as :func:`unshard`.
        TypeError: ``x_local`` not a tensor.

    Examples:
        >>> import torch
        >>> import torch.distributed as dist
        >>> from posenc.context_parallel import gather, shard_positions
        >>> # torchrun starts one process per rank; here one process is the whole group
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> world, rank = dist.get_world_size(), dist.get_rank()
        >>> local = shard_positions(8, world, rank, "zigzag")  # this rank's positions
        >>> gather(local, -1, "zigzag").tolist()  # every rank's, in sequence order
        [0, 1, 2, 3, 4, 5, 6, 7]
        >>> dist.destroy_process_group()
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "group: torch.distributed is not initialised, so there is no process group to "
            "gather over; call torch.distributed.init_process_group first, or unshard a "
            "list of every rank's shard"
        )
    if not checks.is_torch(x_local):
        raise TypeError(f"x_local must be a torch tensor; got {type(x_local).__name__}")
    _seq_dim(x_local, dim, "x_local")
    checks.check_choice(layout, "layout", LAYOUTS)
    x_local = x_local.contiguous()
    out = [torch.empty_like(x_local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, x_local, group=group)
    return unshard(out, dim, layout)


# ---------------------------------------------------------------- ring attention
# The key/value blocks travel round the ring, rank r sending to r + 1 while it attends
# to the block it holds; the partial results merge by their log-sum-exp, as flash
# attention merges its own blocks (Liu et al. 2023, "Ring Attention with Blockwise
# Transformers"). The backward passes the blocks round again, each with its key and
# value gradients, which arrive home after W steps.


@dataclass(frozen=True)
class _Ring:
    """What the autograd function needs besides the tensors it tracks."""

    group: Any
    world: int
    rank: int
    layout: str
    seq_len: int  # the whole sequence's
    causal: bool
    scale: float
    form: str | None  # "table", "pieces" or None (no bias)
    knots: torch.Tensor | None


def _held(seq_len: int, world: int, rank: int, layout: str) -> list[tuple[int, int, int]]:
    """``(global start, length, local start)`` of each chunk a rank holds, in its order."""
    if layout == "contiguous":
        n = seq_len // world
        return [(rank * n, n, 0)]
    n = seq_len // (2 * world)
    return [(rank * n, n, 0), ((2 * world - 1 - rank) * n, n, n)]


def _pairs(ring: _Ring, src: int) -> list[tuple[tuple[int, int, int], tuple[int, int, int]]]:
    """The (query chunk, key chunk) pairs of this rank against rank ``src``'s block."""
    out = []
    for qc in _held(ring.seq_len, ring.world, ring.rank, ring.layout):
        for kc in _held(ring.seq_len, ring.world, src, ring.layout):
            if ring.causal and kc[0] > qc[0] + qc[1] - 1:
                continue  # every key after every query: fully masked
            out.append((qc, kc))
    return out


def _plan(
    ring: _Ring, tensors: Sequence[torch.Tensor], qc: tuple[int, int, int], kc: tuple[int, int, int]
) -> tuple[Plan, tuple[torch.Tensor, ...], slice]:
    """The plan of one pair, its slices of the bias tensors, and the table slice."""
    (a, m, qa), (c, mk, _) = qc, kc
    offset = a - c  # query i of the chunk sits at key position i + offset
    base = m - 1 + offset  # the pair's table index of distance 0
    start = ring.seq_len - 1 - base  # its first entry in the sequence's table
    span = slice(start, start + m + mk - 1)
    forms: tuple[TermForm, ...] = ()
    params: tuple[torch.Tensor, ...] = ()
    if ring.form == "table":
        forms, params = (
            (TermForm(block=table_block(base), operand="table"),),
            (tensors[0][:, span],),
        )
    elif ring.form == "pieces":
        assert ring.knots is not None
        table, row_scale, slopes, intercepts = tensors
        block = pieces_block(base, offset, ring.knots)
        forms = (TermForm(block=block, operand="pieces", knots=ring.knots),)
        params = (table[span], row_scale[qa : qa + m], slopes, intercepts)
    sizes = (len(params),) if forms else ()
    plan = Plan(Mask(ring.causal, None, offset), ring.scale, forms, sizes)
    return plan, params, span


def _exchange(ring: _Ring, send: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], Any]:
    """Start sending ``send`` to the next rank and receiving as much from the previous."""
    import torch.distributed as dist

    received = [torch.empty_like(t) for t in send]
    nxt, prev = (ring.rank + 1) % ring.world, (ring.rank - 1) % ring.world
    to_next = dist.get_global_rank(ring.group, nxt) if ring.group is not None else nxt
    from_prev = dist.get_global_rank(ring.group, prev) if ring.group is not None else prev
    ops = [dist.P2POp(dist.isend, t, to_next, ring.group) for t in send]
    ops += [dist.P2POp(dist.irecv, t, from_prev, ring.group) for t in received]
    return received, dist.batch_isend_irecv(ops)


def _wait(requests: Any) -> None:
    for request in requests:
        request.wait()


def _merge(
    out: torch.Tensor, lse: torch.Tensor, part: torch.Tensor, part_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two softmax results over disjoint keys as one: weighted by their log-sum-exps."""
    top = torch.maximum(lse, part_lse)
    top = torch.where(torch.isinf(top) & (top < 0), torch.zeros_like(top), top)  # none seen
    w_old, w_new = torch.exp(lse - top), torch.exp(part_lse - top)
    total = w_old + w_new
    merged = (out * w_old[..., None] + part * w_new[..., None]) / torch.where(
        total == 0, torch.ones_like(total), total
    )[..., None]
    return merged, top + torch.log(total)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        ring: _Ring,
        *tensors: torch.Tensor,
    ) -> torch.Tensor:
        b, h, n, _ = q.shape
        out = q.new_zeros((b, h, n, v.shape[-1]))
        lse = q.new_full((b, h, n), float("-inf"))
        block = [k.contiguous(), v.contiguous()]
        kernel = True
        for step in range(ring.world):
            src = (ring.rank - step) % ring.world
            pending = _exchange(ring, block) if step < ring.world - 1 else None
            kb, vb = block
            for qc, kc in _pairs(ring, src):
                plan, params, _ = _plan(ring, tensors, qc, kc)
                qs, ks = slice(qc[2], qc[2] + qc[1]), slice(kc[2], kc[2] + kc[1])
                args = (plan, params, q[:, :, qs], kb[:, :, ks], vb[:, :, ks])
                part, part_lse, used = softmax.forward_block(*args, True)
                kernel = kernel and used
                out[:, :, qs], lse[:, :, qs] = _merge(out[:, :, qs], lse[:, :, qs], part, part_lse)
            if pending is not None:
                _wait(pending[1])
                block = pending[0]
        ctx.ring, ctx.kernel = ring, kernel
        ctx.save_for_backward(q, k, v, out, lse, *tensors)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        ring: _Ring = ctx.ring
        q, k, v, out, lse, *tensors = ctx.saved_tensors
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)
        wanted = [t.requires_grad for t in tensors]
        dq = torch.zeros_like(q)
        dtensors = [torch.zeros_like(t) for t in tensors]
        block = [k.contiguous(), v.contiguous()]
        dblock = [torch.zeros_like(block[0]), torch.zeros_like(block[1])]
        for step in range(ring.world):
            src = (ring.rank - step) % ring.world
            pending = _exchange(ring, block) if step < ring.world - 1 else None
            kb, vb = block
            for qc, kc in _pairs(ring, src):
                plan, params, span = _plan(ring, tensors, qc, kc)
                qs, ks = slice(qc[2], qc[2] + qc[1]), slice(kc[2], kc[2] + kc[1])
                rows = (lse[:, :, qs].contiguous(), dout[:, :, qs], delta[:, :, qs].contiguous())
                args = (plan, params, wanted, q[:, :, qs], kb[:, :, ks], vb[:, :, ks], *rows)
                grads = softmax.backward_block(*args, ctx.kernel)
                dq_part, dk_part, dv_part = grads[:3]
                assert dq_part is not None and dk_part is not None and dv_part is not None
                dq[:, :, qs] += dq_part
                dblock[0][:, :, ks] += dk_part
                dblock[1][:, :, ks] += dv_part
                _add_bias_grads(ring, dtensors, grads[3:], qc, span)
            # the block's gradients travel with it; after the last step they go home
            moved, requests = _exchange(ring, dblock)
            if pending is not None:
                _wait(pending[1])
                block = pending[0]
            _wait(requests)
            dblock = moved
        return (
            dq,
            dblock[0],
            dblock[1],
            None,
            *(g if w else None for g, w in zip(dtensors, wanted, strict=True)),
        )


def _add_bias_grads(
    ring: _Ring,
    dtensors: list[torch.Tensor],
    grads: Sequence[torch.Tensor | None],
    qc: tuple[int, int, int],
    span: slice,
) -> None:
    """Add one pair's gradients of its slices into those of the whole tensors."""
    if ring.form == "table" and grads and grads[0] is not None:
        dtensors[0][:, span] += grads[0]
    elif ring.form == "pieces":
        rows = slice(qc[2], qc[2] + qc[1])
        for index, where in enumerate((span, rows, slice(None), slice(None))):
            g = grads[index] if index < len(grads) else None
            if g is not None:
                dtensors[index][..., where] += g


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: Any = None,
    layout: CpLayout = "contiguous",
    bias: AttentionBias | None = None,
    rotary: Any = None,
    causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """:func:`posenc.attention` of this rank's shard over a sequence sharded across ranks.

    Ring attention: every rank of ``group`` holds one shard of the sequence (its
    tokens in ``layout`` order, as :func:`shard` cuts them) and gets its rows of
    softmax attention over the whole sequence, forward and backward. The
    key/value blocks pass round the ring through ``torch.distributed``'s
    ``batch_isend_irecv`` (gloo on CPU, nccl on GPU) while each rank attends to
    the block it holds; partial results merge by their log-sum-exp. Each pair of
    a query chunk and a key chunk is one call of posenc's compiled loop (or its
    blockwise torch path) at the chunks' global positions; under a causal mask a
    pair whose keys all follow its queries is skipped (``"zigzag"`` balances what
    is left). Rotary encodings rotate at global positions, a bias of ``key -
    query`` is one table over the sequence's ``2 S - 1`` relative positions, and
    FIRE's pieces are the sequence's. Memory per rank is linear in its shard.

    The bias parameters' gradients are this rank's share: sum them over the
    group (DDP over ranks that include the group does, up to its averaging).

    Args:
        q: ``(batch, heads, n, head_dim)``: this rank's ``n`` queries.
        k, v: ``(batch, kv_heads, n, dim)``: its keys and values (every rank the
            same ``n``; the sequence is ``n * world_size`` long).
        group: the process group; the default group when None.
        layout: ``"contiguous"`` or ``"zigzag"``.
        bias, rotary, causal, scale: as :func:`posenc.attention`.

    Raises:
        ValueError: torch.distributed not initialised (naming ``group``); an
            unknown layout; a shard that is not whole chunks (saying the padding
            needed); the checks of :func:`posenc.attention`.

    Examples:
        >>> import torch
        >>> import torch.distributed as dist
        >>> import posenc
        >>> from posenc.context_parallel import gather, ring_attention, shard
        >>> # torchrun starts one process per rank; here one process is the whole group
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> world, rank = dist.get_world_size(), dist.get_rank()
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 8, 16)  # the whole sequence, on every rank
        >>> local = [shard(t, -2, world, rank, "zigzag") for t in (q, k, v)]
        >>> out = ring_attention(*local, layout="zigzag", causal=True, bias=posenc.ALiBi(2))
        >>> whole = posenc.attention(q, k, v, causal=True, bias=posenc.ALiBi(2))
        >>> torch.allclose(gather(out, -2, "zigzag"), whole, atol=1e-6)
        True
        >>> dist.destroy_process_group()
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "group: torch.distributed is not initialised (call init_process_group first)"
        )
    checks.check_choice(layout, "layout", LAYOUTS)
    checks.check_bool(causal, "causal")
    check_qkv(q, k, v)
    n = q.shape[2]
    if k.shape[2] != n:
        raise ValueError(
            f"q, k and v are one shard of a sequence: equal lengths; got q_len={n}, "
            f"k_len={k.shape[2]}"
        )
    if bias is not None:
        if not isinstance(bias, AttentionBias):
            raise TypeError(f"bias must be a posenc.bias.AttentionBias; got {type(bias).__name__}")
        if bias.num_heads != q.shape[1]:
            raise ValueError(f"bias has {bias.num_heads} heads; q has {q.shape[1]}")
    scale = checks.check_number(
        1.0 / math.sqrt(q.shape[-1]) if scale is None else scale, "scale", positive=True
    )
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if layout == "zigzag" and n % 2:
        raise ValueError(
            f"a zigzag shard holds two equal chunks: n = {n} per rank must be even; pad "
            f"the sequence to a multiple of {2 * world}"
        )
    seq_len = n * world
    positions = shard_positions(seq_len, world, rank, layout, device=q.device)
    if rotary is not None:
        # the shard's global positions; one launch for q and k on CUDA
        pair = rotate(rotary, q, k, 0, positions[None])
        if pair.choose is not None:
            raise ValueError(
                f"ring attention scores one query per pair; this rotation gives {pair.variants} "
                "query variants (use posenc.attention on the whole sequence)"
            )
        q, k = pair.q, pair.k
    dtype = q.dtype
    if dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()
    form, knots, tensors = _bias_tensors(bias, q.shape[1], seq_len, positions, scale, q.dtype)
    ring = _Ring(group, world, rank, layout, seq_len, causal, scale, form, knots)
    out: torch.Tensor = _RingAttention.apply(q, k, v, ring, *tensors)
    return out.to(dtype)


def _bias_tensors(
    bias: AttentionBias | None,
    heads: int,
    seq_len: int,
    positions: torch.Tensor,
    scale: float,
    dtype: torch.dtype,
) -> tuple[str | None, torch.Tensor | None, tuple[torch.Tensor, ...]]:
    """The bias over the whole sequence: a table of its ``2 S - 1`` relative positions, or
    FIRE's pieces with the scales of this rank's queries."""
    if bias is None or isinstance(bias, NoPE):
        return None, None, ()
    if bias.relative or bias.relative_below() > seq_len - 1:
        ctx = TermContext(1, heads, 1, seq_len, seq_len, scale, False, dtype, positions.device)
        return "table", None, bias.score_form(ctx).tensors
    rel = torch.arange(-(seq_len - 1), seq_len, device=positions.device)
    found = bias.scaled_form(positions, rel)
    if found is None:
        raise ValueError(
            f"bias: {type(bias).__name__} depends on the query position beyond key - query "
            "and has no scaled form here (non-finite parameters?); ring attention needs one"
        )
    factor = scale if bias.scale_with_logits else 1.0
    slopes, intercepts = found.slopes.to(dtype) * factor, found.intercepts.to(dtype) * factor
    tensors = (found.table.to(dtype), found.scale.to(dtype), slopes, intercepts)
    return "pieces", found.knots.detach().to(dtype), tensors
