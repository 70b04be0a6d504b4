"""RoPE-Mixed: 2-D rotary embedding with learned frequencies that mix both axes.

Heo et al. 2024, "Rotary Position Embedding for Vision Transformer" (arXiv:2403.13298),
section 3.3; naver-ai/rope-vit ``models/vit_rope.py`` (``init_random_2d_freqs``,
``compute_mixed_cis``) and timm's ``RotaryEmbeddingMixed``
(``timm/layers/pos_embed_sincos.py``), which loads rope-vit's checkpoints.

Pair ``c`` of head ``h`` of a patch at ``(x, y)`` (``x`` the column, ``y`` the row,
rope-vit's ``init_t_xy``) turns by::

    theta[h, c] = x * fx[h, c] + y * fy[h, c]

with ``fx`` and ``fy`` learned per head and pair (per block too: timm's ``freqs`` is
``(2, depth, num_heads, head_dim / 2)``). Pairs are interleaved (channels ``2c`` and
``2c + 1``: rope-vit's complex multiply, timm's ``apply_rot_embed_cat(half=False)``).
At initialisation (``init_random_2d_freqs``, ``rotate=True``, theta 10) each head of
each block draws one angle ``a ~ U(0, 2 pi)``; with magnitudes ``m_j = theta **
(-4j / head_dim)``, ``j < head_dim / 4``, the first ``head_dim / 4`` pairs point along
``(cos a, sin a)`` and the others along ``(cos(a + pi/2), sin(a + pi/2))``::

    fx = cat(m cos a, -m sin a),    fy = cat(m sin a, m cos a)

posenc forms ``theta`` and its ``cos`` and ``sin`` in float64 (on CPU and CUDA; in
float32 elsewhere) from the float32 frequencies and coordinates, and rounds them once
to float32; the references do it all in float32 (an angle error of about ``|theta| *
2**-23``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from posenc.core import checks
from posenc.core.angles import float64_is_fast
from posenc.core.buffers import DerivedBuffers
from posenc.families.rotary.multiaxis.coordinates import (
    CoordinateRotation,
    check_coords,
    rotate_patches,
)


def mixed_frequencies(
    head_dim: int,
    num_heads: int,
    depth: int = 1,
    *,
    theta: float = 10.0,
    rotate: bool = True,
    generator: torch.Generator | None = None,
    device: Any = None,
) -> torch.Tensor:
    """RoPE-Mixed's initial frequencies, ``(2, depth, num_heads, head_dim // 2)`` float32.

    rope-vit's ``init_random_2d_freqs`` (and timm's, vectorised): ``[fx, fy]`` with
    ``fx = cat(m cos a, -m sin a)`` and ``fy = cat(m sin a, m cos a)``, ``m_j = theta **
    (-4j / head_dim)``, one angle ``a = 2 pi u`` per head and block (``u`` drawn as
    ``torch.rand(depth, num_heads, 1)``, the draws timm makes; 0 without ``rotate``).
    Computed in float64, rounded once.

    Raises:
        TypeError: non-int sizes, a non-numeric ``theta``, a non-bool ``rotate``.
        ValueError: ``head_dim`` not a multiple of 4, sizes below 1, ``theta`` <= 0.

    Examples:
        >>> from posenc.rotary.multiaxis import mixed_frequencies
        >>> f = mixed_frequencies(8, num_heads=2, depth=3, rotate=False)
        >>> f.shape  # (x and y, depth, heads, head_dim / 2)
        torch.Size([2, 3, 2, 4])
        >>> f[0, 0, 0].tolist(), f[1, 0, 0].tolist()  # a = 0: pairs 0-1 read x, 2-3 read y
        ([1.0, 0.3162277638912201, -0.0, -0.0], [0.0, 0.0, 1.0, 0.3162277638912201])
    """
    head_dim = checks.check_channels(head_dim, "head_dim", minimum=4)
    if head_dim % 4:
        raise ValueError(
            f"head_dim must be a multiple of 4 (x and y halves of pairs); got {head_dim}"
        )
    num_heads = checks.check_int(num_heads, "num_heads", minimum=1)
    depth = checks.check_int(depth, "depth", minimum=1)
    theta = checks.check_number(theta, "theta", positive=True)
    checks.check_bool(rotate, "rotate")
    checks.check_elements(depth * num_heads * head_dim, "RoPE-Mixed frequencies")
    mag = torch.tensor(
        [theta ** (-4 * j / head_dim) for j in range(head_dim // 4)],
        dtype=torch.float64,
        device=device,
    )
    if rotate:
        u = torch.rand(depth, num_heads, 1, generator=generator, device=device)
        a = u.to(torch.float64) * (2 * math.pi)
    else:
        a = torch.zeros(depth, num_heads, 1, dtype=torch.float64, device=device)
    # cos(a + pi/2) = -sin(a) and sin(a + pi/2) = cos(a): the reference's second half
    fx = torch.cat([mag * a.cos(), -mag * a.sin()], dim=-1)
    fy = torch.cat([mag * a.sin(), mag * a.cos()], dim=-1)
    return torch.stack([fx, fy]).to(torch.float32)


def mixed_cos_sin(
    freqs: torch.Tensor, coords: torch.Tensor, *, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of ``x * fx + y * fy``, interleaved, differentiable in ``freqs``.

    timm's ``get_mixed_freqs`` (rope-vit's ``compute_mixed_cis``) as ``(cos, sin)``:
    each angle twice, ``theta0, theta0, theta1, theta1 ...`` (the layout of
    :func:`posenc.apply_rotary` with ``layout="interleaved"``). The angle and its
    ``cos``/``sin`` are formed in float64 (CPU, CUDA) and rounded once to ``dtype``.

    Args:
        freqs: ``(2, ..., head_dim // 2)``: ``fx`` and ``fy`` for any leading dims
            (``(heads,)`` or timm's ``(depth, heads)``).
        coords: ``(n, 2)`` or ``(batch, n, 2)`` float ``(x, y)`` coordinates.
        dtype: the result's dtype.

    Returns:
        ``(cos, sin)``, each ``coords.shape[:-2] + freqs.shape[1:-1] + (n, head_dim)``.

    Raises:
        TypeError: ``freqs`` or ``coords`` not float tensors.
        ValueError: ``freqs`` not ``(2, ..., pairs)``; ``coords`` not ``(..., n, 2)`` or
            not finite; tables of more than :data:`posenc.core.checks.MAX_ELEMENTS`.

    Examples:
        >>> import torch
        >>> from posenc.rotary.multiaxis import mixed_cos_sin
        >>> freqs = torch.tensor([[[1.0, 0.0]], [[0.0, 0.5]]])  # (2, heads=1, 2 pairs)
        >>> coords = torch.tensor([[0.0, 0.0], [2.0, 1.0]])  # (x, y) of two patches
        >>> cos, sin = mixed_cos_sin(freqs, coords)
        >>> cos.shape  # (heads, n, head_dim)
        torch.Size([1, 2, 4])
        >>> torch.atan2(sin, cos)[0, 1]  # pair 0 turns by x * 1, pair 1 by y * 0.5
        tensor([2.0000, 2.0000, 0.5000, 0.5000])
    """
    freqs = checks.check_float_tensor(freqs, "freqs")
    if freqs.ndim < 2 or freqs.shape[0] != 2:
        raise ValueError(
            f"freqs must be (2, ..., head_dim // 2): fx and fy; got shape {tuple(freqs.shape)}"
        )
    coords = check_coords(coords)
    lead, pairs = freqs.shape[1:-1], freqs.shape[-1]
    n, rows = coords.shape[-2], coords.shape[:-2]
    if not torch.compiler.is_compiling():
        checks.check_elements(
            math.prod(rows) * math.prod(lead) * n * 2 * pairs,
            f"RoPE-Mixed tables of coords {tuple(coords.shape)} x freqs {tuple(freqs.shape)}",
        )
    work = torch.float64 if float64_is_fast(freqs.device) else torch.float32
    f = freqs.to(work)
    c = coords.to(device=freqs.device, dtype=work)
    shape = (*rows, *([1] * len(lead)), n, 1)
    x, y = c[..., 0].reshape(shape), c[..., 1].reshape(shape)
    angle = x * f[0].unsqueeze(-2) + y * f[1].unsqueeze(-2)  # (*rows, *lead, n, pairs)
    cos = angle.cos().repeat_interleave(2, dim=-1).to(dtype)
    sin = angle.sin().repeat_interleave(2, dim=-1).to(dtype)
    return cos, sin


class RoPEMixed(DerivedBuffers):
    """RoPE-Mixed (Heo et al. 2024): learned per-head frequencies that mix x and y.

    ``freqs`` is timm's ``RotaryEmbeddingMixed.freqs``, ``(2, depth, num_heads,
    head_dim // 2)`` (one set per block: a timm state dict loads with
    ``load_state_dict``, and so does rope-vit's ``freqs``, ``(2, depth, num_heads *
    head_dim // 2)``), initialised as rope-vit's ``init_random_2d_freqs``
    (:func:`mixed_frequencies`). ``rope(q, k, coords)`` rotates the last ``n`` tokens
    of ``q`` and ``k`` by :func:`mixed_cos_sin` of block ``block_index``'s
    frequencies; the first ``seq - n`` (class and register tokens) pass through, as
    in rope-vit and timm's ``Attention``.

    Args:
        head_dim: channels per head, a multiple of 4.
        num_heads: attention heads (each has its own frequencies).
        depth: blocks with their own frequencies (timm's ``depth``); 1 for one layer.
        theta: the magnitude base (rope-vit's ``rope_theta``: 10 for RoPE-Mixed).
        rotate: draw a random direction per head (rope-vit's default).

    Shapes: ``q``, ``k`` ``(batch, num_heads, seq, head_dim)``; ``coords`` ``(n, 2)``
    or ``(batch, n, 2)`` float ``(x, y)`` with ``n <= seq`` (:meth:`coords`).

    Raises:
        TypeError, ValueError: as :func:`mixed_frequencies`.

    Examples:
        >>> import torch
        >>> from posenc.rotary.multiaxis import RoPEMixed
        >>> _ = torch.manual_seed(0)
        >>> rope = RoPEMixed(32, 4, depth=2)
        >>> rope
        RoPEMixed(head_dim=32, num_heads=4, depth=2, theta=10)
        >>> coords = rope.coords(3, 4)  # (12, 2): (x, y) = (column, row)
        >>> coords[5].tolist()
        [1.0, 1.0]
        >>> q, k = torch.randn(2, 1, 4, 13, 32)  # a class token, then 12 patches
        >>> q2, k2 = rope(q, k, coords, block_index=1)
        >>> torch.equal(q2[:, :, 0], q[:, :, 0]), q2.shape  # the class token passes through
        (True, torch.Size([1, 4, 13, 32]))
    """

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        *,
        depth: int = 1,
        theta: float = 10.0,
        rotate: bool = True,
    ) -> None:
        super().__init__()
        head_dim = checks.check_channels(head_dim, "head_dim", minimum=4)
        if head_dim % 4:
            raise ValueError(
                f"head_dim must be a multiple of 4 (x and y halves of pairs); got {head_dim}"
            )
        self.head_dim = head_dim
        self.num_heads = checks.check_int(num_heads, "num_heads", minimum=1)
        self.depth = checks.check_int(depth, "depth", minimum=1)
        self.theta = checks.check_number(theta, "theta", positive=True)
        self.rotate = checks.check_bool(rotate, "rotate")
        checks.check_elements(self.depth * self.num_heads * head_dim, "RoPE-Mixed frequencies")
        self.freqs = nn.Parameter(torch.empty(2, self.depth, self.num_heads, head_dim // 2))
        self.reset_parameters()

    def _init_parameters(self) -> None:
        self.freqs.copy_(
            mixed_frequencies(
                self.head_dim,
                self.num_heads,
                self.depth,
                theta=self.theta,
                rotate=self.rotate,
                device=self.freqs.device,
            )
        )

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # rope-vit's checkpoints hold freqs as (2, depth, num_heads * head_dim / 2), heads
        # outermost (its compute_mixed_cis views them so); timm's are split per head
        key = prefix + "freqs"
        value = state_dict.get(key)
        flat = (2, self.depth, self.num_heads * self.head_dim // 2)
        if isinstance(value, torch.Tensor) and tuple(value.shape) == flat and self.num_heads > 1:
            state_dict[key] = value.reshape(self.freqs.shape)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, depth={self.depth}, "
            f"theta={self.theta:g}"
        )

    def coords(self, height: int, width: int, *, device: Any = None) -> torch.Tensor:
        """The ``(x, y)`` of every patch of a ``height x width`` grid, ``(height * width, 2)``.

        Row-major, ``x`` the column and ``y`` the row, float32: rope-vit's
        ``init_t_xy`` (timm's grid with ``grid_indexing="xy"``, as its RoPE-Mixed
        ViTs set it).

        Raises:
            ValueError: sizes below 1.
        """
        height = checks.check_int(height, "height", minimum=1)
        width = checks.check_int(width, "width", minimum=1)
        checks.check_elements(2 * height * width, f"the coordinates of a {height} x {width} grid")
        device = self.freqs.device if device is None else device
        rows, cols = torch.meshgrid(
            torch.arange(height, device=device), torch.arange(width, device=device), indexing="ij"
        )
        return torch.stack([cols.flatten(), rows.flatten()], dim=-1).to(torch.float32)

    def _block(self, block_index: int) -> torch.Tensor:
        if isinstance(block_index, bool) or not isinstance(block_index, int):
            raise TypeError(f"block_index must be an int; got {type(block_index).__name__}")
        if not 0 <= block_index < self.depth:
            raise ValueError(f"block_index must be in [0, depth={self.depth}); got {block_index}")
        return self.freqs[:, block_index]

    def cos_sin(
        self, coords: torch.Tensor, *, block_index: int = 0, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`mixed_cos_sin` of block ``block_index``: ``(..., num_heads, n, head_dim)``.

        Raises:
            TypeError, ValueError: a ``block_index`` outside ``[0, depth)``; as
                :func:`mixed_cos_sin`.
        """
        return mixed_cos_sin(self._block(block_index), coords, dtype=dtype)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, coords: torch.Tensor, *, block_index: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate the last ``n`` tokens of ``q`` and ``k`` by their ``coords`` ``(n, 2)``.

        Returns:
            ``(q', k')`` shaped and typed like ``q`` and ``k`` (rotated in float32,
            float64 for float64 inputs).

        Raises:
            TypeError: non-float ``q``/``k`` of different dtypes, bad ``coords``.
            ValueError: ``q``/``k`` not ``(batch, num_heads, seq, head_dim)``, more
                coordinates than tokens, a bad ``block_index``.
        """
        freqs = self._block(block_index)
        return rotate_patches(
            lambda c, dtype: mixed_cos_sin(freqs, c, dtype=dtype),
            q,
            k,
            coords,
            layout="interleaved",
            head_dim=self.head_dim,
            heads=self.num_heads,
        )

    def rotation(self, coords: torch.Tensor, *, block_index: int = 0) -> CoordinateRotation:
        """This rotation for :func:`posenc.attention`'s ``rotary=``: token ``p`` at ``coords[p]``.

        ``coords`` is ``(seq, 2)``, one row per token (a class token at ``(0, 0)`` is
        not rotated); the frequencies stay differentiable.

        Examples:
            >>> import torch
            >>> import posenc
            >>> from posenc.rotary.multiaxis import RoPEMixed
            >>> rope = RoPEMixed(16, 2)
            >>> coords = torch.cat([torch.zeros(1, 2), rope.coords(2, 2)])  # class token first
            >>> q = k = v = torch.randn(1, 2, 5, 16)
            >>> posenc.attention(q, k, v, rotary=rope.rotation(coords)).shape
            torch.Size([1, 2, 5, 16])
        """
        freqs = self._block(block_index)
        return CoordinateRotation(
            lambda c, dtype: mixed_cos_sin(freqs, c, dtype=dtype),
            coords,
            layout="interleaved",
            head_dim=self.head_dim,
            heads=self.num_heads,
        )
