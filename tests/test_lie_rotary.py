"""LieRE and ComRoPE (``LieRotary``, ``lie_rotate``) against a float64 formula.

Neither reference can be installed: StanfordMIMI/LieRE is a training repository (no
package on PyPI; ``models/rope_vit.py`` imports ipdb and lightning's modules) and
Longin-Yu/ComRoPE is a single ``model.py`` on top of transformers' CLIP, not on PyPI
either. So the truth here is the papers' formula in float64, written without posenc's
code: ``x' = exp(sum_a p_a A_a) x`` with ``A_a`` the dense ``head_dim x head_dim``
block-diagonal matrix of one axis's generators, each generator built from the
parameters as the repository builds it, and the whole matrix exponentiated at once
(not block by block) by ``torch.linalg.matrix_exp`` in float64, which
``test_float64_matrix_exp_against_mpmath`` checks against mpmath's ``expm`` at 40
digits.

Conventions read from the repositories:

- LieRE, ``models/rope_vit.py``: ``LierePositionEncoder.generator_raw_params``
  ``(input_dimensionality, generators_for_layers, num_generators, generator_dim,
  generator_dim)``, ``torch.rand * 2 pi``; ``upper = triu(raw, 1) - 0.5``, ``G = upper
  - upper^T``; ``num_generators = head_dim // generator_dim * heads``, heads
  outermost (``FlexibleAttention.apply_transforms`` views it ``(heads, rotators)``),
  each block turned ``R @ x``, channels past the blocks passed through; positions of
  ``PositionEncoderBase``: ``cartesian_prod(linspace(0, 1, n) ...)`` at the trained
  size (``tests/test_position_encoding.py::test_base`` lists the 4 x 4 grid); the
  CLS token gets the identity.
- ComRoPE, ``model.py``: ``ComRoPEAPAttention.freqs`` ``(num_heads, 1, total_blocks,
  b, b)`` with ``mask[a, j] = 1`` iff ``j % num_axes == a``; ``ComRoPELDAttention``
  ``freqs`` and ``multiplier`` ``(1, num_axes, num_blocks, 1, 1)``, ``G = (P - P^T) *
  multiplier``; ``RoPESelfAttentionBase.get_rotation_matrix``: ``exp(sum_a A_a p_a)``
  placed block-diagonally, ``Q = R Q``; ``CustomVITConfig.get_positions``: ``(i + 0.5)
  / n`` (``axis_scale``), the CLS token at ``cls_position`` 0.5.

Tolerances are derived, per token and block of ``b`` channels (``eps`` the unit
roundoff, ``2**-24`` for float32)::

    |ours - truth| <= ||x_block|| eps (K b (8 + ||A||_1) + (axes + 2) sum_a |p_a| ||G_a||_F + b)

- the exponent ``A = sum_a p_a G_a`` is rounded: each entry within ``(axes + 1) eps
  sum_a |p_a G_a|`` (one more for ComRoPE-LD's product with ``multiplier``); ``exp``
  is 1-Lipschitz on skew-symmetric matrices in the 2-norm (``d exp(A)[E] = int_0^1
  e^{sA} E e^{(1-s)A} ds`` with orthogonal ``e^{sA}``), so ``R`` moves by at most
  ``||dA||_2 <= ||dA||_F``;
- ``matrix_exp`` (Taylor polynomials with scaling and squaring, Bader, Blanes and
  Casas 2019) squares ``s ~ log2(||A||_1)`` times, each squaring doubling the error
  and adding ``b eps``: ``K b eps (8 + ||A||_1)`` with ``K = 4``, which the mpmath
  test holds float64 to (measured at most 1.4);
- ``R x``: ``b`` products and sums, ``b eps ||x_block||``.

A generator off by 0.1% moves ``R x`` by about ``1e-3 |p| ||G|| ||x||``, hundreds of
times the bound: the near-miss tests show the comparison failing.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from conftest import anchor
from posenc.families.rotary.multiaxis import AxialRotary, LieRotary, axial_grid, lie_rotate

mpmath = anchor("mpmath")

EPS32 = 2.0**-24
EPS64 = 2.0**-53
K = 4.0
KINDS = ("liere", "comrope-ap", "comrope-ld")


def expm64(a: torch.Tensor) -> torch.Tensor:
    """float64 ``exp`` of ``(..., n, n)``, always batched (torch's single-matrix path is
    off by up to ~1e-10 in float64: pytorch/pytorch#196592)."""
    flat = a.reshape(-1, *a.shape[-2:]).double()
    padded = torch.cat([flat, torch.zeros_like(flat[:1])])
    return torch.linalg.matrix_exp(padded)[:-1].reshape(a.shape)


def repo_generators(kind: str, params: dict[str, torch.Tensor], heads: int, axes: int):
    """``(heads, axes, blocks, b, b)`` float64, each as its repository builds it."""
    if kind == "liere":  # rope_vit.py: triu(raw, 1) - 0.5, minus its transpose
        raw = params["generator_raw_params"].double()[:, 0]  # (axes, heads * blocks, b, b)
        upper = torch.triu(raw, diagonal=1) - 0.5
        bases = upper - upper.transpose(-1, -2)
        blocks = bases.shape[1] // heads
        return torch.stack(
            [
                torch.stack([bases[a, h * blocks : (h + 1) * blocks] for a in range(axes)])
                for h in range(heads)
            ]
        )
    freqs = params["freqs"].double()
    skew = freqs - freqs.transpose(-1, -2)  # (heads, 1, blocks, b, b)
    blocks = freqs.shape[2]
    if kind == "comrope-ap":  # block j belongs to axis j % num_axes
        out = torch.zeros(heads, axes, *skew.shape[2:], dtype=torch.float64)
        for j in range(blocks):
            out[:, j % axes, j] = skew[:, 0, j]
        return out
    return skew * params["multiplier"].double()  # comrope-ld


def dense(blocks: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``(heads, axes, head_dim, head_dim)``: the blocks on the diagonal, zeros elsewhere."""
    heads, axes, count, b, _ = blocks.shape
    out = torch.zeros(heads, axes, head_dim, head_dim, dtype=torch.float64)
    for j in range(count):
        out[:, :, j * b : (j + 1) * b, j * b : (j + 1) * b] = blocks[:, :, j]
    return out


def _rows(coords: torch.Tensor) -> torch.Tensor:
    c = coords.double()
    return c[None] if c.ndim == 2 else c


def truth(x: torch.Tensor, coords: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """The last ``n`` tokens of ``x`` turned by the dense ``exp(sum_a p_a A_a)``, float64."""
    x = x.double()
    batch, heads_x, seq, head_dim = x.shape
    c = _rows(coords)
    n = c.shape[1]
    rot = expm64(torch.einsum("bta,hade->bthde", c, dense(blocks, head_dim)))
    rot = rot.repeat_interleave(heads_x // blocks.shape[0], dim=2).expand(batch, -1, -1, -1, -1)
    out = x.clone()
    out[:, :, seq - n :] = torch.einsum("bthde,bhte->bhtd", rot, x[:, :, seq - n :])
    return out


def bound(x: torch.Tensor, coords: torch.Tensor, blocks: torch.Tensor, eps: float) -> torch.Tensor:
    """The derived bound of the module docstring, per element of ``x`` (0 where it passes)."""
    x = x.double()
    heads, axes, count, b, _ = blocks.shape
    c = _rows(coords)
    n = c.shape[1]
    exponent = torch.einsum("bta,haJij->bthJij", c, blocks)
    norm1 = exponent.abs().sum(-2).amax(-1)  # (rows, n, heads, J): max column sum
    spread = torch.einsum("bta,haJ->bthJ", c.abs(), blocks.flatten(-2).norm(dim=-1))
    factor = eps * (K * b * (8 + norm1) + (axes + 2) * spread + b)
    factor = factor.repeat_interleave(x.shape[1] // heads, dim=2).transpose(1, 2)
    seq = x.shape[2]
    xs = x[:, :, seq - n :, : count * b].unflatten(-1, (count, b)).norm(dim=-1)
    tol = torch.zeros_like(x)
    tol[:, :, seq - n :, : count * b] = (xs * factor).repeat_interleave(b, dim=-1)
    return tol


def params_of(module: LieRotary) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in module.named_parameters()}


def ratio(got: torch.Tensor, want: torch.Tensor, tol: torch.Tensor) -> float:
    """max |got - want| / tol (elements with tol 0 must be equal)."""
    err = (got.double() - want).abs()
    assert torch.all(err[tol == 0] == 0), "a pass-through element changed"
    return (err[tol > 0] / tol[tol > 0]).max().item()


# (kind, head_dim, heads, block_size, x heads): blocks of the whole head (LieRE's
# default), channels passed through (18 = 4 blocks of 4 + 2), one generator set
# shared by all heads, grouped-query heads
CASES = {
    "liere-dense": ("liere", 16, 2, None, 2),
    "liere-b4-shared": ("liere", 18, 1, 4, 3),
    "comrope-ap-b2": ("comrope-ap", 16, 2, None, 2),
    "comrope-ap-b4-gqa": ("comrope-ap", 18, 2, 4, 4),
    "comrope-ld-b4": ("comrope-ld", 16, 2, 4, 2),
    "comrope-ld-b3-gqa": ("comrope-ld", 18, 1, 3, 2),
}


def setup(case: str, seed: int = 0, *, batch_coords: bool = False) -> tuple[Any, ...]:
    kind, head_dim, heads, b, x_heads = CASES[case]
    torch.manual_seed(seed)
    module = LieRotary(head_dim, heads, kind=kind, block_size=b)
    if batch_coords:  # (batch, n, 2) coordinates of their own per row
        coords = torch.rand(2, 12, 2) * 4 - 2
    else:  # the reference's grid with its class token, plus one token passed through
        coords = module.coords(3, 4, cls_token=True)
    q = torch.randn(2, x_heads, 14, head_dim)
    k = torch.randn(2, x_heads, 14, head_dim)
    blocks = repo_generators(kind, params_of(module), heads, 2)
    return module, coords, q, k, blocks


def test_float64_matrix_exp_against_mpmath():
    mpmath.mp.dps = 40
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for b in (2, 3, 4, 8):
        for scale in (0.03, 0.3, 1.0, 20.0):
            p = torch.randn(2, b, b, generator=gen, dtype=torch.float64) * scale
            a = p - p.transpose(-1, -2)
            ours = expm64(a)
            for i in range(2):
                m = mpmath.expm(mpmath.matrix(a[i].tolist()))
                want = torch.tensor(
                    [[float(m[r, s]) for s in range(b)] for r in range(b)], dtype=torch.float64
                )
                err = (ours[i] - want.double()).abs().max().item()
                norm1 = a[i].abs().sum(0).max().item()
                worst = max(worst, err / (b * EPS64 * (8 + norm1)))
    assert worst <= K, worst


def test_single_matrix_is_as_exact_as_a_batch():
    # the rotation of one token, one head, one block is a single matrix: torch's path
    # for it is ~900 ulps off at a 1-norm of 0.58 in float32 (pytorch/pytorch#196592)
    gen = torch.tensor([[0.0, -1.0], [1.0, 0.0]]).reshape(1, 1, 1, 2, 2)
    coords = torch.tensor([[0.58]])
    x = torch.tensor([1.0, 0.0]).reshape(1, 1, 1, 2)
    got = lie_rotate(x, coords, gen)
    assert ratio(got, truth(x, coords, gen.double()), bound(x, coords, gen.double(), EPS32)) <= 1


@pytest.mark.parametrize("batch_coords", [False, True], ids=["grid", "per-row"])
@pytest.mark.parametrize("case", CASES)
def test_matches_float64_formula(case, batch_coords):
    module, coords, q, k, blocks = setup(case, batch_coords=batch_coords)
    got_q, got_k = module(q, k, coords)
    for got, x in ((got_q, q), (got_k, k)):
        assert got.dtype == torch.float32
        assert ratio(got, truth(x, coords, blocks), bound(x, coords, blocks, EPS32)) <= 1
    # float64 inputs compute in float64
    got64, _ = module.double()(q.double(), k.double(), coords.double())
    want = truth(q, coords, blocks)
    assert ratio(got64, want, bound(q, coords, blocks, EPS64)) <= 1
    # the functional form is the same computation
    out = lie_rotate(q.double(), coords.double(), module.generators())
    assert torch.equal(out, got64)


@pytest.mark.parametrize("case", CASES)
def test_near_misses_fail(case):
    module, coords, q, _, blocks = setup(case)
    got = module(q, q, coords)[0]
    tol = bound(q, coords, blocks, EPS32)

    off = blocks.clone()
    off[:, 0] *= 1.001  # axis 0's generators 0.1% too large
    assert ratio(got, truth(q, coords, off), tol) > 10
    swapped = coords[..., [1, 0]]  # columns read as rows
    assert ratio(got, truth(q, swapped, blocks), tol) > 10
    sym = torch.randn(blocks.shape, dtype=torch.float64)
    sym = sym + sym.transpose(-1, -2)
    tilted = blocks + 1e-3 * blocks.abs().amax() * sym  # 0.1% not skew-symmetric
    assert ratio(got, truth(q, coords, tilted), tol) > 10
    with pytest.raises(ValueError, match="skew-symmetric"):
        lie_rotate(q, coords, tilted.float())


@pytest.mark.parametrize("kind", KINDS)
def test_reference_state_dict_loads(kind):
    """The repositories' tensors, built by hand under their names, load and give the formula."""
    head_dim, heads, axes = 16, 2, 2
    b = 8 if kind == "liere" else 4
    gen = torch.Generator().manual_seed(1)
    if kind == "liere":  # RoPEViT.position_encoder, per head, one set for every layer
        num_generators = head_dim // b * heads
        raw = torch.rand(axes, 1, num_generators, b, b, generator=gen) * 2 * math.pi
        reference = {"position_encoder.generator_raw_params": raw}
    elif kind == "comrope-ap":  # CLIP layer i's self_attn, head_dim // num_axes // b per axis
        total = head_dim // axes // b * axes
        reference = {
            "vision_model.encoder.layers.0.self_attn.freqs": torch.randn(
                heads, 1, total, b, b, generator=gen
            ),
            "vision_model.encoder.layers.0.self_attn.q_proj.weight": torch.randn(
                32, 32, generator=gen
            ),
        }
    else:
        reference = {
            "vision_model.encoder.layers.0.self_attn.freqs": torch.randn(
                heads, 1, head_dim // b, b, b, generator=gen
            ),
            "vision_model.encoder.layers.0.self_attn.multiplier": torch.randn(
                1, axes, head_dim // b, 1, 1, generator=gen
            ),
        }
    ours = LieRotary(head_dim, heads, axes, kind=kind, block_size=b)
    mine = {name.rsplit(".", 1)[-1]: t for name, t in reference.items() if "proj" not in name}
    ours.load_state_dict(mine)  # strict: the same names and shapes
    blocks = repo_generators(kind, mine, heads, axes)
    coords = ours.coords(4, 4, cls_token=True)
    q = torch.randn(1, heads, 17, head_dim, generator=gen)
    got = ours(q, q, coords)[0]
    assert ratio(got, truth(q, coords, blocks), bound(q, coords, blocks, EPS32)) <= 1
    if kind == "liere":  # rotary_embedding_per_layer: (axes, depth, ...), layer i's slice
        per_layer = torch.rand(axes, 3, heads * head_dim // b, b, b, generator=gen)
        ours.load_state_dict({"generator_raw_params": per_layer[:, 2:3]})
        assert torch.equal(ours.generator_raw_params, per_layer[:, 2:3])


def test_coords_are_the_references():
    liere = LieRotary(8)
    # LieRE tests/test_position_encoding.py::test_base, a 64 x 64 image of 16 x 16 patches
    expected = [[r / 3, c / 3] for r in range(4) for c in range(4)]
    grid = liere.coords(4, 4)
    assert torch.allclose(grid, torch.tensor(expected), atol=1e-4, rtol=1e-3)
    axes = (torch.linspace(0, 1, 4), torch.linspace(0, 1, 4))
    assert torch.equal(grid, torch.cartesian_prod(*axes))
    assert torch.equal(liere.coords(2, 3, cls_token=True)[0], torch.zeros(2))
    comrope = LieRotary(8, kind="comrope-ld")
    # ComRoPE CustomVITConfig.get_positions(axis_scale=True), 5 x 5 patches
    ij = torch.stack(torch.meshgrid(torch.arange(5.0), torch.arange(5.0), indexing="ij"), -1)
    assert torch.equal(comrope.coords(5, 5), ((ij + 0.5) / 5).view(-1, 2))
    assert comrope.coords(2, 4, cls_token=True)[:2].tolist() == [[0.5, 0.5], [0.25, 0.125]]
    assert LieRotary(8, axes=3, kind="comrope-ap").coords(2, 2, 2).shape == (8, 3)


@settings(max_examples=12, deadline=None)
@given(
    case=st.sampled_from(sorted(CASES)),
    seed=st.integers(0, 2**16),
    spread=st.floats(0.01, 30.0),
)
def test_rotations_keep_norms(case, seed, spread):
    module, _, q, _, blocks = setup(case, seed)
    coords = (torch.rand(14, 2, dtype=torch.float64) - 0.5) * spread
    got = module.double()(q.double(), q.double(), coords)[0]
    b = module.block_size
    width = module.rotary_dim
    before = q.double()[..., :width].unflatten(-1, (-1, b)).norm(dim=-1)
    after = got[..., :width].unflatten(-1, (-1, b)).norm(dim=-1)
    tol = bound(q, coords, blocks, EPS64)[..., :width].unflatten(-1, (-1, b)).amax(-1)
    # each element within tol of the exact rotation: the block's norm within sqrt(b) tol
    assert torch.all((after - before).abs() <= math.sqrt(b) * tol)


def scores(module: LieRotary, q: torch.Tensor, k: torch.Tensor, coords: torch.Tensor):
    rq, rk = module(q, k, coords)
    return rq @ rk.transpose(-1, -2)


@settings(max_examples=12, deadline=None)
@given(
    kind=st.sampled_from(["comrope-ap", "comrope-ld"]),
    b=st.sampled_from([2, 3, 4]),
    seed=st.integers(0, 2**16),
    shift=st.tuples(st.floats(-5, 5), st.floats(-5, 5)),
)
def test_comrope_scores_depend_only_on_the_offset(kind, b, seed, shift):
    torch.manual_seed(seed)
    module = LieRotary(12, 2, kind=kind, block_size=b).double()
    q, k = torch.randn(2, 1, 2, 6, 12, dtype=torch.float64)
    coords = torch.rand(6, 2, dtype=torch.float64) * 4
    moved = coords + torch.tensor(shift, dtype=torch.float64)
    s0, s1 = scores(module, q, k, coords), scores(module, q, k, moved)
    blocks = module.generators().detach()
    # each rotated vector within its bound of the exact one (at both coordinate sets)
    tq = torch.maximum(bound(q, coords, blocks, EPS64), bound(q, moved, blocks, EPS64))
    tk = torch.maximum(bound(k, coords, blocks, EPS64), bound(k, moved, blocks, EPS64))
    tol = 2 * (tq.norm(dim=-1)[..., :, None] * k.norm(dim=-1)[..., None, :])
    tol += 2 * (q.norm(dim=-1)[..., :, None] * tk.norm(dim=-1)[..., None, :])
    tol += 2 * 12 * EPS64 * (q.norm(dim=-1)[..., :, None] * k.norm(dim=-1)[..., None, :])
    assert torch.all((s0 - s1).abs() <= tol)
    # R(p_i)^T R(p_j) = R(p_j - p_i)
    r = module.matrices(coords, dtype=torch.float64)
    rel = module.matrices(coords[None, :] - coords[:, None], dtype=torch.float64)
    both = r[:, None].transpose(-1, -2) @ r[None, :]
    assert torch.allclose(both, rel, rtol=0, atol=1e-11)


def test_liere_scores_depend_on_absolute_positions():
    torch.manual_seed(0)
    shift = torch.tensor([0.3, -0.2], dtype=torch.float64)
    q, k = torch.randn(2, 1, 1, 5, 8, dtype=torch.float64)
    coords = torch.rand(5, 2, dtype=torch.float64)
    dense_liere = LieRotary(8, block_size=4).double()  # 4 x 4 generators do not commute
    gap = scores(dense_liere, q, k, coords) - scores(dense_liere, q, k, coords + shift)
    assert gap.abs().max() > 1e-2
    pairs = LieRotary(8, block_size=2).double()  # 2 x 2 skew matrices all commute
    gap = scores(pairs, q, k, coords) - scores(pairs, q, k, coords + shift)
    assert gap.abs().max() < 1e-12


@pytest.mark.parametrize("variant", ["liere-b2", "liere-dense", "comrope-ap", "comrope-ld"])
def test_reduces_to_axial_rope(variant):
    """RoPE's generators (``omega_k J`` on 2 x 2 blocks, one block per axis) give AxialRotary."""
    axial = AxialRotary(8, axes=2)  # axis_dim 4: pairs (0, 1), (2, 3) row; (4, 5), (6, 7) column
    # 10000 ** (-2k / 4), k = 0, 1, in float64 (the float32 inv_freq buffer is rounded)
    omega = torch.tensor(axial.freqs.inv_freq, dtype=torch.float64)
    grid = axial_grid(3, 4).flatten(0, 1)
    q = torch.randn(2, 2, 12, 8, dtype=torch.float64)
    want = axial(q, q, grid)[0]
    # AxialRotary's interleaved pair turns by [[cos, -sin], [sin, cos]] = exp(theta J),
    # J = [[0, -1], [1, 0]]; LieRE's U - U^T with U[0, 1] = u is -u J
    perm = list(range(8))
    if variant.startswith("liere"):
        b = 2 if variant == "liere-b2" else 8
        lie = LieRotary(8, kind="liere", block_size=b).double()
        with torch.no_grad():
            lie.generator_raw_params.zero_()
            for a in range(2):
                for kk in range(2):
                    pair = 2 * a + kk
                    if b == 2:
                        lie.generator_raw_params[a, 0, pair, 0, 1] = -omega[kk]
                    else:
                        lie.generator_raw_params[a, 0, 0, 2 * pair, 2 * pair + 1] = -omega[kk]
    else:
        lie = LieRotary(8, kind=variant, block_size=2).double()
        with torch.no_grad():
            lie.freqs.zero_()
            if variant == "comrope-ap":
                # block j turns with axis j % 2: block j is the axial pair (j % 2, j // 2)
                for j in range(4):
                    lie.freqs[0, 0, j, 0, 1] = -omega[j // 2]
                perm = [
                    c
                    for j in range(4)
                    for c in (4 * (j % 2) + 2 * (j // 2), 4 * (j % 2) + 2 * (j // 2) + 1)
                ]
            else:
                lie.freqs[0, 0, :, 0, 1] = -1.0
                lie.multiplier.zero_()
                for a in range(2):
                    for kk in range(2):
                        lie.multiplier[0, a, 2 * a + kk] = omega[kk]
    got = lie(q[..., perm], q[..., perm], grid.double())[0]
    blocks = lie.generators().detach()
    tol = bound(q[..., perm], grid.double(), blocks, EPS64) + 4 * EPS64 * q.abs().amax()
    assert torch.all((got - want[..., perm]).abs() <= tol)


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_through_the_generators(kind):
    torch.manual_seed(0)
    b = {"liere": 3, "comrope-ap": 2, "comrope-ld": 4}[kind]
    module = LieRotary(8, 1, kind=kind, block_size=b).double()
    names = [n for n, _ in module.named_parameters()]
    coords = torch.rand(2, 2, dtype=torch.float64) * 2
    q = torch.randn(1, 1, 3, 8, dtype=torch.float64, requires_grad=True)
    params = [p.detach().clone().requires_grad_() for p in module.parameters()]

    def f(x: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
        out = torch.func.functional_call(module, dict(zip(names, ps, strict=True)), (x, x, coords))
        return out[0]

    assert torch.autograd.gradcheck(f, (q, *params), fast_mode=True)


def grad_bounds(module, coords, x, w, blocks, ref, eps):
    """Bounds on the error of each parameter's gradient of ``sum(w * x')``.

    dL/dG_a = sum_t p_a L(A_t^T, w_t x_t^T), the adjoint Frechet derivative (norm <=
    ||w_t|| ||x_t||), which torch computes as exp of the 2b x 2b [[A^T, E], [0, A^T]]:
    the exp bound with its 1-norm, ``K 2b eps (8 + ||A||_1 + ||E||_1) max(1, ||E||)``,
    summed over tokens with ``|p_a|``; times 2 for ``P - P^T`` (and ``|multiplier|``
    for ComRoPE-LD's ``freqs``), or ``||P - P^T||_F`` for the multiplier's own.
    """
    b = module.block_size
    c = _rows(coords)
    n = c.shape[1]
    exponent = torch.einsum("bta,haJij->bthJij", c, blocks)
    norm1 = exponent.abs().sum(-2).amax(-1)  # (rows, n, heads, J)
    width = module.rotary_dim
    xb = x.double()[:, :, -n:, :width].unflatten(-1, (-1, b)).norm(dim=-1)  # (B, Hx, n, J)
    wb = w.double()[:, :, -n:, :width].unflatten(-1, (-1, b)).norm(dim=-1)
    e = (xb * wb).unflatten(1, (module.heads, -1)).sum(2).transpose(1, 2)  # (B, n, heads, J)
    per = K * 2 * b * eps * (8 + norm1 + math.sqrt(b) * e) * torch.clamp(e, min=1)
    total = (c.abs().sum(-1)[..., None, None] * per).sum((0, 1)).amax().item()
    tols = {"generator_raw_params": 2 * total, "freqs": 2 * total}
    if module.kind == "comrope-ld":
        freqs = ref["freqs"].detach()
        tols["freqs"] *= ref["multiplier"].detach().abs().max().item()
        skew = (freqs - freqs.transpose(-1, -2)).flatten(-2).norm(dim=-1).max().item()
        tols["multiplier"] = skew * total
    return tols


def formula_grads(kind, module, coords, x, w, scale_axis0=1.0):
    ref = {n: p.detach().double().requires_grad_() for n, p in module.named_parameters()}
    xr = x.double().requires_grad_()
    blocks = repo_generators(kind, ref, module.heads, 2)
    blocks = torch.cat([blocks[:, :1] * scale_axis0, blocks[:, 1:]], dim=1)
    (truth(xr, coords, blocks) * w.double()).sum().backward()
    return ref, xr.grad, blocks.detach()


@pytest.mark.parametrize("case", CASES)
def test_gradients_match_formula(case):
    module, coords, q, _, _ = setup(case)
    kind = CASES[case][0]
    w = torch.randn_like(q)
    ref, x_grad, blocks = formula_grads(kind, module, coords, q, w)
    for dtype, eps in ((torch.float32, EPS32), (torch.float64, EPS64)):
        module = module.to(dtype)
        module.zero_grad()
        xq = q.detach().to(dtype, copy=True).requires_grad_()
        (module(xq, xq.detach(), coords.to(dtype))[0] * w.to(dtype)).sum().backward()
        # dL/dx = R^T w: the forward bound with w for x
        assert ratio(xq.grad, x_grad, bound(w, coords, blocks, eps)) <= 1
        tols = grad_bounds(module, coords, q, w, blocks, ref, eps)
        for name, p in module.named_parameters():
            err = (p.grad.double() - ref[name].grad).abs().max().item()
            assert err <= tols[name], (dtype, name, err, tols[name])
    # near miss: the float64 gradients against those of axis 0's generators 0.1% off
    off, _, _ = formula_grads(kind, module, coords, q, w, scale_axis0=1.001)
    assert any(
        (p.grad.double() - off[name].grad).abs().max().item() > 10 * tols[name]
        for name, p in module.named_parameters()
    )


@pytest.mark.parametrize("case", ["liere-dense", "comrope-ap-b4-gqa", "comrope-ld-b3-gqa"])
def test_attention_with_the_rotation(case):
    module, coords, q, k, blocks = setup(case)
    _, head_dim, _, _, x_heads = CASES[case]
    q, k = q[:, :, 1:], k[:, :, 1:]  # one token per coordinate row: position p reads coords[p]
    v = torch.randn(2, x_heads, 13, 5)
    out = posenc.attention(q, k, v, rotary=module.rotation(coords))
    rq, rk = truth(q, coords, blocks), truth(k, coords, blocks)
    scale = head_dim**-0.5
    want = torch.softmax(rq @ rk.transpose(-1, -2) * scale, -1) @ v.double()
    # scores: |d(q'.k')| <= ||dq'|| ||k|| + ||q|| ||dk'|| + head_dim eps ||q|| ||k||;
    # softmax moves the output by <= 2 max|d score| max|v|; the kernel's own sums
    # add (k_len + head_dim) eps max|v|
    tq = bound(q, coords, blocks, EPS32).norm(dim=-1)
    tk = bound(k, coords, blocks, EPS32).norm(dim=-1)
    qn, kn = q.double().norm(dim=-1), k.double().norm(dim=-1)
    ds = scale * (tq[..., :, None] * kn[..., None, :] + qn[..., :, None] * tk[..., None, :])
    ds += scale * head_dim * EPS32 * qn[..., :, None] * kn[..., None, :]
    vmax = v.abs().amax().item()
    tol = 2 * ds.amax(-1, keepdim=True) * vmax + (13 + head_dim) * EPS32 * vmax
    assert torch.all((out.double() - want).abs() <= tol)
    # positions (rows, seq) read those rows of coordinates
    where = torch.tensor([[3, 0, 7], [12, 12, 1]])
    (got,) = module.rotation(coords).rotate((q[:, :, :3],), where)
    for row in range(2):
        exact = truth(q[row : row + 1, :, :3], coords[where[row]], blocks)
        tol_row = bound(q[row : row + 1, :, :3], coords[where[row]], blocks, EPS32)
        assert ratio(got[row : row + 1], exact, tol_row) <= 1


def test_leading_tokens_and_late_channels_pass_through():
    module, coords, q, k, _ = setup("liere-b4-shared")
    got_q, _ = module(q, k, coords)  # 13 coordinates, 14 tokens; 16 of 18 channels turn
    assert torch.equal(got_q[:, :, 0], q[:, :, 0])
    assert torch.equal(got_q[..., 16:], q[..., 16:])
    # the class token's coordinates (LieRE: zeros) turn by the identity
    assert torch.equal(got_q[:, :, 1], q[:, :, 1])


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="kind"):
        LieRotary(8, kind="rope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="whole block"):
        LieRotary(8, kind="comrope-ap", block_size=8)
    with pytest.raises(ValueError, match="init_scale"):
        LieRotary(8, init_scale=-1.0)
    lie = LieRotary(8, heads=2, kind="comrope-ld")
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="coords"):
        lie(q, q, torch.zeros(4, 3))
    with pytest.raises(ValueError, match="seq >= 5"):
        lie(q, q, torch.zeros(5, 2))
    with pytest.raises(ValueError, match="multiple of 2"):
        lie(q[:, :1], q[:, :1], torch.zeros(4, 2))
    with pytest.raises(ValueError, match="head_dim=8"):
        lie(q[..., :6], q[..., :6], torch.zeros(4, 2))
    with pytest.raises(TypeError, match="same dtype"):
        lie(q, q.double(), torch.zeros(4, 2))
    with pytest.raises(ValueError):
        lie(q, q, torch.full((4, 2), math.nan))
    with pytest.raises(ValueError, match="positions index the 4"):
        lie.rotation(torch.zeros(4, 2)).rotate((q,), torch.arange(1, 5))
    with pytest.raises(ValueError, match="one size per axis"):
        lie.coords(4)
    with pytest.raises(ValueError, match="generators must be"):
        lie_rotate(q, torch.zeros(4, 2), torch.zeros(2, 2, 4, 2))
