"""Multi-axis rotary embeddings: M-RoPE (Qwen2-VL, Qwen3-VL), axial 2-D/3-D grids, xPos.

One mechanism underlies all three, each in its own module (:mod:`.mrope`,
:mod:`.axial`, :mod:`.xpos`): every frequency ``omega_k`` of a schedule
is assigned to one position axis, the exact engine evaluates ``position_axis(k)
* omega_k`` (:func:`posenc.rotary.tables.cos_sin`), and the result is applied
with :func:`posenc.rotary.apply.apply_rotary`.

- M-RoPE (Wang et al. 2024, Qwen2-VL; transformers ``Qwen2VLRotaryEmbedding``):
  positions are ``(3, batch, seq)`` (temporal, height, width). The
  ``rotary_dim / 2`` frequencies are cut into contiguous chunks of
  ``mrope_section`` sizes (e.g. ``[16, 24, 24]``) and chunk ``i`` reads axis
  ``i % 3``; the result is repeated as ``cat(theta, theta)`` (half layout), so
  the sections apply to both halves. Qwen3-VL (transformers
  ``Qwen3VLTextRotaryEmbedding``) interleaves instead: frequency ``k`` reads
  axis ``a`` in ``1, 2`` when ``k % 3 == a`` and ``k < 3 * mrope_section[a]``,
  and axis 0 (temporal) otherwise (sections ``[24, 20, 20]``). VideoRoPE
  (``mrope_cos_sin(..., videorope=True)``; Wiselnn570/VideoRoPE) gives time the
  lowest frequencies, the last ``mrope_section[0]``, and alternates height and
  width over the others; its position ids: :func:`posenc.positions.videorope_positions`.
- Axial (rotary-embedding-torch ``RotaryEmbedding.get_axial_freqs``, ViTs):
  each of the ``axes`` coordinates of a patch gets its own block of
  ``axis_dim`` channels, rotated by the same frequencies; the blocks are
  concatenated in axis order, each in the interleaved layout by default.
- LieRE and ComRoPE (:mod:`.lie`; StanfordMIMI/LieRE, Longin-Yu/ComRoPE): not
  angles per pair but dense rotations ``matrix_exp(sum_a p_a G_a)`` per channel
  block, of learned skew-symmetric generators (:class:`LieRotary`).
- xPos (Sun et al. 2022, arXiv:2212.10554; rotary-embedding-torch
  ``RotaryEmbedding(use_xpos=True).rotate_queries_and_keys``): the rotated
  channels of ``q`` are also scaled by ``zeta_k ** ((t - T // 2) / scale_base)``
  with ``zeta_k = (2k + 0.4 d) / (1.4 d)``, and those of ``k`` by the
  inverse, so ``q_m . k_n`` decays with ``m - n``. Causal attention only: the
  factor grows without bound for ``n > m``.
- RIFLEx (Zhao et al. 2025; thu-ml/RIFLEx ``riflex_utils.py``): a video model's
  time-axis frequencies with the intrinsic component ``k`` lowered to
  ``0.9 * 2 pi / L_test``, so ``L_test`` frames stay within one period
  (:mod:`.intrinsic`).
- RoPE-Mixed (Heo et al. 2024; naver-ai/rope-vit, timm ``RotaryEmbeddingMixed``): pair
  ``c`` of head ``h`` turns by ``x fx[h, c] + y fy[h, c]``, learned frequencies that
  mix the axes (:mod:`.mixed`, :class:`RoPEMixed`); DINOv3's RoPE (transformers
  ``DINOv3ViTRopePositionEmbedding``): patch centres in ``[-1, 1]``, shifted, jittered
  and rescaled in training, times ``2 pi / period`` (:mod:`.dinov3`,
  :class:`DINOv3Rope`). Both take float ``(n, 2)`` coordinates and leave the class and
  register tokens before the patches unrotated.

Shapes: ``rotary_dim`` channels are rotated; ``cos`` and ``sin`` are
``(..., rotary_dim)`` and broadcast against ``x[..., :rotary_dim]`` as in
:func:`posenc.rotary.apply.apply_rotary`.
"""

from typing import Any

from posenc.families.rotary.multiaxis.sections import mrope_axes

# torch-backed names, imported on first use: reading a config needs mrope_axes only
_LAZY = {
    "AxialRotary": "posenc.families.rotary.multiaxis.axial",
    "axial_cos_sin": "posenc.families.rotary.multiaxis.axial",
    "axial_grid": "posenc.families.rotary.multiaxis.axial",
    "pixel_frequencies": "posenc.families.rotary.multiaxis.axial",
    "mrope_cos_sin": "posenc.families.rotary.multiaxis.mrope",
    "intrinsic_frequency": "posenc.families.rotary.multiaxis.intrinsic",
    "riflex": "posenc.families.rotary.multiaxis.intrinsic",
    "xpos_rotate": "posenc.families.rotary.multiaxis.xpos",
    "xpos_scale": "posenc.families.rotary.multiaxis.xpos",
    "xpos_tables": "posenc.families.rotary.multiaxis.xpos",
    "LieRotary": "posenc.families.rotary.multiaxis.lie",
    "lie_rotate": "posenc.families.rotary.multiaxis.lie",
    "RoPEMixed": "posenc.families.rotary.multiaxis.mixed",
    "mixed_cos_sin": "posenc.families.rotary.multiaxis.mixed",
    "mixed_frequencies": "posenc.families.rotary.multiaxis.mixed",
    "DINOv3Rope": "posenc.families.rotary.multiaxis.dinov3",
    "dinov3_coords": "posenc.families.rotary.multiaxis.dinov3",
    "dinov3_cos_sin": "posenc.families.rotary.multiaxis.dinov3",
    "dinov3_frequencies": "posenc.families.rotary.multiaxis.dinov3",
}

__all__ = [
    "AxialRotary",
    "DINOv3Rope",
    "LieRotary",
    "RoPEMixed",
    "axial_cos_sin",
    "axial_grid",
    "dinov3_coords",
    "dinov3_cos_sin",
    "dinov3_frequencies",
    "intrinsic_frequency",
    "lie_rotate",
    "mixed_cos_sin",
    "mixed_frequencies",
    "mrope_axes",
    "mrope_cos_sin",
    "pixel_frequencies",
    "riflex",
    "xpos_rotate",
    "xpos_scale",
    "xpos_tables",
]


def __getattr__(name: str) -> Any:
    from posenc.core import extras

    return extras.attribute("posenc.rotary.multiaxis", _LAZY, name)
