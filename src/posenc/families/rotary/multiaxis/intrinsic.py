"""RIFLEx: lower a video model's intrinsic time frequency so a longer video stays in one period.

Zhao et al. 2025, "RIFLEx: A Free Lunch for Length Extrapolation in Video Diffusion
Transformers" (arXiv:2502.15894, ICML 2025); reference: thu-ml/RIFLEx ``riflex_utils.py``.

A video DiT's 3-D RoPE gives the time axis its own frequencies ``omega_j`` (HunyuanVideo:
16 channels, base 256; Wan 2.1: 44 channels, base 10000; CogVideoX: a quarter of the
head, base 10000). Component ``j`` repeats every ``N_j = 2 pi / omega_j`` frames. Asked
for more frames than it was trained on, a model starts to repeat itself at the period of
one component, the *intrinsic frequency* ``k``; RIFLEx lowers that one frequency so the
whole test length stays inside 90 % of a period:

    omega'_k = 0.9 * 2 pi / L_test

and leaves every other component, and every spatial axis, as it was. ``k`` is 1-based,
as the reference writes it (``freqs[k-1] = 0.9 * 2 * torch.pi / L_test`` in
``get_1d_rotary_pos_embed_riflex``), and ``L_test`` counts latent frames (the reference's
``(num_frames - 1) // 4 + 1``).

The reference finds ``k`` with ``identify_k(b, d, N)``: the component whose period,
rounded to whole frames, is nearest ``N``, the latent frame at which the unmodified
model's long videos first repeat (HunyuanVideo: ``N = 48`` gives ``k = 4``, period 50;
it was trained on 33). ``N`` is observed, not the training length: the component
nearest HunyuanVideo's 33 trained frames is ``k = 3`` (period 25), which RIFLEx does not
use. The reference's scripts apply RIFLEx only when ``L_test`` exceeds the period
``N_k``; below ``0.9 N_k`` the formula would raise the frequency instead.
"""

from __future__ import annotations

import decimal
from typing import Any

from posenc.core import checks
from posenc.core.angles import PI, decimal_context
from posenc.families.rotary.schedules import RopeFrequencies

_CTX = decimal_context()
_TWO_PI = _CTX.multiply(2, PI)


def _check_freqs(freqs: Any) -> RopeFrequencies:
    if not isinstance(freqs, RopeFrequencies):
        raise TypeError(
            "freqs must be a RopeFrequencies (e.g. posenc.rotary.schedules.frequencies("
            f"'default', axis_dim, base)); got {type(freqs).__name__}"
        )
    if not freqs.omega:
        raise ValueError("freqs must hold at least one frequency; got none")
    return freqs


def intrinsic_frequency(freqs: RopeFrequencies, repeat_frame: int) -> int:
    """The 1-based index ``k`` of the component whose period is nearest ``repeat_frame``.

    thu-ml/RIFLEx ``riflex_utils.identify_k`` (the paper's Eq. 7): each period
    ``2 pi / omega_j`` is rounded to whole frames (ties to even, as Python's ``round``)
    and the component with the smallest ``|N_j - repeat_frame|`` wins; on a tie the
    lower index (the higher frequency) wins, as ``list.index(min(...))`` picks it. A
    component that never turns (``omega_j = 0``) has no period and is never picked.
    posenc rounds the exact period; the reference rounds it computed in float64, which
    differs only within 1e-15 of a half-integer.

    Args:
        freqs: the time axis's frequencies (:class:`~posenc.rotary.schedules.RopeFrequencies`).
        repeat_frame: ``N``, the latent frame at which the unmodified model's videos
            first repeat when it is asked for more frames than it was trained on (an
            observation, past the training length: HunyuanVideo trained on 33 latent
            frames repeats at about 48).

    Returns:
        ``k``, 1-based as the reference's (``freqs.omega[k - 1]`` is the component).

    Raises:
        TypeError: ``freqs`` not a ``RopeFrequencies``, ``repeat_frame`` not an int.
        ValueError: ``repeat_frame`` below 1; no frequency, or none that turns.

    Examples:
        >>> from posenc.rotary.multiaxis import intrinsic_frequency
        >>> from posenc.rotary.schedules import frequencies
        >>> time = frequencies("default", 16, 256.0)  # HunyuanVideo's time axis
        >>> (2 * 3.141592653589793 / time.inv_freq[:5]).round(1).tolist()  # periods
        [6.3, 12.6, 25.1, 50.3, 100.5]
        >>> intrinsic_frequency(time, 48)  # identify_k(b=256, d=16, N=48) in the reference
        4
    """
    freqs = _check_freqs(freqs)
    repeat_frame = checks.check_int(repeat_frame, "repeat_frame", minimum=1)
    best: tuple[decimal.Decimal, int] | None = None
    for j, w in enumerate(freqs.omega):
        if w == 0:
            continue
        period = _CTX.divide(_TWO_PI, abs(w)).to_integral_value(decimal.ROUND_HALF_EVEN)
        gap = abs(period - repeat_frame)
        if best is None or gap < best[0]:
            best = (gap, j)
    if best is None:
        raise ValueError("freqs has no component that turns (every frequency is 0): no period")
    return best[1] + 1


def riflex(
    freqs: RopeFrequencies, k: int, test_frames: int, *, margin: float = 0.9
) -> RopeFrequencies:
    """``freqs`` with component ``k`` lowered so ``test_frames`` fit in one period (RIFLEx).

    ``omega'_k = margin * 2 pi / test_frames``, exactly (40 digits, as every posenc
    frequency); every other frequency and the attention scaling are kept. The new
    period is ``test_frames / margin`` frames. thu-ml/RIFLEx
    ``get_1d_rotary_pos_embed_riflex(dim, pos, theta, use_real, k, L_test)`` sets
    ``freqs[k-1] = 0.9 * 2 * torch.pi / L_test`` in float32; ``margin = 1`` is the
    project page's ``2 pi / (L s)``. Use the result for the time axis only, e.g. as the
    first of :func:`axial_cos_sin`'s per-axis frequencies.

    The reference applies it when ``test_frames`` exceeds the period of component
    ``k`` (training-free), or with ``test_frames`` the period a fine-tuned model was
    trained at (``--finetune``: 66 for HunyuanVideo-RIFLEx, 25 for CogVideoX-RIFLEx).
    Below ``margin`` times the period the formula raises the frequency; it is applied
    as written.

    Args:
        freqs: the time axis's frequencies.
        k: the intrinsic component, 1-based as the reference's (:func:`intrinsic_frequency`).
        test_frames: ``L_test``, the latent frames to generate (the reference:
            ``(num_frames - 1) // 4 + 1``).
        margin: the share of a period the test length may fill, in ``(0, 1]``; the
            reference's 0.9 ("a few videos may exhibit repetition in the tail frames").

    Returns:
        The modified :class:`~posenc.rotary.schedules.RopeFrequencies`.

    Raises:
        TypeError: ``freqs`` not a ``RopeFrequencies``; ``k`` or ``test_frames`` not an
            int; ``margin`` not a real number.
        ValueError: ``k`` outside ``1 .. len(freqs.omega)`` (0 is not "off": leave
            ``freqs`` as it is), ``test_frames`` below 1, ``margin`` outside ``(0, 1]``.

    Examples:
        >>> import math
        >>> from posenc.rotary.multiaxis import riflex
        >>> from posenc.rotary.schedules import frequencies
        >>> time = frequencies("default", 16, 256.0)  # HunyuanVideo: 33 latent frames
        >>> longer = riflex(time, 4, 66)  # 261 frames: --k 4, L_test = (261 - 1) // 4 + 1
        >>> longer.omega[3]  # 0.9 * 2 pi / 66, exact
        Decimal('0.08567979964335799952647724257952092682915')
        >>> round(2 * math.pi / float(longer.inv_freq[3]), 2)  # the new period, latent frames
        73.33
        >>> (longer.inv_freq == time.inv_freq).tolist()  # only component k = 4 changed
        [True, True, True, False, True, True, True, True]
    """
    freqs = _check_freqs(freqs)
    k = checks.check_int(k, "k", minimum=1)
    if k > len(freqs.omega):
        raise ValueError(
            f"k must be a 1-based component index from 1 to {len(freqs.omega)} (the "
            f"reference's freqs[k-1]); got {k}"
        )
    test_frames = checks.check_int(test_frames, "test_frames", minimum=1)
    margin = checks.check_number(margin, "margin", positive=True)
    if margin > 1:
        raise ValueError(
            f"margin must be in (0, 1]: the test length must fit in one period; got {margin}"
        )
    lowered = _CTX.divide(_CTX.multiply(decimal.Decimal(margin), _TWO_PI), test_frames)
    omega = list(freqs.omega)
    omega[k - 1] = lowered
    return RopeFrequencies(tuple(omega), freqs.attention_scaling)
