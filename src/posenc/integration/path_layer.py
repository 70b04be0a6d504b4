"""``PaTH``: a PaTH attention layer (projections, the transforms' directions, a KV cache).

The layer of flash-linear-attention's ``fla/layers/path_attn.py`` (``PaTHAttention``,
Yang et al. 2025, "PaTH Attention: Position Encoding via Accumulating Householder
Transformations"), on :func:`posenc.path_attention`:

- q, k, v and the output through bias-free linear maps, ``head_dim = hidden // heads``;
- the directions ``w``: a rank-32 map (hidden -> 32 -> kv_dim) when ``heads ==
  kv_heads``, else one linear map, then a causal depthwise convolution of width 3
  with SiLU (fla's ``ShortConvolution``: no bias, restarting with every packed
  document), then L2-normalised per head (``w / sqrt(|w|^2 + 1e-6)``, fla's
  ``l2_norm``);
- ``beta = 2 sigmoid(linear(x))`` per kv head (with a bias), in ``(0, 2)``: the
  transforms may reflect (negative eigenvalues);
- with ``forget_gate`` (PaTH-FoX), log forget gates ``logsigmoid(linear(x))`` per
  query head (with a bias), in float32 (float64 for a float64 layer).

Decoding keeps what fla's layer keeps (:class:`PaTHCache`): the keys carried to the
latest position (each new position's transform applied to every cached key, ``k <- k
- beta_t (k . w_t) w_t``), so that a new query's score is a plain ``q . k``; the
values; the convolution's last two inputs; and the cumulative log gates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from posenc.core import checks
from posenc.core.positions import packed_positions
from posenc.integration.attention.path import path_attention, path_keys

#: The rank of the directions' map when every query head has its own kv head (fla's).
W_RANK = 32
#: The width of the directions' causal convolution (fla's ShortConvolution(kv_dim, 3)).
CONV_WIDTH = 3
#: fla's l2_norm: w / sqrt(sum w^2 + eps).
L2_EPS = 1e-6


@dataclass(frozen=True)
class PaTHCache:
    """What :class:`PaTH` keeps between decoding calls; ``PaTHCache()`` starts one.

    Each field is None before the first call. Held in the layer's work dtype
    (float32 for float16 and bfloat16, so that the keys' updates do not round to
    half precision step after step) and detached from autograd (decoding is
    inference: no gradient flows from one call into the next).

    Attributes:
        keys: ``(batch, kv_heads, t, head_dim)``: key ``j`` carried to the latest
            position ``t - 1``, ``H_{t-1} ... H_{j+1} k_j``.
        values: ``(batch, kv_heads, t, head_dim)``.
        conv: ``(batch, kv_dim, 2)``: the directions' last two inputs to the
            convolution (zeros before the first position).
        gates: ``(batch, heads, t)``: the cumulative log forget gates ``c_j``; None
            without a forget gate.

    Examples:
        Prefill, then one decoding step: the step's output is the full pass's.

        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> layer = posenc.PaTH(64, 4, forget_gate=True)
        >>> x = torch.randn(1, 9, 64)
        >>> full = layer(x)
        >>> _, cache = layer(x[:, :8], cache=posenc.PaTHCache())
        >>> step, cache = layer(x[:, 8:], cache=cache)
        >>> cache.length, torch.allclose(step, full[:, 8:], atol=1e-5)
        (9, True)
    """

    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    conv: torch.Tensor | None = None
    gates: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """The number of positions cached."""
        return 0 if self.keys is None else int(self.keys.shape[2])


def _position(key: str, a: torch.Tensor | None, t: int) -> torch.Tensor | None:
    """Position ``t`` (kept as a length-1 axis) of one of :meth:`PaTH._project`'s tensors."""
    if a is None:
        return None
    return a[:, t : t + 1] if key == "raw" else a[:, :, t : t + 1]


def _starts(cu_seqlens: Any, x: torch.Tensor) -> torch.Tensor | None:
    """Each position's document start ``(seq,)``, where the convolution restarts; None
    without packing.

    Raises:
        TypeError: ``cu_seqlens`` not an int tensor.
        ValueError: ``cu_seqlens`` not rising from 0 to seq.
    """
    if cu_seqlens is None:
        return None
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be an int tensor; got {type(cu_seqlens).__name__}")
    pos = packed_positions(cu_seqlens, x.shape[1]).to(x.device)
    return torch.arange(x.shape[1], device=x.device) - pos


class PaTHTransforms(nn.Module):
    """PaTH's per-token transforms from hidden states: directions ``w``, ``beta`` and gates.

    What flash-linear-attention's ``PaTHAttention`` makes of its input besides q, k
    and v (Yang et al. 2025): ``w`` through a rank-32 map (hidden -> 32 -> kv_dim)
    when ``heads == kv_heads``, else one linear map, a causal depthwise
    convolution of width 3 with SiLU (restarting with every packed document) and
    an L2 norm per head; ``beta = 2 sigmoid(linear(x))`` per kv head; with
    ``forget_gate``, log forget gates ``logsigmoid(linear(x))`` per query head.
    The parameters carry fla's names (``w_proj``, ``w_conv1d``, ``bt_proj``,
    ``g_proj``). :class:`PaTH` is this plus its q, k, v and output maps; a model
    that makes its own q, k and v (posenc's lab) uses this alone, through
    :meth:`transforms` (it has no ``forward``: :class:`PaTH`'s is the layer's).

    Args:
        hidden: model width, a multiple of ``heads``.
        heads: query heads.
        kv_heads: key/value heads (grouped-query attention), dividing ``heads``;
            ``heads`` by default.
        forget_gate: add log forget gates per query head (PaTH-FoX).

    Raises:
        TypeError: non-int sizes, a non-bool ``forget_gate``.
        ValueError: ``hidden`` not a multiple of ``heads``, ``heads`` not a multiple of
            ``kv_heads``.
    """

    def __init__(
        self, hidden: int, heads: int, kv_heads: int | None = None, forget_gate: bool = False
    ) -> None:
        super().__init__()
        hidden = checks.check_channels(hidden, "hidden")
        heads = checks.check_int(heads, "heads", 1)
        kv_heads = heads if kv_heads is None else checks.check_int(kv_heads, "kv_heads", 1)
        checks.check_bool(forget_gate, "forget_gate")
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        if heads % kv_heads:
            raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        self.hidden, self.heads, self.kv_heads = hidden, heads, kv_heads
        self.head_dim = hidden // heads
        self.forget_gate = forget_gate
        kv_dim = kv_heads * self.head_dim
        # fla: low rank when every head has its own kv head (a full map would cost
        # another hidden x hidden), a plain map when kv heads are shared
        self.w_proj: nn.Module
        if heads == kv_heads:
            self.w_proj = nn.Sequential(
                nn.Linear(hidden, W_RANK, bias=False), nn.Linear(W_RANK, kv_dim, bias=False)
            )
        else:
            self.w_proj = nn.Linear(hidden, kv_dim, bias=False)
        # depthwise: weight (kv_dim, 1, 3), weight[:, 0, 0] on the oldest input
        self.w_conv1d = nn.Conv1d(kv_dim, kv_dim, CONV_WIDTH, groups=kv_dim, bias=False)
        self.bt_proj = nn.Linear(hidden, kv_heads, bias=True)
        self.g_proj = nn.Linear(hidden, heads, bias=True) if forget_gate else None

    def reset_parameters(self) -> None:
        """Draw every parameter anew (torch's defaults), e.g. after ``to_empty``."""
        for module in self.modules():
            reset = getattr(module, "reset_parameters", None)
            if module is not self and callable(reset):
                reset()

    def extra_repr(self) -> str:
        return (
            f"hidden={self.hidden}, heads={self.heads}, kv_heads={self.kv_heads}, "
            f"forget_gate={self.forget_gate}"
        )

    def transforms(
        self, x: torch.Tensor, *, cu_seqlens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(w, beta, log_fgate)`` of ``x`` ``(batch, seq, hidden)``: the transforms'
        arguments of :func:`posenc.path_attention`.

        ``w`` ``(batch, kv_heads, seq, head_dim)`` unit per head, in x's dtype; ``beta``
        ``(batch, kv_heads, seq)`` in ``(0, 2)``; ``log_fgate`` ``(batch, heads, seq)``
        float32 (float64 for float64 x), or None without a forget gate.

        Raises:
            TypeError: a non-float ``x`` or ``cu_seqlens`` not an int tensor.
            ValueError: ``x`` not ``(batch, seq, hidden)``; bad ``cu_seqlens``.
        """
        checks.check_float_tensor(x, "x")
        if x.ndim != 3 or x.shape[-1] != self.hidden or x.shape[1] < 1:
            raise ValueError(
                f"x must be (batch, seq, hidden={self.hidden}) with seq >= 1; got {tuple(x.shape)}"
            )
        work = checks.work_dtype(x.dtype)
        w = self._directions(self._conv(self.w_proj(x).to(work), _starts(cu_seqlens, x)))
        return w.to(x.dtype), self._beta(x), self._log_gates(x, work)

    # ------------------------------------------------------------------ pieces

    def _beta(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * torch.sigmoid(self.bt_proj(x)).transpose(1, 2)

    def _log_gates(self, x: torch.Tensor, work: torch.dtype) -> torch.Tensor | None:
        if self.g_proj is None:
            return None
        return F.logsigmoid(self.g_proj(x).to(work)).transpose(1, 2)

    def _conv(self, raw: torch.Tensor, starts: torch.Tensor | None) -> torch.Tensor:
        """The causal depthwise convolution and SiLU over ``raw`` ``(batch, seq, kv_dim)``.

        Written as its three taps, oldest first, the order ``_step`` adds them
        in, so that decoding reproduces the full pass's directions exactly. ``starts``
        ``(seq,)``: each position's document start (inputs before it count as 0).
        """
        weight = self.w_conv1d.weight[:, 0].to(raw.dtype)  # (kv_dim, 3), oldest tap first
        length = raw.shape[1]
        pos = torch.arange(length, device=raw.device)
        out = None
        for tap in range(CONV_WIDTH):
            shift = CONV_WIDTH - 1 - tap
            x = F.pad(raw, (0, 0, shift, 0))[:, :length]
            if starts is not None and shift:
                x = x * (pos - shift >= starts)[None, :, None].to(raw.dtype)
            term = x * weight[:, tap]
            out = term if out is None else out + term
        assert out is not None
        return F.silu(out)

    def _directions(self, conv: torch.Tensor) -> torch.Tensor:
        """``(batch, seq, kv_dim)`` -> unit directions ``(batch, kv_heads, seq, head_dim)``."""
        b, length, _ = conv.shape
        w = conv.view(b, length, self.kv_heads, self.head_dim).transpose(1, 2)
        return w * torch.rsqrt((w * w).sum(-1, keepdim=True) + L2_EPS)


class PaTH(PaTHTransforms):
    """A PaTH attention layer (Yang et al. 2025), as flash-linear-attention's ``PaTHAttention``.

    ``forward(x)`` maps ``(batch, seq, hidden)`` to ``(batch, seq, hidden)``, causal;
    with a :class:`PaTHCache` it also returns the updated cache (prefill and
    decoding). See the module docstring for the projections; the transforms'
    are :class:`PaTHTransforms`', whose arguments and errors it takes.

    Examples:
        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> layer = posenc.PaTH(64, 4)  # hidden 64, 4 heads
        >>> x = torch.randn(2, 10, 64)  # (batch, seq, hidden)
        >>> y = layer(x)
        >>> y.shape
        torch.Size([2, 10, 64])
        >>> x[:, -1] = 0  # causal: changing the last token leaves the others' outputs
        >>> torch.allclose(layer(x)[:, :-1], y[:, :-1], atol=1e-6)
        True
    """

    def __init__(
        self, hidden: int, heads: int, kv_heads: int | None = None, forget_gate: bool = False
    ) -> None:
        super().__init__(hidden, heads, kv_heads, forget_gate)
        kv_dim = self.kv_heads * self.head_dim
        self.q_proj = nn.Linear(self.hidden, self.hidden, bias=False)
        self.k_proj = nn.Linear(self.hidden, kv_dim, bias=False)
        self.v_proj = nn.Linear(self.hidden, kv_dim, bias=False)
        self.o_proj = nn.Linear(self.hidden, self.hidden, bias=False)

    def _project(self, x: torch.Tensor, work: torch.dtype) -> dict[str, Any]:
        b, length, _ = x.shape
        d = self.head_dim
        q = self.q_proj(x).view(b, length, self.heads, d).transpose(1, 2)
        k = self.k_proj(x).view(b, length, self.kv_heads, d).transpose(1, 2)
        v = self.v_proj(x).view(b, length, self.kv_heads, d).transpose(1, 2)
        beta, log_f = self._beta(x), self._log_gates(x, work)
        return {"q": q, "k": k, "v": v, "beta": beta, "log_f": log_f, "raw": self.w_proj(x)}

    def _check(self, x: Any, cache: Any, cu_seqlens: Any) -> None:
        checks.check_float_tensor(x, "x")
        if x.ndim != 3 or x.shape[-1] != self.hidden or x.shape[1] < 1:
            raise ValueError(
                f"x must be (batch, seq, hidden={self.hidden}) with seq >= 1; got {tuple(x.shape)}"
            )
        if cache is None:
            return
        if not isinstance(cache, PaTHCache):
            raise TypeError(
                f"cache must be a PaTHCache (PaTHCache() starts one) or None; got "
                f"{type(cache).__name__}"
            )
        if cu_seqlens is not None:
            raise ValueError(
                "cu_seqlens and cache cannot be combined: a cache holds one sequence per row"
            )
        if cache.keys is not None and cache.keys.shape[0] != x.shape[0]:
            raise ValueError(
                f"x's batch ({x.shape[0]}) must match the cache's ({cache.keys.shape[0]})"
            )
        if (cache.gates is not None) != (self.forget_gate and cache.length > 0):
            raise ValueError("the cache's gates do not match this layer's forget_gate")

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        x: torch.Tensor,
        *,
        cu_seqlens: torch.Tensor | None = None,
        cache: PaTHCache | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, PaTHCache]:
        """PaTH attention over ``x`` ``(batch, seq, hidden)``, causal.

        Args:
            x: ``(batch, seq, hidden)`` float.
            cu_seqlens: packed documents (flash-attn's ``(n + 1,)`` ints from 0 to
                seq): attention, transforms, gates and the convolution restart with
                every document. Not with a cache.
            cache: a :class:`PaTHCache`: ``PaTHCache()`` to prefill ``x``, or the one
                a previous call returned, to decode ``x`` after it (one position after
                another).

        Returns:
            ``(batch, seq, hidden)``; with a cache, ``(out, cache)``, the cache now
            holding ``x`` too.

        Raises:
            TypeError: a non-float ``x``, a cache of another type.
            ValueError: a shape other than ``(batch, seq, hidden)``, a cache of
                another batch size or gate setting, ``cu_seqlens`` with a cache, or
                bad ``cu_seqlens`` (see ``path_attention``).
        """
        self._check(x, cache, cu_seqlens)
        if cache is not None and cache.length > 0:
            return self._decode(x, cache)
        work = checks.work_dtype(x.dtype)
        p = self._project(x, work)
        starts = _starts(cu_seqlens, x)
        w = self._directions(self._conv(p["raw"].to(work), starts)).to(x.dtype)
        out = path_attention(
            p["q"], p["k"], p["v"], w, p["beta"], log_fgate=p["log_f"], cu_seqlens=cu_seqlens
        )
        y = self.o_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], self.hidden))
        if cache is None:
            return y
        raw = p["raw"].to(work).transpose(1, 2)  # (batch, kv_dim, seq)
        conv = F.pad(raw, (CONV_WIDTH - 1, 0))[..., -(CONV_WIDTH - 1) :]
        gates = None if p["log_f"] is None else p["log_f"].cumsum(-1)
        new = PaTHCache(
            keys=path_keys(p["k"].to(work), w.to(work), p["beta"].to(work)).detach(),
            values=p["v"].to(work).detach(),
            conv=conv.detach(),
            gates=None if gates is None else gates.detach(),
        )
        return y, new

    def _decode(self, x: torch.Tensor, cache: PaTHCache) -> tuple[torch.Tensor, PaTHCache]:
        """Each position of ``x`` after the cached ones, one at a time."""
        work = checks.work_dtype(x.dtype)
        p = self._project(x, work)
        outs = []
        for t in range(x.shape[1]):
            one = {key: _position(key, a, t) for key, a in p.items()}
            out, cache = self._step(one, cache, x.dtype, work)
            outs.append(out)
        out = torch.cat(outs, 2).to(x.dtype)  # (batch, heads, seq, head_dim)
        y = self.o_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], self.hidden))
        return y, cache

    def _step(
        self, p: dict[str, Any], cache: PaTHCache, dtype: torch.dtype, work: torch.dtype
    ) -> tuple[torch.Tensor, PaTHCache]:
        """One position: ``p`` holds its projections (seq 1); returns ``(out, cache)``."""
        assert cache.keys is not None and cache.values is not None and cache.conv is not None
        b = p["q"].shape[0]
        d, hk, g = self.head_dim, self.kv_heads, self.heads // self.kv_heads
        raw = p["raw"].to(work)  # (batch, 1, kv_dim)
        window = torch.cat([cache.conv.transpose(1, 2), raw], 1)  # (batch, 3, kv_dim)
        weight = self.w_conv1d.weight[:, 0].to(work)
        acc = None
        for tap in range(CONV_WIDTH):  # oldest first, as _conv
            term = window[:, tap : tap + 1] * weight[:, tap]
            acc = term if acc is None else acc + term
        assert acc is not None
        # rounded to the layer's dtype as the full pass hands them to path_attention
        w = self._directions(F.silu(acc)).to(dtype).to(work)  # (batch, kv_heads, 1, head_dim)
        beta = p["beta"].to(work)  # (batch, kv_heads, 1)
        keys = cache.keys
        # the new position's transform on every cached key: k <- k - beta (k . w) w
        keys = keys - beta[..., None] * (keys * w).sum(-1, keepdim=True) * w
        keys = torch.cat([keys, p["k"].to(work)], 2)
        values = torch.cat([cache.values, p["v"].to(work)], 2)
        gates = None
        q = p["q"].to(work).reshape(b, hk, g, 1, d)
        s = torch.matmul(q, keys[:, :, None].mT)  # (batch, kv_heads, g, 1, t)
        if p["log_f"] is not None:
            assert cache.gates is not None
            last = cache.gates[..., -1:]
            gates = torch.cat([cache.gates, last + p["log_f"]], -1)  # (batch, heads, t)
            gv = gates.view(b, hk, g, 1, -1)
            s = s + gv[..., -1:] - gv  # fla: the gate before the scale
        attn = torch.softmax(s * (1.0 / math.sqrt(d)), -1)
        out = torch.matmul(attn, values[:, :, None]).view(b, self.heads, 1, d)
        conv = window[:, 1:].transpose(1, 2)
        new = replace(
            cache,
            keys=keys.detach(),
            values=values.detach(),
            conv=conv.detach(),
            gates=None if gates is None else gates.detach(),
        )
        return out, new
