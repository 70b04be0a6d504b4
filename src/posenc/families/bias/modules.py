"""Attention-bias modules: ALiBi, T5, KERPLE, FIRE, Sandwich and NoPE.

Every module is an :class:`AttentionBias`: ``module(q_pos, k_pos)`` gives the
bias ``(heads, *broadcast(q_pos, k_pos).shape)`` that is added to the scaled
scores ``q . k * scale`` of a query at position ``q_pos`` and a key at
``k_pos``; ``module.bias(q_len, k_len)`` is the dense ``(heads, q_len, k_len)``
block for inspection and tests, queries aligned bottom-right (query ``i`` sits
at key position ``i + k_len - q_len``, right for a KV cache), and the relative
position is ``key - query`` as in HF T5. Modules whose bias depends on
``key - query`` only (all but FIRE) say so with ``relative = True`` and give
``module.relative_bias(rel)``; :func:`posenc.attention` then evaluates them once
per call over the ``q_len + k_len - 1`` relative positions instead of per score.
FIRE's bias depends on ``key - query`` only for queries up to its threshold
``L`` (:meth:`AttentionBias.relative_below`): those queries take the same table.
Beyond it FIRE gives a :class:`ScaledForm` (:meth:`AttentionBias.scaled_form`):
its MLP as linear pieces of a table over ``key - query`` times a scale per query,
which the compiled attention loop evaluates per score.

Each class docstring cites its paper and the implementation it matches. Learned parameters are
ordinary ``nn.Parameter`` and train through :func:`posenc.attention`. Fixed
tensors (ALiBi's slopes, T5's bucket boundaries, Sandwich's frequencies) are
non-persistent buffers that every module rebuilds from their definition
whenever it is moved or cast, so a module built on the ``meta`` device and
materialised with ``to_empty()`` (deferred initialisation, as HF's and FSDP's
loaders do) holds exact values, not uninitialised memory.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from posenc.core import checks
from posenc.core.buffers import DerivedBuffers
from posenc.families.bias.forms import ScaledForm, pieces_form, table_form
from posenc.families.bias.functional import alibi_slopes, bucket_torch, t5_boundaries
from posenc.families.terms import AddMod, TermContext, TermForm


def _check_heads(num_heads: Any) -> int:
    """An int >= 1 of at most :data:`posenc.core.checks.MAX_ELEMENTS`: every module holds
    (or makes) a table of one value per head, refused before it is allocated."""
    n = checks.check_int(num_heads, "num_heads", minimum=1)
    checks.check_elements(n, f"a table of one value per head, num_heads={n},")
    return n


def relu_pieces(
    first: nn.Linear, last: nn.Linear, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The MLP ``last(relu(first(x)))`` of a scalar ``x`` in ``[low, high]`` as linear pieces.

    Each hidden unit ``u`` bends at ``x = -b_u / w_u``; the bends strictly inside
    ``(low, high)`` are the knots, and on each piece the active units are those
    positive at its midpoint, so ``slope = W2 diag(active) w`` and ``intercept =
    W2 diag(active) b + b2``, computed in float64 from the parameters (their
    gradients included). Outside ``[low, high]`` the pieces extend the end ones,
    which is right only for inputs inside it.

    Returns:
        ``knots (n,)`` ascending and detached; ``slopes`` and ``intercepts``
        ``(out_features, n + 1)``; in the parameters' dtype.
    """
    w, b = first.weight[:, 0], first.bias
    with torch.no_grad():
        bends = -b / w  # +-inf (no bend) where w = 0, NaN where b = w = 0
        knots = bends[(bends > low) & (bends < high)].sort().values
        edges = torch.cat((knots.new_tensor([low]), knots, knots.new_tensor([high]))).double()
        mids = (edges[:-1] + edges[1:]) / 2  # inside each piece: no bend between it and x
        active = (w.double()[None, :] * mids[:, None] + b.double()[None, :] > 0).double()
    w2 = last.weight.double()
    slopes = (active * w.double()) @ w2.T
    intercepts = (active * b.double()) @ w2.T + last.bias.double()
    return knots, slopes.T.to(w.dtype), intercepts.T.to(w.dtype)


class AttentionBias(DerivedBuffers):
    """Base of the bias modules: a bias per head for each (query, key) position pair.

    Subclasses set ``num_heads`` and implement :meth:`relative_bias` (when
    ``relative``) or override :meth:`forward`; their fixed tensors and the drawing
    of their own parameters follow :class:`posenc.core.buffers.DerivedBuffers`
    (``_derived_buffers``, ``_init_parameters``, ``reset_parameters`` at the end of
    ``__init__``).

    Attributes:
        num_heads: heads the bias has; :func:`posenc.attention` checks q against it.
        relative: the bias depends on ``key - query`` only.
        scale_with_logits: the bias is multiplied by the attention scale along with
            ``q . k`` (Falcon's ALiBi) instead of added after it (the paper, BLOOM,
            MPT, T5).

    Examples:
        >>> import torch
        >>> import posenc
        >>> class Distance(posenc.AttentionBias):  # -|key - query| in every head
        ...     def __init__(self, num_heads):
        ...         super().__init__()
        ...         self.num_heads = num_heads
        ...         self.reset_parameters()
        ...     def relative_bias(self, rel):
        ...         return (-rel.abs()).float().expand(self.num_heads, *rel.shape)
        >>> Distance(2).bias(2, 3)[0]  # 2 queries, the last of 3 keys, bottom-right aligned
        tensor([[-1.,  0., -1.],
                [-2., -1.,  0.]])
        >>> q = k = v = torch.ones(1, 2, 3, 4)
        >>> posenc.attention(q, k, v, bias=Distance(2), causal=True).shape
        torch.Size([1, 2, 3, 4])
    """

    num_heads: int
    relative: bool = True
    scale_with_logits: bool = False

    def relative_bias(self, rel: torch.Tensor) -> torch.Tensor:
        """The bias ``(heads, *rel.shape)`` of integer relative positions ``key - query``.

        For a bias that is not ``relative``, the bias of queries at positions below
        :meth:`relative_below`.

        Raises:
            ValueError: a bias of more than :data:`posenc.core.checks.MAX_ELEMENTS`
                values (refused before any work).
        """
        raise NotImplementedError

    def relative_below(self) -> float:
        """The query position below which the bias depends on ``key - query`` only.

        ``inf`` for a ``relative`` bias, ``-inf`` for one that never does;
        FIRE's threshold ``L``, below which its normaliser is constant (at ``L``
        itself the value is too, but ``max(L, i)`` splits its gradient).
        """
        return math.inf if self.relative else -math.inf

    def scaled_form(self, q_pos: torch.Tensor, rel: torch.Tensor) -> ScaledForm | None:
        """The bias of queries ``q_pos`` (1-D) and relative positions ``rel`` (1-D) in pieces.

        None for a bias that has no such form (the default), or whose parameters
        are not finite; :func:`posenc.attention` then evaluates it per block.
        """
        return None

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """The bias ``(heads, *broadcast_shape)`` of integer query and key positions.

        Raises:
            ValueError: a bias of more than :data:`posenc.core.checks.MAX_ELEMENTS`
                values (refused before any work).
        """
        self._check_size("q_pos and k_pos broadcast to", q_pos.shape, k_pos.shape)
        return self.relative_bias(k_pos - q_pos)

    def _check_size(self, names: str, *shapes: Sequence[int]) -> None:
        """Refuse a bias ``(heads, *broadcast(shapes))`` of more than
        :data:`posenc.core.checks.MAX_ELEMENTS` values, from the shapes alone (no sync).

        A few microseconds on every call (``torch.broadcast_shapes`` costs ten times
        more); not while ``torch.compile`` traces (a score mod sees 0-d positions).
        """
        if torch.compiler.is_compiling():
            return
        # broadcast: per trailing dim, the size that is not 1 (shapes that do not
        # broadcast fail in the arithmetic that follows, as before)
        dims = itertools.zip_longest(*(reversed(s) for s in shapes), fillvalue=1)
        shape = tuple(next((d for d in ds if d != 1), 1) for ds in dims)[::-1]
        count = self.num_heads * math.prod(shape)
        if count > checks.MAX_ELEMENTS:  # the message only when it is needed
            checks.check_elements(
                count, f"the bias of num_heads={self.num_heads} x {names} {shape}"
            )

    def score(self, head: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """The bias of one head for one (query, key) pair, all 0-d tensors.

        What a FlexAttention score mod calls (element by element, compiled);
        :func:`posenc.attention` uses it for biases that are not ``relative``.
        """
        return self(q_pos, k_pos)[head]

    def bias(self, q_len: int, k_len: int) -> torch.Tensor:
        """The dense ``(heads, q_len, k_len)`` bias, queries aligned bottom-right.

        Query ``i`` sits at key position ``i + k_len - q_len``; the bias is the
        one added to the scaled scores (before the attention scale when
        ``scale_with_logits``).

        Raises:
            ValueError: lengths not ints >= 1, or ``q_len > k_len``; a bias of more
                than :data:`posenc.core.checks.MAX_ELEMENTS` values (refused before
                any work).
        """
        q_len = checks.check_int(q_len, "q_len", minimum=1)
        k_len = checks.check_int(k_len, "k_len", minimum=1)
        if q_len > k_len:
            raise ValueError(
                f"q_len ({q_len}) must be <= k_len ({k_len}): queries are the last keys"
            )
        checks.check_elements(
            self.num_heads * q_len * k_len,
            f"the bias of num_heads={self.num_heads} x q_len={q_len} x k_len={k_len}",
        )
        device = self._device()
        q_pos = torch.arange(k_len - q_len, k_len, device=device)
        return self(q_pos[:, None], torch.arange(k_len, device=device)[None, :])

    def score_form(self, ctx: TermContext) -> TermForm:
        """The bias as a score term (:class:`posenc.families.terms.ScoreTerm`).

        A bias of ``key - query`` (and FIRE's queries below its threshold) is a
        table over the call's relative positions; FIRE past it, its scaled form
        (when ``ctx.pieces`` allows and every row has the same documents); any
        other bias is evaluated per block by the module itself, at positions
        within documents where the call is packed. Values are cast to
        ``ctx.dtype`` and multiplied by the scale when ``scale_with_logits``.

        Raises:
            ValueError: ``num_heads`` not the call's heads, or a table or scaled
                form of the wrong shape.
        """
        if self.num_heads != ctx.heads:
            raise ValueError(f"bias has {self.num_heads} heads; q has {ctx.heads}")
        factor = ctx.scale if self.scale_with_logits else 1.0
        rel = torch.arange(-(ctx.k_len - 1), ctx.q_len, device=ctx.device)
        if self.relative or self.relative_below() > ctx.k_len - 1:
            table = self.relative_bias(rel).to(ctx.dtype)
            return table_form(table * factor if factor != 1.0 else table, ctx, type(self).__name__)
        rows = ctx.positions
        queries = torch.arange(ctx.offset, ctx.k_len, device=ctx.device)
        if ctx.pieces and (rows is None or rows.shape[0] == 1):
            form = self.scaled_form(queries if rows is None else rows[0][queries], rel)
            if form is not None:
                return pieces_form(form, ctx, factor)
        return self._per_score(ctx, factor)

    def _per_score(self, ctx: TermContext, factor: float) -> TermForm:
        """The module evaluated per block (and per score on FlexAttention)."""
        own = {n: p for n, p in self.named_parameters() if p.requires_grad}
        names, tensors = tuple(own), tuple(own.values())
        rows, dtype = ctx.positions, ctx.dtype

        def block(
            params: Sequence[torch.Tensor], q_pos: torch.Tensor, k_pos: torch.Tensor
        ) -> torch.Tensor:
            call = dict(zip(names, params, strict=True))
            if rows is None:
                out = torch.func.functional_call(self, call, (q_pos[:, None], k_pos[None, :]))
            else:  # positions within documents, per row: (heads, rows, n, m) -> rows first
                qp, kp = rows[:, q_pos, None], rows[:, None, k_pos]
                out = torch.func.functional_call(self, call, (qp, kp)).movedim(1, 0)
            out = out.to(dtype)
            return out * factor if factor != 1.0 else out

        offset = torch.full((), ctx.offset, device=ctx.device)
        times = torch.full((), factor, dtype=dtype, device=ctx.device)
        where = torch.arange(ctx.k_len, device=ctx.device)[None] if rows is None else rows
        single = where.shape[0] == 1

        def flex(_: Sequence[torch.Tensor]) -> AddMod:
            def add(bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
                row = 0 if single else bi
                return self.score(hi, where[row, qi + offset], where[row, ki]) * times

            return add

        return TermForm(tensors, block, flex)

    def _device(self) -> torch.device:
        for t in [*self.parameters(), *self.buffers()]:
            return t.device
        return torch.device("cpu")

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


class ALiBi(AttentionBias):
    """ALiBi (Press et al. 2022): a per-head linear penalty on the distance.

    ``bias = slope_h * (key - query)``, i.e. ``-slope_h (i - j)`` for keys at
    or before the query: the paper's causal form, to be used with a causal
    mask (BLOOM's and the official code's ``+slope * j`` differ from it by a
    per-row constant, the same after softmax under that mask). ``symmetric``
    gives ``-slope_h |i - j|`` (x-transformers' ``AlibiPositionalBias``,
    bidirectional encoders). Distances are measured bottom-right aligned,
    as flash-attn does, so a KV cache (fewer queries than keys) gets the
    right ones (keras-hub #2861).

    Args:
        num_heads: heads; slopes from :func:`posenc.alibi_slopes`.
        symmetric: ``-slope |i - j|`` instead of the causal form.
        max_bias: the slope exponent scale (8 in the paper; MPT's
            ``alibi_bias_max``).
        scale_with_logits: multiply the bias by the attention scale along with
            ``q . k`` (Falcon); False adds it unscaled (paper, BLOOM, MPT).

    Raises:
        ValueError: ``num_heads`` below 1 or above
            :data:`posenc.core.checks.MAX_ELEMENTS` (refused before any work).

    Examples:
        >>> import torch
        >>> import posenc
        >>> alibi = posenc.ALiBi(4)
        >>> pos = torch.arange(3)
        >>> bias = alibi(pos[:, None], pos[None, :])  # (heads, query, key)
        >>> bias[0]  # slope 1/4: 0 on the diagonal, -slope * distance below it
        tensor([[ 0.0000,  0.2500,  0.5000],
                [-0.2500,  0.0000,  0.2500],
                [-0.5000, -0.2500,  0.0000]])
        >>> bias[:, 2, 0].tolist()  # distance 2 in every head
        [-0.5, -0.125, -0.03125, -0.0078125]
        >>> torch.equal(bias, alibi.bias(3, 3))
        True
    """

    slopes: torch.Tensor

    def __init__(
        self,
        num_heads: int,
        *,
        symmetric: bool = False,
        max_bias: float = 8.0,
        scale_with_logits: bool = False,
    ) -> None:
        super().__init__()
        self.num_heads = _check_heads(num_heads)
        checks.check_bool(symmetric, "symmetric")
        checks.check_bool(scale_with_logits, "scale_with_logits")
        self.symmetric = symmetric
        self.max_bias = max_bias
        self.scale_with_logits = scale_with_logits
        self.reset_parameters()  # the slopes check max_bias

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        # float32 under model.to(torch.bfloat16) too, as HF keeps inv_freq
        return {"slopes": torch.from_numpy(alibi_slopes(self.num_heads, self.max_bias)).float()}

    def relative_bias(self, rel: torch.Tensor) -> torch.Tensor:
        self._check_size("rel", rel.shape)
        r = rel.to(self.slopes.dtype)
        if self.symmetric:
            r = -r.abs()
        return self.slopes.view(-1, *([1] * rel.ndim)) * r

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, symmetric={self.symmetric}, "
            f"max_bias={self.max_bias}, scale_with_logits={self.scale_with_logits}"
        )


class T5Bias(AttentionBias):
    """T5's learned relative-position bias: one scalar per head per bucket.

    ``bias = relative_attention_bias[t5_bucket(key - query)]``, the table HF's
    ``T5Attention`` holds as ``relative_attention_bias`` (an ``nn.Embedding
    (num_buckets, num_heads)``, same name, so its weights load directly). T5
    computes it in the first layer and shares it with all layers: pass one
    module to every layer. T5 does not scale its logits by ``1 / sqrt(d)``:
    call :func:`posenc.attention` with ``scale=1.0`` to match it.

    Args:
        num_heads: heads.
        bidirectional: encoder (True) or decoder buckets.
        num_buckets: buckets (32 in T5).
        max_distance: distance at which the last bucket starts (128 in T5).

    Raises:
        ValueError: as :func:`posenc.t5_bucket`; ``num_heads`` below 1, or a table
            of ``num_buckets x num_heads`` of more than
            :data:`posenc.core.checks.MAX_ELEMENTS` values (refused before any work).

    Examples:
        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> t5 = posenc.T5Bias(8)
        >>> t5.relative_attention_bias.weight.shape  # (num_buckets, num_heads), as in HF's T5
        torch.Size([32, 8])
        >>> pos = torch.arange(4)
        >>> bias = t5(pos[:, None], pos[None, :])  # (heads, query, key)
        >>> bias.shape
        torch.Size([8, 4, 4])
        >>> torch.equal(bias[:, 0, 1], t5.relative_attention_bias.weight[posenc.t5_bucket(1)])
        True
    """

    def __init__(
        self,
        num_heads: int,
        *,
        bidirectional: bool = True,
        num_buckets: int = 32,
        max_distance: int = 128,
    ) -> None:
        super().__init__()
        self.num_heads = _check_heads(num_heads)
        # the table's size first (t5_boundaries' own checks, then its work, follow)
        checks.check_bool(bidirectional, "bidirectional")
        nb = checks.check_int(num_buckets, "num_buckets", minimum=4 if bidirectional else 2)
        checks.check_elements(
            nb * self.num_heads,
            f"relative_attention_bias (num_buckets={nb} x num_heads={self.num_heads})",
        )
        buckets, _ = t5_boundaries(bidirectional, num_buckets, max_distance)
        self.bidirectional = bidirectional
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.relative_attention_bias = nn.Embedding(num_buckets, self.num_heads)
        self._buckets = buckets
        self.reset_parameters()

    thresholds: torch.Tensor

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        # a copy: the boundaries are cached, shared by every module and call
        _, thresholds = t5_boundaries(self.bidirectional, self.num_buckets, self.max_distance)
        return {"thresholds": torch.tensor(thresholds, dtype=torch.int64)}

    def relative_bias(self, rel: torch.Tensor) -> torch.Tensor:
        self._check_size("rel", rel.shape)
        index = bucket_torch(rel, self.thresholds, self._buckets, self.bidirectional)
        return self.relative_attention_bias(index).movedim(-1, 0)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, bidirectional={self.bidirectional}, "
            f"num_buckets={self.num_buckets}, max_distance={self.max_distance}"
        )


class KERPLE(AttentionBias):
    """KERPLE (Chi et al. 2022): a learned conditionally positive definite kernel.

    ``kind="log"``: ``-p log(1 + a |i - j|)``; ``kind="power"``: ``-a |i - j| ** p``
    with ``0 < p <= 2``. ``p`` and ``a`` are per-head parameters ``bias_p`` and
    ``bias_a`` (the names of the authors' gpt-neox code), initialised uniform on
    (0, 2) and (0, 1) as there, and clamped to at least ``eps`` (``p`` of the
    power kernel also to at most 2) where they are used.

    Args:
        num_heads: heads.
        kind: ``"log"`` or ``"power"``.
        eps: the lower clamp of both parameters (1e-2 in the authors' code).

    Raises:
        ValueError: ``num_heads`` below 1 or above
            :data:`posenc.core.checks.MAX_ELEMENTS` (refused before any work); an
            unknown ``kind``, ``eps <= 0``.

    Examples:
        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> kerple = posenc.KERPLE(4)
        >>> pos = torch.arange(5)
        >>> bias = kerple(pos[:, None], pos[None, :])  # (heads, query, key)
        >>> bias.shape
        torch.Size([4, 5, 5])
        >>> bool((bias.diagonal(dim1=-2, dim2=-1) == 0).all()), bool((bias <= 0).all())
        (True, True)
        >>> sorted(name for name, _ in kerple.named_parameters())
        ['bias_a', 'bias_p']
    """

    KINDS = ("log", "power")

    def __init__(self, num_heads: int, *, kind: str = "log", eps: float = 1e-2) -> None:
        super().__init__()
        self.num_heads = _check_heads(num_heads)
        checks.check_choice(kind, "kind", self.KINDS)
        self.kind = kind
        self.eps = checks.check_number(eps, "eps", positive=True)
        self.bias_p = nn.Parameter(torch.empty(self.num_heads))
        self.bias_a = nn.Parameter(torch.empty(self.num_heads))
        self.reset_parameters()

    def _init_parameters(self) -> None:
        device = self.bias_p.device
        self.bias_p.copy_(torch.rand(self.num_heads, device=device) * 2)
        self.bias_a.copy_(torch.rand(self.num_heads, device=device))

    def relative_bias(self, rel: torch.Tensor) -> torch.Tensor:
        self._check_size("rel", rel.shape)
        shape = (-1, *([1] * rel.ndim))
        dist = rel.abs().to(self.bias_p.dtype)
        a = self.bias_a.clamp(min=self.eps).view(shape)
        if self.kind == "log":
            p = self.bias_p.clamp(min=self.eps).view(shape)
            return -p * torch.log1p(a * dist)
        p = self.bias_p.clamp(min=self.eps, max=2.0).view(shape)
        # 0 ** p has an infinite derivative in p: take 1 ** p there and select 0
        safe = torch.where(dist > 0, dist, torch.ones_like(dist))
        return torch.where(dist > 0, -a * safe**p, torch.zeros_like(safe * p))

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, kind={self.kind!r}, eps={self.eps}"


class FIRE(AttentionBias):
    """FIRE (Li et al. 2023): an MLP of the log distance, normalised by the query position.

    ``bias = f(psi(i - j) / (psi(max(L, i)) + eps))`` with ``psi(x) = log(|c x|
    + 1)``, ``f`` an MLP ``1 -> mlp_width -> num_heads`` (ReLU), ``c`` learned
    (initially ``init_c``) and ``L = |L_multiplier * init_L|`` with a learned
    multiplier: the paper's reference module. ``i`` is the query position
    (bottom-right aligned), so the bias depends on more than ``key - query``
    (``relative = False``). Distances enter as ``|i - j|``.

    Args:
        num_heads: heads.
        mlp_width: hidden width of ``f`` (32 in the paper).
        init_c: initial ``c``.
        init_L: initial threshold ``L`` (512).
        eps: added to the normaliser.

    Raises:
        ValueError: ``num_heads`` or ``mlp_width`` below 1, or an MLP weight of
            ``mlp_width x num_heads`` of more than
            :data:`posenc.core.checks.MAX_ELEMENTS` values (refused before any
            work); non-positive ``init_c``, ``init_L`` or ``eps``.

    Examples:
        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> fire = posenc.FIRE(4)
        >>> pos = torch.arange(6)
        >>> fire(pos[:, None], pos[None, :]).shape  # (heads, query, key)
        torch.Size([4, 6, 6])
        >>> q, k, v = torch.randn(3, 1, 4, 6, 16).unbind(0)  # (batch, heads, seq, head_dim)
        >>> posenc.attention(q, k, v, bias=fire, causal=True).shape
        torch.Size([1, 4, 6, 16])
    """

    relative = False
    init_L: torch.Tensor

    def __init__(
        self,
        num_heads: int,
        *,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_L: float = 512.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.num_heads = _check_heads(num_heads)
        width = checks.check_int(mlp_width, "mlp_width", minimum=1)
        checks.check_elements(
            width * self.num_heads,
            f"the MLP's last weight (mlp_width={width} x num_heads={self.num_heads})",
        )
        self.mlp = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, self.num_heads))
        self._init = (
            checks.check_number(init_c, "init_c", positive=True),
            checks.check_number(init_L, "init_L", positive=True),
        )
        self.c = nn.Parameter(torch.empty(()))
        self.register_buffer("init_L", torch.empty(()))
        self.L_multiplier = nn.Parameter(torch.empty(()))
        self.eps = checks.check_number(eps, "eps", positive=True)
        self.reset_parameters()

    def _init_parameters(self) -> None:
        # init_L is a persistent buffer: state dicts carry it, so it is set here
        self.c.fill_(self._init[0])
        self.init_L.fill_(self._init[1])
        self.L_multiplier.fill_(1.0)

    def _psi(self, dist: torch.Tensor) -> torch.Tensor:
        return torch.log1p((self.c * dist.to(self.c.dtype)).abs())

    def _norm(self, q_pos: torch.Tensor) -> torch.Tensor:
        """``psi(max(L, i)) + eps``: the normaliser of queries at ``q_pos``."""
        threshold = (self.L_multiplier * self.init_L).abs()
        return self._psi(torch.maximum(q_pos.to(self.c.dtype), threshold)) + self.eps

    def _normalised(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """``psi(|i - j|) / (psi(max(L, i)) + eps)``, the MLP's input."""
        dist = (q_pos.to(self.c.dtype) - k_pos.to(self.c.dtype)).abs()
        return self._psi(dist) / self._norm(q_pos)

    def scaled_form(self, q_pos: torch.Tensor, rel: torch.Tensor) -> ScaledForm | None:
        # x = psi(|rel|) * (1 / norm(i)) lies in [0, max table * max scale]: the MLP's
        # pieces over that range (one ulp wider, for x rounded in the product)
        table, scale = self._psi(rel.abs()), 1 / self._norm(q_pos)
        first, last = self.mlp[0], self.mlp[2]
        assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)
        params = (first.weight, first.bias, last.weight, last.bias, table, scale)
        if not all(bool(t.detach().isfinite().all()) for t in params):
            return None
        high = float(table.detach().max()) * float(scale.detach().max()) * (1 + 1e-6)
        knots, slopes, intercepts = relu_pieces(first, last, 0.0, high)
        return ScaledForm(table, scale, knots, slopes, intercepts)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        self._check_size("q_pos and k_pos broadcast to", q_pos.shape, k_pos.shape)
        return self.mlp(self._normalised(q_pos, k_pos).unsqueeze(-1)).movedim(-1, 0)

    def relative_below(self) -> float:
        # psi(max(L, i)) is psi(L) for every query i < L: there the bias is f(psi(|i - j|)
        # / psi(L)), a function of the distance alone
        return float((self.L_multiplier * self.init_L).abs().detach())

    def relative_bias(self, rel: torch.Tensor) -> torch.Tensor:
        # the bias of a query at position 0 (< L) and a key at rel: that of every query
        # below L at distance rel (its gradient reaches L through the normaliser too)
        self._check_size("rel", rel.shape)
        return self(torch.zeros_like(rel), rel)

    def score(self, head: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        # the MLP of one head written out unit by unit: a score mod may not reduce
        x = self._normalised(q_pos, k_pos)
        first, last = self.mlp[0], self.mlp[2]
        assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)
        out = last.bias[head]
        for u in range(first.out_features):
            out = out + last.weight[head, u] * torch.relu(first.weight[u, 0] * x + first.bias[u])
        return out


class Sandwich(AttentionBias):
    """Sandwich (Chi et al. 2022b): the inner product of two sinusoidal embeddings.

    ``bias_h = (sum_{k=1}^{dim/2} cos((j - i) / 10000 ** (2k / dim)) - dim / 2)
    / (8 h / num_heads)`` for heads ``h = 1 .. num_heads``: zero at distance 0,
    falling towards ``-dim / 2`` with distance, scaled per head as NeMo's
    ``sandwich_pos_bias`` does (which sums the angles rather than their cosines;
    posenc follows the paper). Angles are computed in float64.

    Args:
        num_heads: heads.
        dim: dimension of the sinusoidal embeddings (even).

    Raises:
        ValueError: ``num_heads`` below 1 or above
            :data:`posenc.core.checks.MAX_ELEMENTS`; ``dim`` odd, below 2 or above
            :data:`posenc.core.checks.MAX_CHANNELS` (refused before any work).

    Examples:
        >>> import torch
        >>> import posenc
        >>> sandwich = posenc.Sandwich(2, dim=8)
        >>> pos = torch.arange(4)
        >>> sandwich(pos[-1:, None], pos[None, :])  # the last query: 0 at distance 0
        tensor([[[-0.0113, -0.0050, -0.0013,  0.0000]],
        <BLANKLINE>
                [[-0.0056, -0.0025, -0.0006,  0.0000]]])
    """

    def __init__(self, num_heads: int, *, dim: int = 128) -> None:
        super().__init__()
        self.num_heads = _check_heads(num_heads)
        self.dim = checks.check_channels(dim, "dim", minimum=2)
        if self.dim % 2:
            raise ValueError(f"dim must be even; got {dim}")
        self.reset_parameters()

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        # float64 whatever the module is cast to: the angles are computed in float64
        k = torch.arange(1, self.dim // 2 + 1, dtype=torch.float64, device="cpu")
        scales = torch.arange(1, self.num_heads + 1, dtype=torch.float64, device="cpu")
        return {
            "inv_freq": 10000.0 ** (-2 * k / self.dim),
            "head_scales": scales * 8 / self.num_heads,
        }

    def relative_bias(self, rel: torch.Tensor) -> torch.Tensor:
        self._check_size("rel", rel.shape)
        angles = rel.to(torch.float64).unsqueeze(-1) * self.inv_freq.to(rel.device)
        profile = torch.cos(angles).sum(-1) - self.dim / 2
        scales = self.head_scales.to(rel.device).view(-1, *([1] * rel.ndim))
        return (profile / scales).float()

    inv_freq: torch.Tensor
    head_scales: torch.Tensor

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, dim={self.dim}"


class NoPE(AttentionBias):
    """No positional signal (Kazemnejad et al. 2023): a zero bias, causal mask only.

    Raises:
        ValueError: ``num_heads`` below 1 or above
            :data:`posenc.core.checks.MAX_ELEMENTS` (its bias has a row per head).

    Examples:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> nope = posenc.NoPE(4)
        >>> pos = torch.arange(6)
        >>> bool((nope(pos[:, None], pos[None, :]) == 0).all())
        True
        >>> q, k, v = torch.randn(3, 1, 4, 6, 16).unbind(0)  # (batch, heads, seq, head_dim)
        >>> out = posenc.attention(q, k, v, bias=nope, causal=True)
        >>> torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6)
        True
    """

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = _check_heads(num_heads)
        self.reset_parameters()

    def relative_bias(self, rel: torch.Tensor) -> torch.Tensor:
        self._check_size("rel", rel.shape)
        return torch.zeros((self.num_heads, *rel.shape), device=rel.device)

    def score_form(self, ctx: TermContext) -> TermForm:
        """No term: the scores are left as they are (heads checked)."""
        if self.num_heads != ctx.heads:
            raise ValueError(f"bias has {self.num_heads} heads; q has {ctx.heads}")
        return TermForm()
