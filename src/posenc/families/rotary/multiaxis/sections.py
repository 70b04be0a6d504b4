"""Which position axis each M-RoPE frequency reads: the sections, without torch.

Reading a config (``posenc rope``, :func:`posenc.hf.rope_spec`) checks a model's
``mrope_section`` against its rotary dimension; that needs this, and not torch, which
the tables (:mod:`posenc.rotary.multiaxis`' other names) do.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=64)
def mrope_axes(
    mrope_section: tuple[int, ...],
    pairs: int,
    axes: int = 3,
    interleaved: bool = False,
    videorope: bool = False,
) -> tuple[int, ...]:
    """The position axis that each of the ``pairs`` frequencies reads.

    Args:
        mrope_section: frequencies per section (transformers' ``mrope_section``).
        pairs: ``rotary_dim / 2``; the sections must sum to it.
        axes: number of position axes (3: temporal, height, width).
        interleaved: Qwen3-VL's order (one section per axis) instead of
            Qwen2-VL's contiguous chunks.
        videorope: VideoRoPE's order: the last ``mrope_section[0]`` frequencies
            (the lowest) read axis 0, the others alternate axes 1 and 2 from
            frequency 0, as ``apply_m_modify_multimodal_rotary_pos_emb`` takes
            them (``[16, 24, 24]`` at ``head_dim`` 128: 48 alternating, then 16
            temporal). The alternation gives axis 1 the even ones of the first
            ``pairs - mrope_section[0]``, so ``mrope_section[1]`` must be their
            half rounded up and ``mrope_section[2]`` rounded down (the reference
            reads only ``mrope_section[0]`` and the sum of the other two).

    Returns:
        ``axis[k]`` for ``k < pairs``.

    Raises:
        ValueError: sections that are not non-negative ints summing to
            ``pairs``; for ``interleaved`` or ``videorope``, not one section per
            axis, sections too long to interleave, or (``videorope``) height and
            width sections the alternation does not give; both orders at once.

    Examples:
        >>> from posenc.rotary.multiaxis import mrope_axes
        >>> mrope_axes((2, 3, 3), 8)  # Qwen2-VL: 0 temporal, 1 height, 2 width
        (0, 0, 1, 1, 1, 2, 2, 2)
        >>> mrope_axes((3, 3, 2), 8, interleaved=True)  # Qwen3-VL
        (0, 1, 2, 0, 1, 2, 0, 1)
    """
    sections = tuple(mrope_section)
    if not sections or any(
        isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in sections
    ):
        raise ValueError(
            f"mrope_section must be a non-empty list of non-negative ints; got {list(sections)}"
        )
    if sum(sections) != pairs:
        raise ValueError(
            f"mrope_section must sum to rotary_dim / 2 = {pairs}; got {list(sections)} "
            f"(sum {sum(sections)})"
        )
    if interleaved and videorope:
        raise ValueError("pass interleaved (Qwen3-VL) or videorope, not both")
    if not interleaved and not videorope:
        # transformers Qwen2-VL: freq.split(mrope_section)[i] from axis i % 3
        return tuple(i % axes for i, s in enumerate(sections) for _ in range(s))
    order = "interleaved" if interleaved else "videorope"
    if len(sections) != axes:
        raise ValueError(
            f"{order} mrope_section needs one section per axis ({axes}); got {list(sections)}"
        )
    if videorope:
        if axes != 3:
            raise ValueError(f"videorope needs 3 axes (temporal, height, width); got {axes}")
        spatial = pairs - sections[0]
        # the reference: height for even j, width for odd j, then the temporal block
        axis = [1 + j % 2 for j in range(spatial)] + [0] * sections[0]
        counts = [sections[0], (spatial + 1) // 2, spatial // 2]
        if counts != list(sections):
            raise ValueError(
                f"videorope mrope_section {list(sections)}: alternating height and width "
                f"over the first {spatial} frequencies gives the axes {counts} frequencies"
            )
        return tuple(axis)
    # transformers Qwen3-VL: axis a >= 1 takes slice(a, 3 * section[a], 3); the rest is axis 0
    axis = [0] * pairs
    for a in range(1, axes):
        for k in range(a, min(axes * sections[a], pairs), axes):
            axis[k] = a
    counts = [axis.count(a) for a in range(axes)]
    if counts != list(sections):
        raise ValueError(
            f"interleaved mrope_section {list(sections)} does not fit rotary_dim / 2 = {pairs}: "
            f"axes would get {counts} frequencies"
        )
    return tuple(axis)
