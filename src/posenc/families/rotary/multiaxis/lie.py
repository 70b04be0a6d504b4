"""LieRE and ComRoPE: dense rotations ``exp(sum_a p_a G_a)`` of learned skew-symmetric generators.

A token at coordinates ``p`` (``axes`` of them: row and column of an image patch) has
its query and key turned by ``R(p) = matrix_exp(sum_a p_a G_a)``, block by block:
the first ``blocks * block_size`` channels of a head are cut into ``blocks`` blocks of
``block_size`` channels, block ``j`` turned by the exponential of its own
``(block_size, block_size)`` generators ``G_{a,j}``; the other channels pass through.
Every ``G`` is skew-symmetric, so ``R(p)`` is a rotation and ``q_i' . k_j' = q_i^T
R(p_i)^T R(p_j) k_j``. RoPE is the case of ``2 x 2`` blocks ``omega J``.

- LieRE (Ostmeier et al. 2024, arXiv:2406.10322; StanfordMIMI/LieRE
  ``models/rope_vit.py`` ``LierePositionEncoder``): any generators. The parameter
  ``generator_raw_params`` ``(axes, 1, heads * blocks, b, b)`` (the repository's
  ``(input_dimensionality, generators_for_layers, num_generators, generator_dim,
  generator_dim)``, heads outermost in ``num_generators``) is drawn uniform in ``[0,
  2 pi)`` (its ``initialization_factor``); ``G = U - U^T`` with ``U`` its strict
  upper triangle. One block of the whole head by default (``generator_dim`` 64 in
  ``models/model_args.py`` with its 64-channel heads; RoPE-Mixed there is ``b = 2``).
  ``R(p_i)^T R(p_j)`` depends on both positions, not only on ``p_j - p_i``.
- ComRoPE (Yu et al. 2025, arXiv:2506.03737; Longin-Yu/ComRoPE ``model.py``):
  generators that commute, so ``R(p_i)^T R(p_j) = R(p_j - p_i)`` exactly (RoPE's
  relative property). ComRoPE-AP (``ComRoPEAPAttention``): one ``freqs`` ``(heads,
  1, blocks, b, b)``, ``G_{a,j} = P_j - P_j^T`` for the blocks ``j % axes == a`` and
  zero for the others (each axis turns its own blocks). ComRoPE-LD
  (``ComRoPELDAttention``): ``G_{a,j} = multiplier[a, j] (P_j - P_j^T)``, one shared
  matrix per block scaled per axis by ``multiplier`` ``(1, axes, blocks, 1, 1)``.
  ``freqs`` and ``multiplier`` are drawn normal (std ``init_std`` = 1 and 1);
  ``block_size`` 2 (``CustomVITConfig``).

Coordinates (:meth:`LieRotary.coords`): LieRE's ``PositionEncoderBase`` numbers an ``n``
patch axis ``linspace(0, 1, n)`` at the trained size; ComRoPE's ``get_positions``
(``axis_scale=True``) numbers it ``(i + 0.5) / n``. Both in ``(row, column)`` order,
rows outermost; LieRE gives its class token the identity (coordinates 0), ComRoPE the
coordinates ``cls_position`` = 0.5.

Shapes: ``x`` ``(batch, heads, seq, head_dim)``; ``coords`` ``(n, axes)`` or ``(batch,
n, axes)`` with ``n <= seq``: the last ``n`` tokens are turned, the first ``seq - n``
(class tokens) pass through; generators ``(gen_heads, axes, blocks, b, b)`` with
``heads`` a multiple of ``gen_heads`` (query head ``i`` reads generator head ``i //
(heads / gen_heads)``, as grouped-query attention shares keys).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from posenc.core import checks
from posenc.core.buffers import DerivedBuffers

#: What ``LieRotary(kind=...)`` accepts.
LieKind = Literal["liere", "comrope-ap", "comrope-ld"]


def _liere_generators(params: dict[str, torch.Tensor], heads: int, axes: int) -> torch.Tensor:
    raw = params["generator_raw_params"][:, 0]  # (axes, heads * blocks, b, b)
    # the repository subtracts 0.5 from the triangle (a leftover of a sigmoid); it
    # cancels in U - U^T, so the generator is the raw strict upper triangle's
    upper = torch.triu(raw, diagonal=1)
    skew = upper - upper.transpose(-1, -2)
    return skew.unflatten(1, (heads, -1)).transpose(0, 1)


def _ap_generators(params: dict[str, torch.Tensor], heads: int, axes: int) -> torch.Tensor:
    p = params["freqs"]  # (heads, 1, blocks, b, b)
    skew = p - p.transpose(-1, -2)
    owner = torch.arange(p.shape[2], device=p.device) % axes
    mask = owner == torch.arange(axes, device=p.device)[:, None]  # (axes, blocks)
    return skew * mask[None, :, :, None, None].to(p.dtype)


def _ld_generators(params: dict[str, torch.Tensor], heads: int, axes: int) -> torch.Tensor:
    p = params["freqs"]  # (heads, 1, blocks, b, b)
    return (p - p.transpose(-1, -2)) * params["multiplier"]


def _uniform(params: dict[str, nn.Parameter], scale: float) -> None:
    params["generator_raw_params"].uniform_(0.0, scale)


def _normal(params: dict[str, nn.Parameter], scale: float) -> None:
    params["freqs"].normal_(0.0, scale)
    if "multiplier" in params:
        params["multiplier"].normal_(0.0, 1.0)


@dataclass(frozen=True)
class _Method:
    """One method: its parameters, how they are drawn and how they make the generators."""

    default_block: Callable[[int], int]  # head_dim -> block_size
    blocks: Callable[[int, int, int], int]  # (head_dim, axes, block_size) -> blocks
    shapes: Callable[[int, int, int, int], dict[str, tuple[int, ...]]]  # heads, axes, blocks, b
    init: Callable[[dict[str, nn.Parameter], float], None]
    init_scale: float
    generators: Callable[[dict[str, torch.Tensor], int, int], torch.Tensor]


_METHODS: dict[str, _Method] = {
    "liere": _Method(
        default_block=lambda head_dim: head_dim,
        blocks=lambda d, axes, b: d // b,
        shapes=lambda h, axes, n, b: {"generator_raw_params": (axes, 1, h * n, b, b)},
        init=_uniform,
        init_scale=2 * math.pi,
        generators=_liere_generators,
    ),
    "comrope-ap": _Method(
        default_block=lambda head_dim: 2,
        blocks=lambda d, axes, b: d // (axes * b) * axes,  # whole blocks for every axis
        shapes=lambda h, axes, n, b: {"freqs": (h, 1, n, b, b)},
        init=_normal,
        init_scale=1.0,
        generators=_ap_generators,
    ),
    "comrope-ld": _Method(
        default_block=lambda head_dim: 2,
        blocks=lambda d, axes, b: d // b,
        shapes=lambda h, axes, n, b: {"freqs": (h, 1, n, b, b), "multiplier": (1, axes, n, 1, 1)},
        init=_normal,
        init_scale=1.0,
        generators=_ld_generators,
    ),
}
KINDS = tuple(_METHODS)


def _check_generators(generators: Any) -> torch.Tensor:
    checks.check_float_tensor(generators, "generators")
    g = generators
    if g.ndim != 5 or g.shape[-1] != g.shape[-2] or 0 in g.shape:
        raise ValueError(
            "generators must be (gen_heads, axes, blocks, block_size, block_size), none "
            f"empty; got shape {tuple(g.shape)}"
        )
    if not checks.compiling() and not torch.equal(g, -g.transpose(-1, -2)):
        worst = (g + g.transpose(-1, -2)).abs().max().item()
        raise ValueError(
            "generators must be skew-symmetric (G == -G^T exactly: build them as A - "
            f"A.transpose(-1, -2)), or exp(G) is no rotation; max |G + G^T| = {worst:g}"
        )
    return g


def _check_coords(coords: Any, axes: int, name: str = "coords") -> torch.Tensor:
    coords = checks.check_position_tensor(coords, name, exact=True)
    if coords.ndim not in (2, 3) or coords.shape[-1] != axes:
        raise ValueError(
            f"{name} must be (n, {axes}) or (batch, n, {axes}); got shape {tuple(coords.shape)}"
        )
    return coords


def _matrices(coords: torch.Tensor, generators: torch.Tensor) -> torch.Tensor:
    """``exp(sum_a coords_a G_a)`` per block: ``coords.shape[:-1] + (gen_heads, blocks, b, b)``."""
    exponent = torch.einsum("...a,haJij->...hJij", coords, generators)
    if exponent.shape[:-2].numel() != 1:
        return torch.linalg.matrix_exp(exponent)
    # torch's path for a single matrix (its degree-8 Taylor, picked for 1-norms near
    # 0.2-0.6 in float32 and 0.01-0.05 in float64) is up to ~900 ulps off
    # (pytorch/pytorch#196592); the batched path is not: give it a second, zero matrix
    single = exponent.reshape(1, *exponent.shape[-2:])
    pair = torch.cat([single, torch.zeros_like(single)])
    return torch.linalg.matrix_exp(pair)[:1].reshape(exponent.shape)


def _turn(x: torch.Tensor, rotations: torch.Tensor, name: str = "x") -> torch.Tensor:
    """``x`` ``(batch, heads, seq, head_dim)`` turned by ``rotations`` ``([rows,] n, H, J, b, b)``.

    The last ``n`` tokens turn, the first ``seq - n`` pass through; computed in the
    rotations' dtype, rounded once to ``x``'s.
    """
    checks.check_float_tensor(x, name)
    if rotations.ndim == 5:
        rotations = rotations[None]
    rows, n, gen_heads, blocks, b = rotations.shape[:5]
    width = blocks * b
    if x.ndim != 4 or x.shape[-1] < width or x.shape[1] % gen_heads or x.shape[2] < n:
        raise ValueError(
            f"{name} must be (batch, heads, seq, head_dim) with head_dim >= {width} (the "
            f"rotated channels), heads a multiple of {gen_heads} (the generator heads) and "
            f"seq >= {n} (the tokens with coordinates); got shape {tuple(x.shape)}"
        )
    batch, heads, seq, _ = x.shape
    if rows not in (1, batch):
        raise ValueError(
            f"coords (or positions) give {rows} rows of coordinates; {name} has batch {batch}"
        )
    group = heads // gen_heads
    work = x[:, :, seq - n :, :width].to(rotations.dtype)
    work = work.reshape(batch, gen_heads, group, n, blocks, b, 1)
    turned = rotations.permute(0, 2, 1, 3, 4, 5)[:, :, None] @ work  # (B, H, g, n, J, b, 1)
    turned = turned.reshape(batch, heads, n, width).to(x.dtype)
    if n < seq:
        turned = torch.cat([x[:, :, : seq - n, :width], turned], dim=2)
    return torch.cat([turned, x[..., width:]], dim=-1)


def lie_rotate(x: torch.Tensor, coords: torch.Tensor, generators: torch.Tensor) -> torch.Tensor:
    """``x`` turned by ``matrix_exp(sum_a coords_a G_a)`` block by block (LieRE, ComRoPE).

    The functional form of :class:`LieRotary`: token ``t`` with coordinates ``p`` has
    channel block ``j`` (``b`` channels) of every head replaced by ``exp(sum_a p_a
    G[h, a, j]) x_j``; channels past ``blocks * b`` and the first ``seq - n`` tokens
    pass through. Computed in float32 (float64 for float64 ``x``), as the references
    take ``matrix_exp`` in float32.

    Args:
        x: ``(batch, heads, seq, head_dim)``.
        coords: ``(n, axes)`` or ``(batch, n, axes)`` coordinates of the last ``n <=
            seq`` tokens.
        generators: ``(gen_heads, axes, blocks, b, b)`` skew-symmetric, ``heads`` a
            multiple of ``gen_heads``.

    Returns:
        ``x`` turned, its shape and dtype.

    Raises:
        TypeError: ``x`` or ``generators`` not float tensors, ``coords`` not an int or
            float tensor.
        ValueError: generators not 5-D with square blocks or not exactly
            skew-symmetric, coordinates of another axis count, non-finite or beyond
            ``2**31``, shapes that do not fit ``x`` (named).

    Examples:
        >>> import math, torch
        >>> from posenc.rotary.multiaxis import lie_rotate
        >>> J = torch.tensor([[0.0, -1.0], [1.0, 0.0]])  # RoPE's generator: a 2 x 2 block
        >>> generators = torch.stack([J, 2 * J]).reshape(1, 2, 1, 2, 2)  # 2 axes, 1 block
        >>> x = torch.tensor([1.0, 0.0]).reshape(1, 1, 1, 2)
        >>> coords = torch.tensor([[math.pi / 6, math.pi / 6]])  # angle pi/6 + 2 pi/6
        >>> lie_rotate(x, coords, generators).flatten().round(decimals=4)
        tensor([0., 1.])
    """
    g = _check_generators(generators)
    coords = _check_coords(coords, g.shape[1])
    work = checks.work_dtype(x.dtype) if checks.is_torch(x) else torch.float32
    rotations = _matrices(coords.to(g.device, work), g.to(work))
    return _turn(x, rotations)


class LieRotary(DerivedBuffers):
    """LieRE and ComRoPE rotary embeddings: ``q' = exp(sum_a p_a G_a) q`` per channel block.

    One mechanism for three methods (Ostmeier et al. 2024; Yu et al. 2025): ``kind``
    picks how the learned skew-symmetric generators are made,
    under the parameter names of the reference repositories, so their tensors load
    with ``load_state_dict``:

    - ``"liere"`` (StanfordMIMI/LieRE ``LierePositionEncoder``): ``generator_raw_params``
      ``(axes, 1, heads * blocks, b, b)``; ``G = U - U^T`` of its strict upper triangle.
      A checkpoint with ``rotary_embedding_per_layer`` holds ``(axes, depth, ...)``:
      layer ``i`` loads ``[:, i : i + 1]``.
    - ``"comrope-ap"`` (Longin-Yu/ComRoPE ``ComRoPEAPAttention``): ``freqs`` ``(heads,
      1, blocks, b, b)``; block ``j`` turns with axis ``j % axes`` only.
    - ``"comrope-ld"`` (``ComRoPELDAttention``): ``freqs`` as above and ``multiplier``
      ``(1, axes, blocks, 1, 1)``: ``G_{a,j} = multiplier[a, j] (P_j - P_j^T)``.

    Args:
        head_dim: channels per head.
        heads: generator heads: the attention's (key) heads for one rotation per head
            (ComRoPE, LieRE's ``rotary_embedding_per_head``), or 1 for one shared by
            all.
        axes: coordinate axes (2 for images, 3 for video).
        kind: ``"liere"``, ``"comrope-ap"`` or ``"comrope-ld"``.
        block_size: channels per block ``b``; the whole head for LieRE (its
            ``generator_dim``), 2 for ComRoPE (its ``block_size``). ``head_dim //
            b`` blocks (ComRoPE-AP: ``head_dim // (axes * b)`` per axis) are turned,
            the rest pass through.
        init_scale: LieRE: the parameters are uniform in ``[0, init_scale)``
            (``initialization_factor``, ``2 pi``); ComRoPE: ``freqs`` is normal with
            std ``init_scale`` (``init_std``, 1).

    Attributes:
        blocks: turned blocks per head.
        rotary_dim: turned channels per head, ``blocks * block_size``.

    Raises:
        TypeError: non-int sizes, a non-numeric ``init_scale``.
        ValueError: sizes out of range, no whole block in a head, an unknown ``kind``,
            a negative ``init_scale``, parameters of more than
            :data:`posenc.core.checks.MAX_ELEMENTS` values.

    Examples:
        >>> import torch
        >>> from posenc.rotary.multiaxis import LieRotary
        >>> _ = torch.manual_seed(0)
        >>> lie = LieRotary(16, heads=2, kind="comrope-ld", block_size=4)
        >>> lie
        LieRotary(head_dim=16, heads=2, axes=2, kind='comrope-ld', block_size=4, blocks=4)
        >>> sorted((n, tuple(p.shape)) for n, p in lie.named_parameters())  # ComRoPE's
        [('freqs', (2, 1, 4, 4, 4)), ('multiplier', (1, 2, 4, 1, 1))]
        >>> coords = lie.coords(3, 3)  # a 3 x 3 patch grid: (9, 2), (i + 0.5) / 3
        >>> q, k = torch.randn(2, 1, 2, 9, 16)  # (batch, heads, seq, head_dim)
        >>> q1, k1 = lie(q, k, coords)
        >>> torch.allclose(q1.norm(dim=-1), q.norm(dim=-1))  # a rotation
        True
    """

    def __init__(
        self,
        head_dim: int,
        heads: int = 1,
        axes: int = 2,
        *,
        kind: LieKind = "liere",
        block_size: int | None = None,
        init_scale: float | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = checks.check_channels(head_dim, "head_dim", minimum=1)
        self.heads = checks.check_int(heads, "heads", minimum=1)
        self.axes = checks.check_int(axes, "axes", minimum=1)
        checks.check_choice(kind, "kind", KINDS)
        self.kind = kind
        method = _METHODS[kind]
        if block_size is None:
            block_size = method.default_block(self.head_dim)
        self.block_size = checks.check_int(block_size, "block_size", minimum=1)
        self.blocks = method.blocks(self.head_dim, self.axes, self.block_size)
        if self.blocks < 1:
            raise ValueError(
                f"{kind} needs at least one whole block of block_size={self.block_size} "
                f"channels{' per axis' if kind == 'comrope-ap' else ''} in head_dim="
                f"{self.head_dim} (axes={self.axes})"
            )
        self.rotary_dim = self.blocks * self.block_size
        scale = method.init_scale if init_scale is None else init_scale
        self.init_scale = checks.check_number(scale, "init_scale")
        if self.init_scale < 0:
            raise ValueError(f"init_scale must be >= 0; got {init_scale}")
        shapes = method.shapes(self.heads, self.axes, self.blocks, self.block_size)
        checks.check_elements(
            sum(math.prod(s) for s in shapes.values()), f"{kind} generator parameters {shapes}"
        )
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.empty(shape)))
        self.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, heads={self.heads}, axes={self.axes}, "
            f"kind={self.kind!r}, block_size={self.block_size}, blocks={self.blocks}"
        )

    def _params(self) -> dict[str, nn.Parameter]:
        return dict(self.named_parameters(recurse=False))

    def _init_parameters(self) -> None:
        _METHODS[self.kind].init(self._params(), self.init_scale)

    def generators(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The skew-symmetric generators ``(heads, axes, blocks, b, b)``, from the parameters.

        In ``dtype`` (the parameters' by default), differentiable in them.
        """
        params = {n: p if dtype is None else p.to(dtype) for n, p in self._params().items()}
        return _METHODS[self.kind].generators(params, self.heads, self.axes)

    def matrices(self, coords: torch.Tensor, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The rotations at ``coords`` ``(..., axes)``: ``(..., heads, blocks, b, b)``.

        Raises:
            TypeError: ``coords`` not an int or float tensor.
            ValueError: ``coords`` without ``axes`` coordinates last, non-finite or
                beyond ``2**31``.
        """
        coords = checks.check_position_tensor(coords, "coords", exact=True)
        if coords.ndim < 1 or coords.shape[-1] != self.axes:
            raise ValueError(f"coords must be (..., {self.axes}); got shape {tuple(coords.shape)}")
        device = next(iter(self._params().values())).device
        return _matrices(coords.to(device, dtype), self.generators(dtype))

    def coords(
        self, *sizes: int, cls_token: bool = False, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """The reference's coordinates of a ``sizes`` patch grid (``height, width``), ``(n, axes)``.

        Rows outermost, ``(row, column)`` per patch: LieRE ``linspace(0, 1, n)`` per
        axis (its ``PositionEncoderBase`` at the trained size), ComRoPE ``(i + 0.5) /
        n`` (``get_positions`` with ``axis_scale``). ``cls_token`` prepends the
        reference's class-token coordinates: zeros (LieRE: the identity) or 0.5
        (ComRoPE's ``cls_position``).

        Raises:
            ValueError: not one size per axis, a size below 1.

        Examples:
            >>> from posenc.rotary.multiaxis import LieRotary
            >>> LieRotary(8).coords(2, 3).tolist()  # LieRE: linspace(0, 1, n)
            [[0.0, 0.0], [0.0, 0.5], [0.0, 1.0], [1.0, 0.0], [1.0, 0.5], [1.0, 1.0]]
            >>> LieRotary(8, kind="comrope-ap").coords(1, 2, cls_token=True).tolist()
            [[0.5, 0.5], [0.5, 0.25], [0.5, 0.75]]
        """
        if len(sizes) != self.axes:
            raise ValueError(f"coords needs one size per axis ({self.axes}); got {sizes}")
        sizes = tuple(checks.check_int(n, "sizes", minimum=1) for n in sizes)
        checks.check_bool(cls_token, "cls_token")
        checks.check_elements(math.prod(sizes) * self.axes, f"the grid of sizes {sizes}")
        if self.kind == "liere":
            per_axis = [torch.linspace(0, 1, n, dtype=dtype) for n in sizes]
            cls = 0.0
        else:
            per_axis = [(torch.arange(n, dtype=dtype) + 0.5) / n for n in sizes]
            cls = 0.5
        grid = torch.stack(torch.meshgrid(*per_axis, indexing="ij"), dim=-1).reshape(-1, self.axes)
        if cls_token:
            grid = torch.cat([grid.new_full((1, self.axes), cls), grid])
        return grid

    def rotation(self, coords: torch.Tensor) -> LieRotation:
        """This rotation at fixed token coordinates ``(n, axes)``, for :func:`posenc.attention`.

        A :class:`posenc.rotary.rotation.Rotation`: position ``p`` reads ``coords[p]``
        (prepend the class token's with ``coords(..., cls_token=True)``).

        Raises:
            TypeError: ``coords`` not an int or float tensor.
            ValueError: ``coords`` not ``(n, axes)``, non-finite or beyond ``2**31``.
        """
        return LieRotation(self, coords)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, coords: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Turn ``q`` and ``k`` ``(batch, heads, seq, head_dim)`` at ``coords``.

        ``coords`` ``(n, axes)`` or ``(batch, n, axes)``, ``n <= seq``: the last ``n``
        tokens turn, the first ``seq - n`` (class tokens) pass through. Computed in
        float32 (float64 for float64 inputs); ``q`` and ``k`` may differ in heads, both
        multiples of ``heads``.

        Raises:
            TypeError: non-float ``q`` or ``k`` or of different dtypes, bad ``coords``.
            ValueError: shapes that do not fit (named).
        """
        checks.check_float_tensor(q, "q")
        checks.check_float_tensor(k, "k")
        if q.dtype != k.dtype:
            raise TypeError(f"q and k must have the same dtype; got {q.dtype} and {k.dtype}")
        for name, t in (("q", q), ("k", k)):
            if t.ndim != 4 or t.shape[-1] != self.head_dim:
                raise ValueError(
                    f"{name} must be (batch, heads, seq, head_dim={self.head_dim}); got shape "
                    f"{tuple(t.shape)}"
                )
        coords = _check_coords(coords, self.axes)
        rotations = self.matrices(coords.to(q.device), dtype=checks.work_dtype(q.dtype))
        return _turn(q, rotations, "q"), _turn(k, rotations, "k")


class LieRotation:
    """A :class:`LieRotary` at fixed token coordinates, as a rotation for attention.

    Made by :meth:`LieRotary.rotation`; position ``p`` reads ``coords[p]``.
    """

    def __init__(self, module: LieRotary, coords: torch.Tensor) -> None:
        coords = _check_coords(coords, module.axes)
        if coords.ndim != 2:
            raise ValueError(f"coords must be (n, {module.axes}); got shape {tuple(coords.shape)}")
        self.module, self.coords = module, coords

    def rotate(
        self, xs: Sequence[torch.Tensor], positions: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Every ``x`` ``(batch, heads, seq, head_dim)`` of ``xs`` turned at ``coords[positions]``.

        ``positions`` ``(seq,)`` or ``(rows, seq)`` int, each in ``[0, n)``.

        Raises:
            ValueError: positions outside ``coords``, tensors that do not fit.
        """
        if not xs:
            return ()
        positions = checks.check_position_tensor(positions, "positions", floats=False)
        n = self.coords.shape[0]
        if positions.ndim not in (1, 2):
            raise ValueError(
                f"positions must be (seq,) or (rows, seq); got {tuple(positions.shape)}"
            )
        if positions.numel() and not checks.compiling():
            lo, hi = int(positions.min()), int(positions.max())
            if lo < 0 or hi >= n:
                raise ValueError(f"positions index the {n} token coordinates; got {lo} .. {hi}")
        work = checks.work_dtype(xs[0].dtype)
        where = self.coords.to(positions.device)[positions]
        rotations = self.module.matrices(where, dtype=work).to(xs[0].device)
        return tuple(_turn(x, rotations) for x in xs)

    def __repr__(self) -> str:
        return f"LieRotation({self.module.kind!r}, tokens={self.coords.shape[0]})"
