"""The data behind the report's interactive explorers, computed exactly by posenc.

The page's script only draws and selects: every value it shows (an encoding's
channels at a position, a clock hand, a rotated query, a score, a scaled
wavelength and what the schedule did to it) is computed here, with the same
functions the library exports, and embedded in the page.

- :func:`sinusoidal_explorer`: tables for several ``d`` and bases, the first
  channels as float64, log-spaced clock hands.
- :func:`rope_explorer`: a query and a key rotated at every position, and
  every score ``q_m . k_n``.
- :func:`extension_explorer`: per frequency pair, the wavelength under each
  context-extension schedule for several trained and target lengths, and
  whether the pair was kept, interpolated or blended.
- :func:`timestep_explorer`: a grid of continuous diffusion timesteps through
  each timestep preset, the similarity of one timestep to every other, and
  the cosine of two presets' embeddings of the same timestep.
- :func:`bias_explorer`: each head's bias of an attention-bias module (ALiBi,
  a trained T5 table ...) over the keys of every query, and the attention
  weights it alone gives.

Returned arrays are numpy; the report serialises them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from posenc.core import checks
from posenc.families.absolute.sinusoidal import resolve, sinusoidal
from posenc.families.rotary.schedules import PARAMETERS, SCHEDULES, frequencies

#: What a schedule did to one pair's frequency, by index (see :func:`classify`).
EXTENSION_CLASSES = ("kept", "interpolated", "blended")

# A ratio within this of 1 (or of 1/factor) is the schedule keeping (or dividing) the
# frequency: the frequencies are exact decimals rounded once to float64, so a kept or
# divided pair is off by a few ulp at most, and a blended one by far more.
_SAME = 1e-12


def hand_pairs(pairs: int, count: int = 8) -> list[int]:
    """``count`` pair indices spread log-uniformly over ``0 .. pairs - 1``, first and last included.

    Frequencies fall geometrically with the pair index, so log spacing of
    ``1 + index`` samples the fast, middle and slow hands alike.
    """
    pairs = checks.check_int(pairs, "pairs", minimum=1)
    count = checks.check_int(count, "count", minimum=1)
    if pairs <= count:
        return list(range(pairs))
    picked = sorted({round(float(x)) - 1 for x in np.geomspace(1, pairs, count)})
    # rounding can merge the first few; fill from the fast end with unused indices
    spare = (i for i in range(pairs) if i not in picked)
    while len(picked) < count:
        picked.append(next(spare))
    return sorted(picked)


def _sub(n: int) -> str:
    """``n`` in subscript digits."""
    return str(n).translate(
        str.maketrans("0123456789", "\u2080\u2081\u2082\u2083\u2084\u2085\u2086\u2087\u2088\u2089")
    )


def sinusoidal_explorer(
    length: int,
    *,
    preset: str = "vaswani",
    dims: Iterable[int] = (16, 32, 64, 128, 256, 512),
    bases: Iterable[float] = (100.0, 1000.0, 10000.0, 100000.0),
    shown: int = 8,
    hands: int = 8,
) -> dict[str, Any]:
    """Tables of ``preset`` for every ``(dim, base)``: the heatmap, the first channels, the hands.

    Args:
        length: positions ``0 .. length - 1``.
        preset: a sinusoidal preset; ``base`` overrides its base.
        dims: channel counts offered (even, >= 4).
        bases: bases offered (> 1).
        shown: how many leading channels to give as float64 (the page prints them).
        hands: how many clock hands, log-spaced over the pairs.

    Returns:
        ``{"preset", "length", "dims", "bases", "shown", "combos"}``; ``combos``
        maps ``(dim, base)`` to ``{"table"}`` (float64, ``(length, dim)``),
        ``"first"`` (its first ``shown`` channels), ``"labels"`` (what each of
        them is, e.g. ``"1: cos \u03c9\u2080p"``), ``"pairs"`` (hand pair
        indices), ``"omega"``, ``"wavelength"``, ``"sin"`` and ``"cos"``
        (``(length, hands)``, read from the table's channels) and
        ``"channels"`` (the sin and cos channel of each hand).
    """
    length = checks.check_int(length, "length", minimum=2)
    dims = sorted({checks.check_int(d, "dims", minimum=4) for d in dims})
    if any(d % 2 for d in dims):
        raise ValueError(f"dims must be even (pairs of sin and cos); got {dims}")
    bases = sorted({checks.check_number(b, "bases", positive=True) for b in bases})
    if any(b <= 1 for b in bases):
        raise ValueError(f"bases must be > 1; got {bases}")
    shown = checks.check_int(shown, "shown", minimum=1)
    hands = checks.check_int(hands, "hands", minimum=1)
    checks.check_elements(length * sum(dims) * len(bases), "length x dims x bases")
    combos: dict[tuple[int, float], dict[str, Any]] = {}
    for dim in dims:
        sin_ch, cos_ch = resolve(preset).sin_cos_channels(dim)
        picked = hand_pairs(len(sin_ch), hands)
        names = {int(c): f"sin \u03c9{_sub(j)}p" for j, c in enumerate(sin_ch)}
        names.update({int(c): f"cos \u03c9{_sub(j)}p" for j, c in enumerate(cos_ch)})
        labels = [f"{c}: {names.get(c, '0')}" for c in range(min(shown, dim))]
        for base in bases:
            table = sinusoidal(length, dim, preset=preset, dtype="float64", base=base)
            omega = resolve(preset, base=base).inv_freq(dim)[picked]
            combos[dim, base] = {
                "table": table,
                "first": table[:, : min(shown, dim)].copy(),
                "labels": labels,
                "pairs": picked,
                "omega": omega,
                "wavelength": 2 * np.pi / omega,
                "sin": table[:, sin_ch[picked]],
                "cos": table[:, cos_ch[picked]],
                "channels": np.stack([sin_ch[picked], cos_ch[picked]], axis=1),
            }
    return {
        "preset": preset,
        "length": length,
        "dims": dims,
        "bases": bases,
        "shown": shown,
        "combos": combos,
    }


def rope_explorer(
    head_dim: int = 8, base: float = 10000.0, positions: int = 64, seed: int = 0
) -> dict[str, Any]:
    """A query and a key rotated by RoPE at every position, and every score ``q_m . k_n``.

    The same ``q`` and ``k`` (seeded normal, float64) at every position, rotated
    by :class:`posenc.Rotary` (HF's ``half`` layout: pair ``j`` is channels
    ``j`` and ``j + head_dim / 2``) in float64.

    Returns:
        ``{"head_dim", "base", "positions", "omega", "pairs", "q", "k",
        "q_rot", "k_rot", "score", "unrotated"}``: ``q_rot`` and ``k_rot`` are
        ``(positions, head_dim)``, ``score[m, n] = q_rot[m] . k_rot[n]``,
        ``unrotated = q . k``.
    """
    import torch

    from posenc.families.rotary.apply import apply_rotary
    from posenc.families.rotary.module import Rotary

    head_dim = checks.check_int(head_dim, "head_dim", minimum=2)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even; got {head_dim}")
    base = checks.check_number(base, "base", positive=True)
    positions = checks.check_int(positions, "positions", minimum=2)
    checks.check_elements(positions * positions, "positions x positions")
    gen = torch.Generator().manual_seed(checks.check_int(seed, "seed"))
    q = torch.randn(head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(head_dim, generator=gen, dtype=torch.float64)
    rope = Rotary(head_dim, base=base)
    c, s = rope.cos_sin(torch.arange(positions), dtype=torch.float64)
    q_rot = apply_rotary(q.expand(positions, -1), c, s).numpy()
    k_rot = apply_rotary(k.expand(positions, -1), c, s).numpy()
    half = head_dim // 2
    return {
        "head_dim": head_dim,
        "base": base,
        "positions": positions,
        # the frequencies the rotation used, float64 (inv_freq is their float32 rounding)
        "omega": frequencies("default", head_dim, base).inv_freq,
        "pairs": np.stack([np.arange(half), np.arange(half) + half], axis=1),
        "q": q.numpy(),
        "k": k.numpy(),
        "q_rot": q_rot,
        "k_rot": k_rot,
        "score": q_rot @ k_rot.T,
        "unrotated": float(q @ k),
    }


@dataclass(frozen=True)
class ExtensionSchedule:
    """One context-extension schedule offered by the explorer.

    Attributes:
        key: a short unique name (the schedule's ``rope_type``, or ``model``).
        rope_type: a key of :data:`posenc.rotary.schedules.SCHEDULES`.
        label: what the page calls it.
        params: its parameters other than the factor and the lengths, which
            the explorer sets per case.
    """

    key: str
    rope_type: str
    label: str
    params: Mapping[str, Any] = field(default_factory=dict)


#: The schedules every report shows, with HF's default parameters.
STANDARD_SCHEDULES = (
    ExtensionSchedule("linear", "linear", "linear (position interpolation)"),
    ExtensionSchedule("ntk", "ntk", "NTK-aware (base raised)"),
    ExtensionSchedule("dynamic", "dynamic", "dynamic NTK (at the target length)"),
    ExtensionSchedule("yarn", "yarn", "YaRN"),
    ExtensionSchedule(
        "llama3", "llama3", "llama3", {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
    ),
)


@dataclass(frozen=True)
class ExtensionCase:
    """One schedule at one trained length and factor.

    Attributes:
        omega: the scaled angular frequency of each pair (float64).
        ratio: scaled over original frequency, per pair.
        kind: per pair, an index into :data:`EXTENSION_CLASSES`.
        attention_scaling: the factor on cos and sin (YaRN's mscale), 1 for most.
        in_range: per pair, whether every angle it reaches up to the target
            length was reached in training: it turned fully within the trained
            length, or its largest angle at the target length is no larger
            than its largest trained angle.
    """

    omega: npt.NDArray[np.float64]
    ratio: npt.NDArray[np.float64]
    kind: npt.NDArray[np.uint8]
    attention_scaling: float
    in_range: npt.NDArray[np.bool_]

    @property
    def wavelength(self) -> npt.NDArray[np.float64]:
        """``2 pi / omega``: positions per turn (inf for a pair that does not turn)."""
        with np.errstate(divide="ignore"):
            return 2 * np.pi / self.omega


def classify(ratio: npt.NDArray[np.float64], factor: float) -> npt.NDArray[np.uint8]:
    """Per pair: 0 kept (ratio 1), 1 interpolated (ratio 1/factor), 2 anything else (blended)."""
    kind = np.full(ratio.shape, 2, dtype=np.uint8)
    kind[np.abs(ratio * factor - 1) <= _SAME] = 1
    kind[np.abs(ratio - 1) <= _SAME] = 0  # factor 1 divides nothing: kept wins
    return kind


def in_range(
    original: npt.NDArray[np.float64], omega: npt.NDArray[np.float64], trained: int, target: int
) -> npt.NDArray[np.bool_]:
    """Per pair: are the angles up to ``target`` all among those met up to ``trained``?

    A window of ``trained`` positions spans the angles ``0 .. trained omega_j``
    of pair ``j`` (all of them once that reaches ``2 pi``); one of ``target``
    positions, scaled, spans ``0 .. target omega'_j``.
    """
    seen = trained * original
    reached = target * omega
    return (seen >= 2 * np.pi) | (reached <= seen * (1 + _SAME))


def _case_params(
    schedule: ExtensionSchedule, trained: int, factor: float
) -> tuple[dict[str, Any], int]:
    """The schedule's parameters for one case, and the sequence length it is evaluated at."""
    required, optional = PARAMETERS[schedule.rope_type]
    keys = required | optional
    params = {k: v for k, v in schedule.params.items() if k in keys}
    target = round(trained * factor)
    if "factor" in keys:
        params["factor"] = factor
    if "original_max_position_embeddings" in keys:
        params["original_max_position_embeddings"] = trained
    if "max_position_embeddings" in keys:
        # dynamic grows from the trained length; longrope compares with the target
        params["max_position_embeddings"] = trained if schedule.rope_type == "dynamic" else target
    return params, target


def extension_explorer(
    head_dim: int,
    base: float,
    *,
    trained: Sequence[int] = (2048, 4096, 8192, 32768),
    factors: Sequence[float] = (2.0, 4.0, 8.0, 16.0, 32.0),
    schedules: Sequence[ExtensionSchedule] = STANDARD_SCHEDULES,
) -> dict[str, Any]:
    """Every schedule at every trained length and factor: frequencies and what changed.

    Args:
        head_dim: rotary channels (even).
        base: ``rope_theta``.
        trained: trained context lengths offered (the schedules'
            ``original_max_position_embeddings``).
        factors: target length over trained length, offered.
        schedules: the schedules, the first one selected by default.

    Returns:
        ``{"head_dim", "base", "trained", "factors", "schedules", "original",
        "cases"}``: ``original`` is the unscaled ``omega`` per pair; ``cases``
        maps ``(schedule key, trained, factor)`` to an :class:`ExtensionCase`.

    Raises:
        ValueError: bad sizes, an unknown schedule type, or parameters the
            schedule refuses.
    """
    head_dim = checks.check_int(head_dim, "head_dim", minimum=2)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even; got {head_dim}")
    base = checks.check_number(base, "base", positive=True)
    trained = sorted({checks.check_int(t, "trained", minimum=2) for t in trained})
    factors = sorted({checks.check_number(f, "factors", positive=True) for f in factors})
    if any(f < 1 for f in factors):
        raise ValueError(f"factors must be >= 1 (target length over trained); got {factors}")
    if not schedules:
        raise ValueError("schedules must not be empty")
    for s in schedules:
        checks.check_choice(s.rope_type, "rope_type", tuple(SCHEDULES))
    original = frequencies("default", head_dim, base).inv_freq
    cases: dict[tuple[str, int, float], ExtensionCase] = {}
    for s in schedules:
        for t in trained:
            for f in factors:
                params, target = _case_params(s, t, f)
                got = frequencies(s.rope_type, head_dim, base, params, seq_len=target)
                omega = got.inv_freq
                ratio = omega / original
                cases[s.key, t, f] = ExtensionCase(
                    omega,
                    ratio,
                    classify(ratio, f),
                    float(got.attention_scaling),
                    in_range(original, omega, t, target),
                )
    return {
        "head_dim": head_dim,
        "base": base,
        "trained": trained,
        "factors": factors,
        "schedules": list(schedules),
        "original": original,
        "cases": cases,
    }


def model_schedule(spec: Any, name: str) -> tuple[ExtensionSchedule, int, float]:
    """A model's schedule (from :func:`posenc.hf.rope_spec`), its trained length and factor.

    A model without scaling is shown as ``linear`` at factor 1 would be
    meaningless, so it gets the llama3 schedule's HF defaults and factor 8.
    """
    params = dict(spec.params)
    trained = spec.original_max_position_embeddings or spec.max_position_embeddings or 4096
    factor = float(params.get("factor", 0) or 0)
    if spec.rope_type == "longrope" and not factor:
        mpe = spec.max_position_embeddings or trained
        factor = mpe / trained
    if spec.rope_type in ("default", "proportional") or factor < 1:
        return STANDARD_SCHEDULES[-1], int(trained), 8.0
    label = f"{name}: {spec.rope_type}"
    return ExtensionSchedule("model", spec.rope_type, label, params), int(trained), factor


def describe(case: ExtensionCase, trained: int, factor: float) -> dict[str, Any]:
    """What a schedule did to the pairs, in numbers that tell the schedules apart.

    Returns:
        ``kept``, ``interpolated`` and ``blended``: pair counts by what the
        schedule did to the frequency; ``in_range``: pairs whose angles up to
        the target length were all met in training; ``longest``: the longest
        scaled wavelength of a pair that turns; ``attention_scaling``;
        ``target``: the target length.
    """
    counts = np.bincount(case.kind, minlength=3)
    wl = case.wavelength
    finite = wl[np.isfinite(wl)]
    return {
        "kept": int(counts[0]),
        "interpolated": int(counts[1]),
        "blended": int(counts[2]),
        "in_range": int(case.in_range.sum()),
        "longest": float(finite.max()) if finite.size else None,
        "attention_scaling": case.attention_scaling,
        "target": round(trained * factor),
    }


def timestep_explorer(
    dims: Iterable[int] = (32, 64, 128),
    presets: Sequence[str] = ("ddpm", "ldm", "annotated-diffusion"),
    *,
    last: float = 999.5,
    step: float = 0.5,
) -> dict[str, Any]:
    """Continuous timesteps ``0, step, ..., last`` through each preset, for each ``dim``.

    The cosine of ``e(t)`` and ``e(t')`` under one preset depends on ``t' - t``
    alone (each (sin, cos) pair turns by ``(t' - t) omega``; every row has norm
    ``sqrt(dim / 2)``), so one curve over the offsets ``-last .. last`` gives the
    similarity of any grid timestep to every other: it is measured as the
    cosine of ``e(offset)`` with ``e(0)``.

    Returns:
        ``{"timesteps", "dims", "presets", "combos"}``; ``combos`` maps
        ``(preset, dim)`` to ``{"table"}`` (``(T, dim)`` float64),
        ``"offsets"`` and ``"similarity"`` (the cosine at each offset), and
        ``"cross"`` maps ``(preset a, preset b, dim)`` (each unordered pair
        once, in the order given) to the cosine of their embeddings of each
        grid timestep.

    Raises:
        ValueError: an odd or tiny ``dim`` (each preset lays out pairs), an
            unknown preset, a step or last that is not positive.
    """
    dims = sorted({checks.check_int(d, "dims", minimum=4) for d in dims})
    if any(d % 2 for d in dims):
        raise ValueError(f"dims must be even (pairs of sin and cos); got {dims}")
    names = tuple(presets)
    for name in names:
        resolve(name)
    step = checks.check_number(step, "step", positive=True)
    last = checks.check_number(last, "last", positive=True)
    count = round(last / step) + 1
    checks.check_elements(count * sum(dims) * len(names), "timesteps x dims x presets")
    t = np.arange(count, dtype=np.float64) * step
    offsets = np.arange(-(count - 1), count, dtype=np.float64) * step
    combos: dict[tuple[str, int], dict[str, Any]] = {}
    cross: dict[tuple[str, str, int], npt.NDArray[np.float64]] = {}
    for dim in dims:
        tables = {}
        for name in names:
            table = np.asarray(sinusoidal(t, dim, preset=name, dtype="float64"))
            shifted = np.asarray(sinusoidal(offsets, dim, preset=name, dtype="float64"))
            zero = np.asarray(sinusoidal([0.0], dim, preset=name, dtype="float64"))[0]
            similarity = shifted @ zero / (np.linalg.norm(shifted, axis=1) * np.linalg.norm(zero))
            combos[name, dim] = {"table": table, "offsets": offsets, "similarity": similarity}
            tables[name] = table
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                ta, tb = tables[a], tables[b]
                norms = np.linalg.norm(ta, axis=1) * np.linalg.norm(tb, axis=1)
                cross[a, b, dim] = np.einsum("ij,ij->i", ta, tb) / norms
    return {"timesteps": t, "dims": dims, "presets": names, "combos": combos, "cross": cross}


def bias_explorer(modules: Mapping[str, Any], length: int) -> dict[str, Any]:
    """Each head's bias over the keys of every query, and the weights it alone gives.

    Causal attention whose content scores are all equal (``q_i . k_j`` the same
    for every key) is ``softmax`` of the bias over the keys ``j <= i``: what the
    position encoding alone makes a query look at.

    Args:
        modules: attention-bias modules (:class:`posenc.bias.AttentionBias`) by
            name, all with ``heads`` heads.
        length: positions (queries and keys ``0 .. length - 1``).

    Returns:
        per name: ``{"heads", "bias"}`` (``(heads, length, length)`` float64,
        zero above the diagonal), ``"weights"`` (the softmax over ``j <= i``,
        zero above), ``"mean_distance"`` (``(heads, length)``: the weighted mean
        of ``i - j``), ``"self_weight"`` (``(heads, length)``: the weight on the
        query's own position) and, for T5-style buckets, ``"buckets"`` (the
        bucket of each distance ``0 .. length - 1``).

    Raises:
        ValueError: no modules, or ``length`` below 2 or too large.
    """
    import torch

    from posenc.families.bias.functional import t5_bucket
    from posenc.families.bias.modules import T5Bias

    if not modules:
        raise ValueError("modules must hold at least one attention-bias module")
    length = checks.check_int(length, "length", minimum=2)
    out: dict[str, Any] = {}
    causal = np.tril(np.ones((length, length), dtype=bool))
    distance = np.arange(length)[:, None] - np.arange(length)[None, :]
    for name, module in modules.items():
        heads = int(module.num_heads)
        checks.check_elements(heads * length * length, f"{name}: heads x length^2")
        with torch.no_grad():
            bias = module.bias(length, length).to(torch.float64).cpu().numpy()
        bias = np.where(causal, bias, 0.0)
        logits = np.where(causal, bias, -np.inf)
        weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        entry: dict[str, Any] = {
            "heads": heads,
            "bias": bias,
            "weights": weights,
            "mean_distance": (weights * np.where(causal, distance, 0)).sum(axis=-1),
            "self_weight": np.diagonal(weights, axis1=1, axis2=2).copy(),
        }
        if isinstance(module, T5Bias):
            entry["buckets"] = np.asarray(
                t5_bucket(
                    -np.arange(length),
                    bidirectional=module.bidirectional,
                    num_buckets=module.num_buckets,
                    max_distance=module.max_distance,
                )
            )
        out[name] = entry
    return out
