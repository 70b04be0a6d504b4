"""PoPE, polar-coordinate position embeddings: magnitude from the content, phase from the position.

Gopalakrishnan et al. 2025, "Decoupling the 'What' and 'Where' With Polar Coordinate
Positional Embeddings", arXiv:2509.10534; reference implementations ``pope-pytorch``
(``PoPE_pytorch/pope.py``: ``PoPE``, ``apply_pope_to_qk``) and x-transformers
(``PolarEmbedding``, ``apply_polar_pos_emb``).

Notation: ``d`` rotated channels (``dim``), ``c = 0 .. d - 1``, ``h`` a head, ``i`` a
query's position and ``j`` a key's. Each of the ``d`` channels becomes a complex number
whose magnitude is the content and whose phase is the position alone::

    theta_c = base ** (-c / d)                      d frequencies, not d / 2 as in RoPE
    mu_c    = softplus(x_c)                         x a query or key channel
    delta   = clamp(bias[h, c], -2 pi, 0)           a learned phase on the keys
    q'_c    = mu_q,c (cos(i theta_c), sin(i theta_c))
    k'_c    = mu_k,c (cos(j theta_c + delta), sin(j theta_c + delta))
    q' . k' = sum_c mu_q,c mu_k,c cos((i - j) theta_c - delta_h,c)

so ``q'`` and ``k'`` hold ``2 d`` real channels: interleaved ``(cos_0, sin_0, cos_1,
...)`` as pope-pytorch's ``apply_pope_to_qk`` lays them out, or ``half`` (all cos, then
all sin) as x-transformers' ``apply_polar_pos_emb`` does; the scores are the same.
Channels past ``d`` (pope-pytorch's partial rotation) pass through as they are, after
the ``2 d`` polar ones. Attention keeps the scale ``1 / sqrt(head_dim)`` of the inputs
(x-transformers).

Precision: the references form ``position * inv_freq`` in float32 (autocast off), an
angle off by about ``|position * theta| * 2**-23``. posenc takes ``cos`` and ``sin`` of
``position * theta_c`` from the exact angle engine (:mod:`posenc.core.angles`) and adds
the bias by the angle-addition formula (a complex product) in the working dtype
(float32; float64 for float64 inputs), so each polar channel is within a few float32
roundings of exact at every position. The result has the inputs' dtype
(x-transformers'; pope-pytorch returns float32 for float16 inputs).

Grouped-query attention: the bias has one row per query head. The references repeat the
keys to every query head; posenc keeps the ``kv_heads`` keys and moves the bias onto the
queries' phase (``cos((i theta - delta) - j theta)`` is the same score) whenever the keys
have fewer heads than the bias. Query head ``i`` reads key head ``i // (heads / kv_heads)``
(HF's ``repeat_kv``, :func:`posenc.attention`'s); pope-pytorch's attention functions tile
the key heads instead (``repeat(k, 'b h ... -> b (g h) ...')``: key head ``i % kv_heads``).

Shapes: ``q`` ``(batch, heads, q_len, head_dim)``, ``k`` ``(batch, kv_heads, k_len,
head_dim)``, positions ``(len,)`` or ``(rows, len)`` (rows 1 or batch).
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from posenc.core import checks
from posenc.core.angles import sincos_torch
from posenc.core.buffers import DerivedBuffers
from posenc.families.rotary.rotation import RotatedPair
from posenc.families.rotary.schedules import RopeFrequencies, frequencies
from posenc.families.rotary.tables import LAYOUTS, Layout, check_size

#: The phase bias is clamped to ``[BIAS_MIN, 0]`` (both references: ``clamp(-2 pi, 0)``).
BIAS_MIN = -2.0 * math.pi


def pope_frequencies(
    dim: int, base: float = 10000.0, inv_freqs: Sequence[float] | torch.Tensor | None = None
) -> RopeFrequencies:
    """PoPE's ``d`` frequencies ``base ** (-c / d)``, exact; or the given ``inv_freqs``.

    ``base ** (-c / d)`` for ``c < d`` are RoPE's ``base ** (-2k / (2 d))``, so this is
    the ``default`` schedule of ``2 d`` channels. Given ``inv_freqs`` (pope-pytorch's
    argument), their float values are taken as exact.

    Raises:
        TypeError: a non-int ``dim``, a non-numeric ``base`` or ``inv_freqs``.
        ValueError: ``dim`` out of range; ``inv_freqs`` not ``dim`` finite values.
    """
    d = checks.check_channels(dim, "dim", minimum=1)
    if inv_freqs is None:
        return frequencies("default", 2 * d, checks.check_number(base, "base", positive=True))
    try:  # on the CPU also under a default device (meta-device construction)
        values = torch.as_tensor(inv_freqs, dtype=torch.float64, device="cpu").detach()
    except (TypeError, ValueError, RuntimeError, NotImplementedError) as error:
        raise TypeError(f"inv_freqs must be {d} real numbers; got {inv_freqs!r}") from error
    if values.shape != (d,) or not bool(torch.isfinite(values).all()):
        raise ValueError(
            f"inv_freqs must be {d} finite values (one per channel of dim={d}); got shape "
            f"{tuple(values.shape)}"
        )
    return RopeFrequencies(tuple(decimal.Decimal(v) for v in values.tolist()))


def _check_positions(positions: Any, name: str, length: int, batch: int, dim: int) -> torch.Tensor:
    positions = checks.check_position_tensor(positions, name)
    check_size(positions, 2 * dim, name, "PoPE's phase tables")
    ok = positions.ndim in (1, 2) and positions.shape[-1] == length
    if positions.ndim == 2:
        ok = ok and positions.shape[0] in (1, batch)
    if not ok:
        raise ValueError(
            f"{name} must be ({length},) or (rows, {length}) with rows 1 or batch={batch}; "
            f"got shape {tuple(positions.shape)}"
        )
    return checks.check_position_tensor(positions, name, exact=True)


def _phases(
    positions: torch.Tensor, freqs: RopeFrequencies, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``cos + i sin`` of ``positions * theta``, exact then rounded once to ``dtype``'s
    complex: ``(len, d)``, or ``(rows, 1, len, d)`` for per-row positions (broadcast over
    heads)."""
    s, c = sincos_torch(positions.to(device), freqs.turns)
    z = torch.complex(c.to(dtype), s.to(dtype))
    return z[:, None] if positions.ndim == 2 else z


def _polar(x: torch.Tensor, z: torch.Tensor, dim: int, layout: str) -> torch.Tensor:
    """``softplus(x_c) (cos, sin)`` of the phases ``z`` in ``layout``, then ``x``'s channels
    past ``dim``: one product of the activations with the (small) table of phases."""
    mu = F.softplus(x[..., :dim])
    table = torch.view_as_real(z)  # (..., len, d, 2): interleaved
    if layout == "half":
        polar = (mu.unsqueeze(-2) * table.transpose(-1, -2).contiguous()).flatten(-2)
    else:
        polar = (mu.unsqueeze(-1) * table).flatten(-2)
    return polar if dim == x.shape[-1] else torch.cat([polar, x[..., dim:]], dim=-1)


def pope_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    bias: torch.Tensor,
    freqs: RopeFrequencies,
    *,
    layout: Layout = "interleaved",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q'`` and ``k'``, PoPE's polar channels of ``q`` and ``k`` (see :mod:`posenc.rotary.pope`).

    pope-pytorch's ``apply_pope_to_qk`` (``layout="interleaved"``) or x-transformers'
    ``apply_polar_pos_emb`` (``"half"``) with exact angles: ``softplus`` of the first
    ``d = len(freqs.omega)`` channels times ``cos`` and ``sin`` of the position's phase,
    the keys' phase plus ``clamp(bias, -2 pi, 0)``; channels past ``d`` pass through.
    Computed in float32 (float64 for float64 inputs) with autocast off; returned in the
    inputs' dtype. Gradients reach ``q``, ``k`` and ``bias``.

    Args:
        q: ``(batch, heads, q_len, head_dim)``.
        k: ``(batch, kv_heads, k_len, head_dim)``, ``heads`` a multiple of ``kv_heads``.
        q_positions: ``(q_len,)`` or ``(rows, q_len)`` positions (rows 1 or batch).
        k_positions: ``(k_len,)`` or ``(rows, k_len)``.
        bias: ``(bias_heads, d)`` phase bias before clamping; ``bias_heads`` 1 (shared),
            ``kv_heads`` or ``heads``. With fewer key heads than bias heads it turns the
            queries by ``-delta`` instead of the keys by ``delta`` (the same scores).
        freqs: the ``d`` frequencies (:func:`pope_frequencies`), ``d <= head_dim``.
        layout: ``"interleaved"`` (pope-pytorch) or ``"half"`` (x-transformers).

    Returns:
        ``(q', k')`` with ``2 d + head_dim - d`` channels each.

    Raises:
        TypeError: non-float ``q``, ``k`` or ``bias``, ``q`` and ``k`` of different
            dtypes, non-tensor or bool positions.
        ValueError: ranks, batch or head_dim that differ, heads no multiple of
            kv_heads, ``d > head_dim``, a bias not ``(1, kv_heads or heads, d)``,
            positions of the wrong shape or beyond ``2**31``, an unknown layout.
    """
    q = checks.check_float_tensor(q, "q")
    k = checks.check_float_tensor(k, "k")
    bias = checks.check_float_tensor(bias, "bias")
    checks.check_choice(layout, "layout", LAYOUTS)
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must have the same dtype; got {q.dtype} and {k.dtype}")
    if q.ndim != 4 or k.ndim != 4 or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            "q must be (batch, heads, q_len, head_dim) and k (batch, kv_heads, k_len, "
            f"head_dim) with the same batch and head_dim; got {tuple(q.shape)} and "
            f"{tuple(k.shape)}"
        )
    batch, heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"q's heads ({heads}) must be a multiple of k's ({kv_heads})")
    dim = len(freqs.omega)
    if dim > head_dim:
        raise ValueError(f"PoPE rotates dim={dim} channels; q and k have only {head_dim}")
    if bias.ndim != 2 or bias.shape[0] not in (1, kv_heads, heads) or bias.shape[1] != dim:
        raise ValueError(
            f"bias must be (bias_heads, {dim}) with bias_heads 1, kv_heads={kv_heads} or "
            f"heads={heads}; got shape {tuple(bias.shape)}"
        )
    qp = _check_positions(q_positions, "q_positions", q_len, batch, dim)
    kp = k_positions if k_positions is q_positions else None
    kp = _check_positions(k_positions, "k_positions", k_len, batch, dim) if kp is None else qp
    work = checks.work_dtype(q.dtype)
    with torch.autocast(q.device.type, enabled=False):
        kz = _phases(kp, freqs, work, q.device)
        qz = kz if qp is kp else _phases(qp, freqs, work, q.device)
        delta = bias.to(work).clamp(BIAS_MIN, 0.0)[:, None]  # (bias_heads, 1, d)
        # the angle-addition formula, as a complex product: exact phases stay exact
        if bias.shape[0] in (1, kv_heads):  # keys turned by +delta, as the references
            kz = kz * torch.complex(torch.cos(delta), torch.sin(delta))
        else:  # fewer key heads than bias heads: the queries by -delta
            qz = qz * torch.complex(torch.cos(delta), -torch.sin(delta))
        qr = _polar(q.to(work), qz, dim, layout)
        kr = _polar(k.to(work), kz, dim, layout)
    return qr.to(q.dtype), kr.to(k.dtype)


class PoPE(DerivedBuffers):
    """Polar-coordinate position embeddings for queries and keys (Gopalakrishnan et al. 2025).

    Each of the first ``dim`` channels of ``q`` and ``k`` becomes a magnitude
    ``softplus(x_c)`` and a phase ``position * base ** (-c / dim)``, the keys' phase
    shifted by a learned ``bias`` clamped to ``[-2 pi, 0]``: the score of query ``i``
    and key ``j`` is ``sum_c mu_q,c mu_k,c cos((i - j) theta_c - delta_c)``, its
    content (the magnitudes) apart from its distance (the phases). ``q`` and ``k``
    come out with ``2 * dim`` polar channels (then any channels past ``dim``, as they
    are), so the module is a :class:`posenc.rotary.rotation.PairRotation` for
    :func:`posenc.attention` (``rotary=pope``), which keeps the scale ``1 /
    sqrt(head_dim)`` of the inputs. The formula and the precision are in
    :mod:`posenc.rotary.pope`.

    pope-pytorch's ``PoPE`` (``PoPE_pytorch/pope.py``) with the same parameter and
    buffer: ``bias`` ``(heads, dim)`` and ``inv_freqs``; ``load_state_dict`` of its
    state dict gives the same attention (its ``inv_freqs`` must be this module's
    frequencies, to float32 rounding). An x-transformers ``PolarEmbedding`` state dict
    (``learned_bias`` ``(heads, 1, dim)``, ``inv_freq``) loads too.

    Args:
        dim: channels per head that become polar (pope-pytorch's ``dim``; the
            ``head_dim`` of the inputs may be larger: the rest pass through).
        heads: query heads: one row of ``bias`` each (1 shares one across heads).
        base: ``theta``, the frequencies' base.
        bias_uniform_init: draw ``bias`` uniform in ``[-2 pi, 0]`` (both references'
            option); zeros by default.
        inv_freqs: ``dim`` frequencies of your own instead of ``base ** (-c / dim)``
            (pope-pytorch's argument), taken as exact.
        layout: ``"interleaved"`` (pope-pytorch's ``(cos_0, sin_0, cos_1, ...)``) or
            ``"half"`` (x-transformers' cos channels, then sin channels).

    Attributes:
        inv_freqs: float32 ``(dim,)`` frequencies (pope-pytorch's buffer; not state).

    Raises:
        TypeError: non-int ``dim`` or ``heads``, a non-numeric ``base``, a non-bool
            ``bias_uniform_init``.
        ValueError: ``dim`` or ``heads`` below 1, ``inv_freqs`` not ``dim`` finite
            values, an unknown ``layout``; when loading, an ``inv_freqs`` that is not
            this module's.

    Examples:
        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> pope = posenc.PoPE(16, heads=4, bias_uniform_init=True)
        >>> q, k, v = torch.randn(3, 2, 4, 8, 16).unbind(0)  # (batch, heads, seq, head_dim)
        >>> out = posenc.attention(q, k, v, rotary=pope, causal=True)
        >>> out.shape
        torch.Size([2, 4, 8, 16])
        >>> q1, k1 = pope(q, k)  # 2 * dim polar channels
        >>> q1.shape
        torch.Size([2, 4, 8, 32])
        >>> q2, k2 = pope(q, k, offset=1000)  # every position moved by 1000
        >>> torch.allclose(q1 @ k1.mT, q2 @ k2.mT, atol=1e-4)  # scores see the distance only
        True
        >>> sorted(pope.state_dict())  # pope-pytorch's parameter
        ['bias']
    """

    inv_freqs: torch.Tensor

    def __init__(
        self,
        dim: int,
        *,
        heads: int,
        base: float = 10000.0,
        bias_uniform_init: bool = False,
        inv_freqs: Sequence[float] | torch.Tensor | None = None,
        layout: Layout = "interleaved",
    ) -> None:
        super().__init__()
        self.dim = checks.check_channels(dim, "dim", minimum=1)
        self.heads = checks.check_int(heads, "heads", minimum=1)
        self.base = checks.check_number(base, "base", positive=True)
        self.bias_uniform_init = checks.check_bool(bias_uniform_init, "bias_uniform_init")
        checks.check_choice(layout, "layout", LAYOUTS)
        self.layout: Layout = layout
        self.custom = inv_freqs is not None
        self.freqs = pope_frequencies(self.dim, self.base, inv_freqs)
        checks.check_elements(self.heads * self.dim, f"PoPE bias of shape ({heads}, {dim})")
        self.bias = nn.Parameter(torch.empty(self.heads, self.dim))
        self.reset_parameters()

    def extra_repr(self) -> str:
        base = "inv_freqs=custom" if self.custom else f"base={self.base:g}"
        return f"{self.dim}, heads={self.heads}, {base}, layout={self.layout!r}"

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        return {"inv_freqs": torch.tensor(self.freqs.inv_freq, dtype=torch.float32)}

    def _init_parameters(self) -> None:
        if self.bias_uniform_init:
            self.bias.uniform_(BIAS_MIN, 0.0)
        else:
            self.bias.zero_()

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # the references' state dicts: pope-pytorch keeps inv_freqs as state,
        # x-transformers' PolarEmbedding has learned_bias (heads, 1, dim) and inv_freq
        learned = state_dict.pop(prefix + "learned_bias", None)
        if learned is not None and prefix + "bias" not in state_dict:
            state_dict[prefix + "bias"] = learned.reshape(learned.shape[0], -1)
        for name in ("inv_freqs", "inv_freq"):
            given = state_dict.pop(prefix + name, None)
            if given is not None:
                self._check_frequencies(given, prefix + name)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _check_frequencies(self, given: torch.Tensor, name: str) -> None:
        """Refuse a checkpoint's frequencies that are not this module's.

        The references compute ``theta ** -(c / d)`` in float32: the exponent's rounding
        (``2**-24`` relative, times ``ln(base)``) and two roundings of ``pow`` or ``1 /``
        leave ``(ln(base) + 4) * 2**-24`` relative at most; a base 0.1% off moves
        ``theta_1`` by ``1e-3 / d`` already.
        """
        mine = torch.tensor(self.freqs.inv_freq, dtype=torch.float64)
        given = given.detach().to("cpu", torch.float64).reshape(-1)
        if self.custom:
            bound = 2.0**-24  # the same floats, rounded to float32 or not
        else:
            bound = (math.log(max(self.base, math.e)) + 4.0) * 2.0**-24
        if given.shape != mine.shape or not bool(((given - mine).abs() <= bound * mine).all()):
            raise ValueError(
                f"the state dict's {name} are not this PoPE's frequencies "
                f"({self.extra_repr()}); build PoPE(..., inv_freqs=state_dict[{name!r}]) "
                "to use those"
            )

    def rotate_pair(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
    ) -> RotatedPair:
        """``q`` and ``k`` as PoPE's polar channels at their positions, for the engine.

        The :class:`posenc.rotary.rotation.PairRotation` protocol that
        :func:`posenc.attention` reads (:func:`pope_qk` with this module's bias,
        frequencies and layout).

        Raises:
            ValueError: as :func:`pope_qk`; q's heads not ``heads`` (unless ``heads`` 1).
        """
        self._check_heads(q)
        qr, kr = pope_qk(q, k, q_positions, k_positions, self.bias, self.freqs, layout=self.layout)
        return RotatedPair(qr, kr)

    def _check_heads(self, q: torch.Tensor) -> None:
        if q.ndim == 4 and self.heads != 1 and q.shape[1] != self.heads:
            raise ValueError(
                f"PoPE has a bias for heads={self.heads} query heads; q has {q.shape[1]} "
                f"(shape {tuple(q.shape)})"
            )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None = None,
        offset: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """PoPE's ``(q', k')``: keys at ``positions``, queries at the last ``q_len`` of them.

        Args:
            q: ``(batch, heads, q_len, head_dim)``.
            k: ``(batch, kv_heads, k_len, head_dim)``, ``k_len >= q_len`` (a KV cache
                holds the earlier keys, as the references' ``freqs[-q_len:]``).
            positions: the keys' ``(k_len,)`` or ``(batch, k_len)`` positions; ``None``
                means ``offset .. offset + k_len - 1``.
            offset: the first position when ``positions`` is None.

        Returns:
            ``(q', k')`` with ``2 * dim + head_dim - dim`` channels, in the inputs' dtype.

        Raises:
            TypeError: as :func:`pope_qk`; a non-int ``offset``.
            ValueError: as :func:`pope_qk`; ``q_len > k_len``; ``positions`` and a
                non-zero ``offset``.
        """
        checks.check_float_tensor(q, "q")
        checks.check_float_tensor(k, "k")
        if q.ndim != 4 or k.ndim != 4 or q.shape[2] > k.shape[2]:
            raise ValueError(
                "q must be (batch, heads, q_len, head_dim) and k (batch, kv_heads, k_len, "
                f"head_dim) with q_len <= k_len; got {tuple(q.shape)} and {tuple(k.shape)}"
            )
        if positions is None:
            checks.check_int(offset, "offset", minimum=-(2**31) + 1)
            positions = torch.arange(offset, offset + k.shape[2], device=k.device)
        else:
            if not checks.is_zero(offset):
                raise ValueError("pass positions or offset, not both: positions are absolute")
            positions = checks.check_position_tensor(positions, "positions")
        cached = k.shape[2] - q.shape[2]
        pair = self.rotate_pair(q, k, positions[..., cached:] if cached else positions, positions)
        return pair.q, pair.k
