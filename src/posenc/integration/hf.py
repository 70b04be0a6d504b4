"""HF transformers integration: patch models with exact cos/sin tables.

:func:`patch_model` swaps the rotary modules of a loaded model for
:class:`HFRotaryEmbedding`, which has the same ``forward(x, position_ids) ->
(cos, sin)`` contract but computes the tables exactly
(:func:`posenc.rotary.tables.cos_sin`) instead of from float32 angles (HF's
float32 angles err by about ``position * omega * 2**-23``: 6e-2 at position 1e6).
The module lives in :mod:`posenc.integration.hf_module`, the one part that imports
torch; ``posenc.hf.HFRotaryEmbedding`` imports it on first access.

Config reading lives beside the schedules it feeds
(:mod:`posenc.rotary.config`); :func:`rope_spec`, :class:`RopeSpec` and
:func:`rope_layer_types` are re-exported here, where they have always been.

Every module is called on probe positions before it is replaced, and its own
output decides what replaces it:

- one-axis RoPE: :class:`HFRotaryEmbedding` in the module's output form
  (:data:`posenc.integration.hf_module.FORMS`: half or interleaved ``(cos, sin)``,
  half-width, complex), its tables equal to the module's within HF's float32 error;
- M-RoPE in Qwen's orders (Qwen2-VL, Qwen2.5-VL, Qwen3-VL text models): an
  :class:`HFRotaryEmbedding` computing :func:`posenc.rotary.multiaxis.mrope_cos_sin`
  for ``(3, batch, seq)`` positions, the order checked on a probe;
- anything multi-axis else (vision towers' axial RoPE, GLM-4V's M-RoPE order, M-RoPE
  per layer type): :class:`~posenc.integration.hf_module.HFGatheredRotaryEmbedding`
  (per layer type inside an :class:`~posenc.integration.hf_module.HFLayerTypes`), each
  output channel's axis and frequency read from the
  module's output against exact tables and checked on a second, wider probe;
- GPT-J's and CodeGen's modules, which carry no config or rope type: a table of the
  enclosing model's config (``rotary_dim``, base 10000), read from their output as
  half-width ``(sin, cos)``, in the dtype they return it.

What matches none of these is refused with a ``ValueError`` naming the module.

:func:`rerotate_cache` moves the keys of an HF ``DynamicCache`` or ``StaticCache`` from
one length's tables to another's, for the length-dependent rope types (``dynamic``,
``longrope``), which transformers leaves stale.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

from posenc.core import checks
from posenc.families.rotary.config import (
    DEFAULT_THETA,
    MULTI_AXIS_KEYS,
    RopeSpec,
    fixed_rope,
    parse_rope_type,
    raw_parameters,
    rope_layer_types,
    rope_spec,
)

# HFRotaryEmbedding (posenc.integration.hf_module, which imports torch) is imported on
# first access through the module __getattr__, so that this module imports without torch
__all__ = [
    "DEFAULT_THETA",
    "RopeSpec",
    "patch_model",
    "rerotate_cache",
    "rope_layer_types",
    "rope_spec",
]

# --------------------------------------------------------------------------------------
# Patching models.


def __getattr__(name: str) -> Any:
    """``posenc.hf.HFRotaryEmbedding``, imported on first access (its module needs torch)."""
    if name == "HFRotaryEmbedding":
        from posenc.integration.hf_module import HFRotaryEmbedding

        return HFRotaryEmbedding
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_multi_axis(module: Any) -> bool:
    if hasattr(module, "mrope_section") or "mrope" in type(module).__name__.lower():
        return True
    config = getattr(module, "config", None)
    raw = raw_parameters(config) if config is not None else {}
    dicts = [raw, *(v for v in raw.values() if isinstance(v, Mapping))]
    return any(k in d for d in dicts for k in MULTI_AXIS_KEYS)


def _frequency_rtol(base: float, factor: float = 0.0) -> float:
    """Bound on the relative error of HF's float32 ``inv_freq``: ``(4 + ln base + factor)`` ulps.

    The exponent's rounding costs ``ln(base)`` ulps, pow and the divisions a few more,
    and the blends of yarn and llama3 amplify the ramp's rounding up to ``factor`` times
    (tests/test_rotary_schedules.py derives it).
    """
    return (4 + abs(math.log(base)) + factor) * 2.0**-23


def _inv_freq_rtol(spec: RopeSpec) -> float:
    """``_frequency_rtol`` of ``spec`` (its factor counted from 1)."""
    factor = spec.params.get("factor")
    factor = factor if isinstance(factor, (int, float)) and factor > 1 else 1.0
    return _frequency_rtol(spec.base, factor)


def _table_tolerance(scaling: float, top: float, rtol: float) -> float:
    """Bound on ``|posenc - HF|`` for tables whose largest angle is ``top`` radians.

    HF's float32 angle is off by ``top (rtol + 2**-24)``; float32 cos/sin and the
    attention scaling add ``2**-22``, all times the scaling.
    """
    return scaling * (top * (rtol + 2.0**-24) + 2.0**-22)


def _device_of(module: Any) -> Any:
    """Where ``module``'s buffers live (the CPU for a module without any)."""
    import torch

    buffers = list(module.buffers())
    return buffers[0].device if buffers else torch.device("cpu")


def _check_against_module(module: Any, spec: RopeSpec, name: str, prefix: str = "") -> None:
    """Refuse to patch when HF's own float32 frequencies disagree with the spec's."""
    import torch

    theirs = getattr(module, f"{prefix}original_inv_freq", None)
    if theirs is None:
        theirs = getattr(module, f"{prefix}inv_freq", None)
    if not isinstance(theirs, torch.Tensor):
        return
    ours = spec.frequencies().inv_freq
    theirs_np = theirs.detach().to("cpu", torch.float64).numpy()
    rtol = _inv_freq_rtol(spec)  # HF's float32 inv_freq: see _frequency_rtol
    if theirs_np.shape != ours.shape or not all(
        abs(t - o) <= rtol * abs(o) for t, o in zip(theirs_np.tolist(), ours.tolist(), strict=True)
    ):
        raise ValueError(
            f"{name}: posenc's {spec.rope_type!r} frequencies (rotary_dim={spec.rotary_dim}) do "
            f"not match the module's own {prefix}inv_freq (shape {tuple(theirs.shape)}); "
            "this model computes RoPE in a way posenc.hf does not recognise, so it is not patched"
        )


def _mrope_spec(module: Any, spec: RopeSpec, name: str) -> RopeSpec:
    """The spec of an HF M-RoPE module, its section order read from the module's own output.

    transformers picks contiguous (Qwen2-VL) or interleaved (Qwen3-VL) sections
    by model class, and a section list from the module (``mrope_section``, with
    a per-class default when the config has none). Both candidates are tried
    on a probe with distinct axes; the one matching the module's tables within
    HF's float32 error is kept, and a module matching neither is refused.
    """
    import dataclasses

    import torch

    from posenc.families.rotary.multiaxis import mrope_cos_sin

    section = getattr(module, "mrope_section", None)
    section = tuple(section) if section is not None else spec.mrope_section
    if section is None:
        raise ValueError(f"{name}: an M-RoPE module without mrope_section; cannot patch it")
    candidates = (False, True) if spec.mrope_interleaved is None else (spec.mrope_interleaved,)
    inv_freq = getattr(module, "inv_freq", None)
    device = inv_freq.device if isinstance(inv_freq, torch.Tensor) else torch.device("cpu")
    steps = torch.arange(16, device=device)
    probe = torch.stack([steps, 2 * steps + 1, 3 * steps + 2])[:, None, :]  # (3, 1, 16)
    try:
        with torch.no_grad():
            theirs = module(torch.zeros(1, device=device), probe)
    except Exception as exc:  # the model's own code, e.g. an M-RoPE of 4 axes, not 3
        raise ValueError(
            f"{name}: calling it on (3, batch, seq) M-RoPE positions failed "
            f"({type(exc).__name__}: {exc}); posenc.hf cannot check it, so it is not patched"
        ) from None
    freqs = spec.frequencies(seq_len=int(probe.max()) + 1)
    top = float(probe.max()) * float(max(freqs.inv_freq, default=0.0))
    tol = _table_tolerance(freqs.attention_scaling, top, _inv_freq_rtol(spec))
    for interleaved in candidates:
        try:
            ours = mrope_cos_sin(probe, freqs, section, interleaved=interleaved)
        except ValueError:
            continue
        if all(
            t.shape == o.shape and float((t.float().cpu() - o.cpu()).abs().max()) <= tol
            for t, o in zip(theirs, ours, strict=True)
        ):
            return dataclasses.replace(spec, mrope_section=section, mrope_interleaved=interleaved)
    raise ValueError(
        f"{name}: the module's M-RoPE tables match neither posenc's contiguous nor its "
        f"interleaved order for mrope_section={list(section)}; "
        "this model computes RoPE in a way posenc.hf does not recognise, so it is not patched"
    )


def _describe(out: Any) -> str:
    """What a rotary module returned, in a few words (shapes and dtypes)."""
    import torch

    if isinstance(out, torch.Tensor):
        return f"a {out.dtype} tensor of shape {tuple(out.shape)}"
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of " + ", ".join(_describe(o) for o in out)
    return f"a {type(out).__name__}"


def _candidate_forms(out: Any, rotary_dim: int) -> list[str]:
    """The output forms of :data:`FORMS` that ``out``'s structure and widths allow."""
    import torch

    if isinstance(out, torch.Tensor) and out.is_complex() and out.shape[-1] == rotary_dim // 2:
        return ["complex"]
    if (
        isinstance(out, (tuple, list))
        and len(out) == 2
        and all(isinstance(o, torch.Tensor) and not o.is_complex() for o in out)
        and out[0].shape == out[1].shape
    ):
        if out[0].shape[-1] == rotary_dim:
            return ["half", "interleaved"]
        if out[0].shape[-1] == rotary_dim // 2:
            return ["half_width", "half_width_sin_first"]
    return []


def _difference(theirs: Any, ours: Any) -> tuple[float, str]:
    """Largest |theirs - ours| over the outputs, and where (output, position, channel)."""
    import torch

    parts_t = [theirs] if isinstance(theirs, torch.Tensor) else list(theirs)
    parts_o = [ours] if isinstance(ours, torch.Tensor) else list(ours)
    worst, where = -1.0, ""
    for k, (t, o) in enumerate(zip(parts_t, parts_o, strict=True)):
        if t.shape != o.shape or t.dtype != o.dtype:
            return math.inf, f"output {k}: {_describe(t)} against posenc's {_describe(o)}"
        diff = (t.cpu().to(torch.complex128 if t.is_complex() else torch.float64) - o.cpu()).abs()
        if diff.numel() and float(diff.max()) > worst:
            flat = int(diff.argmax())
            index = list(torch.unravel_index(torch.tensor(flat), diff.shape))
            worst = float(diff.max())
            where = f"output {k}, position index {int(index[-2])}, channel {int(index[-1])}"
    return worst, where


def _verify_output(module: Any, specs: dict[str | None, RopeSpec], config: Any, label: str) -> str:
    """The output form of ``module``, after checking posenc's tables in that form equal its own.

    The module (a copy: length-dependent modules change state when called) is
    called as ``forward(x, position_ids[, layer_type])`` on positions ``0 .. 63``;
    its output decides the candidate forms, and the first whose values agree
    with posenc's within HF's float32 error is returned.

    Raises:
        ValueError: naming the module, when it cannot be called that way, returns
            something else, or no form agrees (with the largest difference and where).
    """
    import copy

    import torch

    from posenc.integration.hf_module import HFRotaryEmbedding

    device = _device_of(module)
    spec = next(iter(specs.values()))
    positions = torch.arange(64, device=device)[None]
    x = torch.zeros(1, 64, spec.rotary_dim, device=device)
    theirs_module = copy.deepcopy(module)
    outputs: dict[str | None, Any] = {}
    for key in specs:
        try:
            with torch.no_grad():
                if key is None:
                    outputs[key] = theirs_module(x, positions)
                else:
                    outputs[key] = theirs_module(x, positions, layer_type=key)
        except Exception as exc:  # the model's own code: any failure means "cannot verify"
            call = "forward(x, position_ids" + (")" if key is None else f", layer_type={key!r})")
            raise ValueError(
                f"{label}: calling it as {call} failed ({type(exc).__name__}: {exc}); posenc.hf "
                "cannot check its output, so it is not patched"
            ) from None
    first = outputs[next(iter(specs))]
    candidates = _candidate_forms(first, spec.rotary_dim)
    if not candidates:
        raise ValueError(
            f"{label}: returns {_describe(first)} for rotary_dim {spec.rotary_dim}; posenc.hf "
            "knows (cos, sin) in the half or interleaved layout, half-width (cos, sin) or "
            "(sin, cos), and one complex tensor, so it is not patched"
        )
    misses = []
    for form in candidates:
        ours_module = HFRotaryEmbedding(specs, config=config, form=form).to(device)
        worst_all, where_all, tol_all = 0.0, "", 0.0
        for key, theirs in outputs.items():
            ours = ours_module(x, positions, layer_type=key)
            freqs = ours_module.frequencies(None, key)
            top = 63 * float(max(freqs.inv_freq, default=0.0))
            tol = _table_tolerance(freqs.attention_scaling, top, _inv_freq_rtol(specs[key]))
            worst, where = _difference(theirs, ours)
            if worst > tol and worst - tol >= worst_all - tol_all:
                worst_all, where_all, tol_all = worst, (f"{key}: " if key else "") + where, tol
        if not where_all:
            _refuse_multi_axis(theirs_module, ours_module, specs, x, label)
            return form
        misses.append(f"{form}: {_fmt_diff(worst_all)} at {where_all} (tolerance {tol_all:.1e})")
    raise ValueError(
        f"{label}: its tables differ from posenc's ({'; '.join(misses)}); this model computes "
        "RoPE in a way posenc.hf does not recognise, so it is not patched"
    )


class _TakesAxes(ValueError):
    """A module that looks one-axis on a one-axis probe but takes several axes."""


def _refuse_multi_axis(theirs: Any, ours: Any, specs: Any, x: Any, label: str) -> None:
    """Refuse a one-axis reading of a module that also takes positions of several axes.

    A module that broadcasts ``(batch, seq)`` positions to several axes (NeoMME's
    row and column RoPE, with no M-RoPE key in its config) looks like one-axis
    RoPE on a one-axis probe; given ``(axes, batch, seq)`` positions, as its model
    passes them, it is not.
    """
    import torch

    steps = torch.arange(x.shape[1], device=x.device)
    for axes in (2, 3, 4):
        probe = torch.stack([(2 * a + 1) * steps + a for a in range(axes)])[:, None, :]
        try:
            with torch.no_grad():
                out = [theirs(x, probe, layer_type=k) if k else theirs(x, probe) for k in specs]
        except Exception:  # the model's own code: it does not take this many axes
            continue
        first = out[0] if isinstance(out[0], torch.Tensor) else out[0][0]
        if tuple(first.shape[:-1]) != (1, x.shape[1]):
            continue
        raise _TakesAxes(
            f"{label}: it also takes positions of {axes} axes ((axes, batch, seq)), which a "
            "one-axis replacement would read differently; posenc.hf does not recognise this "
            "multi-axis RoPE (its config names no mrope_section), so it is not patched"
        )


def _fmt_diff(x: float) -> str:
    return "a different shape or dtype" if math.isinf(x) else f"max |difference| {x:.3g}"


def _axial_frequencies(
    module: Any, config: Any, label: str, layer_type: str | None = None
) -> tuple[float, int]:
    """``(base, rotary_dim)`` whose ``base ** (-2k / rotary_dim)`` are the module's ``inv_freq``.

    Vision towers take ``rotary_dim`` from a fraction of the head (a half,
    a quarter) that differs by family; their float32 ``inv_freq`` tells it.
    """
    import torch

    from posenc.families.rotary.schedules import frequencies

    inv_freq = getattr(module, f"{layer_type}_inv_freq" if layer_type else "inv_freq", None)
    params = raw_parameters(config)
    if layer_type and isinstance(params.get(layer_type), Mapping):
        params = dict(params[layer_type])
    base = params.get("rope_theta", getattr(config, "rope_theta", None))
    if not isinstance(inv_freq, torch.Tensor) or inv_freq.ndim != 1 or base is None:
        raise ValueError(
            f"{label}: an axial rotary module without a 1-D inv_freq and a rope_theta; "
            "posenc.hf cannot tell its frequencies, so it is not patched"
        )
    theirs = inv_freq.detach().to("cpu", torch.float64)
    rotary_dim = 2 * len(theirs)
    ours = frequencies("default", rotary_dim, float(base)).inv_freq
    rtol = _frequency_rtol(float(base))
    if not all(abs(t - o) <= rtol * o for t, o in zip(theirs.tolist(), ours.tolist(), strict=True)):
        raise ValueError(
            f"{label}: its inv_freq is not rope_theta ** (-2k / {rotary_dim}); posenc.hf does not "
            "recognise these frequencies, so it is not patched"
        )
    return float(base), rotary_dim


def _axial_probe(axes: int, count: int, scale: int, device: Any) -> Any:
    """``(axes, count)`` distinct integer positions per axis, as patches of an image have."""
    import torch

    n = torch.arange(count, device=device)
    return torch.stack([(n * (2 * a + 3) * scale + 7 * a) % (61 * scale) for a in range(axes)])


def _gather_reading(
    module: Any, base: float, rotary_dim: int, axes: int, axis_last: bool, scaling: float,
    device: Any, batched: bool = False, layer_type: str | None = None,
) -> Any:  # fmt: skip
    """The module read as exact (axis, frequency) channels for one probe layout, or why not.

    ``batched``: a text model's M-RoPE, called with ``(axes, batch, seq)`` positions.
    """
    import torch

    from posenc.integration.hf_module import HFGatheredRotaryEmbedding

    count = 48

    def shaped(probe: Any) -> Any:
        return probe[:, None, :] if batched else probe.T if axis_last else probe

    def call(probe: Any) -> Any:
        zeros = torch.zeros(1, count, rotary_dim, device=device)
        with torch.no_grad():
            if layer_type is None:
                out = module(zeros, shaped(probe))
            else:
                out = module(zeros, shaped(probe), layer_type=layer_type)
        if batched and isinstance(out, (tuple, list)):
            out = tuple(o[0] if isinstance(o, torch.Tensor) and o.ndim == 3 else o for o in out)
        return out

    probe = _axial_probe(axes, count, 1, device)
    try:
        out = call(probe)
    except Exception as exc:  # the model's own code: this layout of axes is not its own
        return f"{type(exc).__name__}: {exc}"
    if not (
        isinstance(out, (tuple, list))
        and len(out) == 2
        and all(isinstance(o, torch.Tensor) for o in out)
        and all(o.shape[:-1] in ((count,), (1, count)) for o in out)
    ):
        return f"returned {_describe(out)}"
    # SAM 2's memory attention returns its tables with a batch dim of 1 in front of
    # unbatched positions: the replacement must too
    leading = not batched and out[0].ndim == 3
    out = tuple(o[0] for o in out) if leading else tuple(out)
    k = rotary_dim // 2
    every = HFGatheredRotaryEmbedding(
        base, rotary_dim, [a for a in range(axes) for _ in range(k)],
        [f for _ in range(axes) for f in range(k)], axes, scaling,
    )(torch.zeros(1, dtype=torch.float64), probe)  # fmt: skip
    cand_c, cand_s = (t.double().cpu() for t in every)
    their_c, their_s = (t.double().cpu() for t in out)
    # (channels, candidates): the largest difference of each output channel from each
    err = ((their_c[:, :, None] - cand_c[:, None, :]).abs().amax(0)
           + (their_s[:, :, None] - cand_s[:, None, :]).abs().amax(0))  # fmt: skip
    best = err.argmin(1)
    new = HFGatheredRotaryEmbedding(
        base, rotary_dim, (best // k).tolist(), (best % k).tolist(), axes, scaling,
        axis_last=axis_last, broadcast=batched, leading=leading,
    ).to(device)  # fmt: skip
    wide = _axial_probe(axes, count, 5, device)
    theirs = call(wide)
    ours = new(torch.zeros(1, count, rotary_dim, device=device), shaped(wide))
    ours = tuple(o[0] for o in ours) if batched else ours
    top = float(wide.max()) * float(max(new.freqs.inv_freq, default=0.0))
    tol = _table_tolerance(scaling, top, _frequency_rtol(base))
    worst, where = _difference(tuple(theirs), ours)
    if worst <= tol:
        return new
    return f"{_fmt_diff(worst)} at {where} (tolerance {tol:.1e})"


def _read_channels(
    module: Any,
    config: Any,
    label: str,
    layouts: list[tuple[int, bool, bool]],
    layer_type: str | None = None,
) -> tuple[Any, list[str]]:
    """The first ``(axes, axis_last, batched)`` layout in which the module reads as exact channels.

    Returns the :class:`HFGatheredRotaryEmbedding` (``None`` if no layout reads)
    and why each layout tried before it failed.
    """
    import copy

    base, rotary_dim = _axial_frequencies(module, config, label, layer_type)
    name = f"{layer_type}_attention_scaling" if layer_type else "attention_scaling"
    scaling = float(getattr(module, name, 1.0) or 1.0)
    device = _device_of(module)
    theirs = copy.deepcopy(module)  # calls can change a module's state; the model's stays
    failures = []
    for axes, axis_last, batched in layouts:
        new = _gather_reading(
            theirs, base, rotary_dim, axes, axis_last, scaling, device, batched, layer_type
        )
        if isinstance(new, str):
            failures.append(f"{axes} axes {'last' if axis_last else 'first'}: {new}")
            continue
        new.config = config
        return new, failures
    return None, failures


def _gathered_mrope(
    module: Any,
    config: Any,
    spec: RopeSpec,
    label: str,
    why: Exception,
    layer_type: str | None = None,
) -> Any:
    """A text model's M-RoPE in an order of its own, read as (axis, frequency) channels."""
    if spec.rope_type != "default":
        raise why
    try:
        new, _ = _read_channels(
            module, config, label, [(a, False, True) for a in (2, 3, 4)], layer_type
        )
    except ValueError:  # frequencies that are not base ** (-2k / d): the first reason stands
        raise why from None
    if new is None:
        raise why
    return new


def _gathered_layer_types(
    module: Any, config: Any, rope_type: Any, label: str, why: Exception | None
) -> Any:
    """M-RoPE per layer type (Cohere Compass, NeoMME): each type read from the module's output."""
    from posenc.integration.hf_module import HFLayerTypes

    types_ = list(rope_type) if isinstance(rope_type, Mapping) else []
    if not types_:
        raise ValueError(f"{label} takes a layer_type but names no layer types")
    why = why or ValueError(
        f"{label}: its M-RoPE per layer type matches no reading of its channels as "
        "(axis, frequency) of exact tables; posenc.hf does not recognise it, so it is not patched"
    )
    per_type = {
        lt: _gathered_mrope(module, config, _read_spec(config, label, lt), label, why, lt)
        for lt in types_
    }
    return HFLayerTypes(per_type, config)


def _gathered(module: Any, config: Any, label: str) -> Any:
    """An exact :class:`HFGatheredRotaryEmbedding` equal to an HF axial module, or a ValueError.

    The module is called on positions of 2, 3 and 4 axes, given as the first or
    the last dim; for the first layout that it takes, each output channel's axis
    and frequency are found by matching its cos and sin columns against posenc's
    exact tables of every (axis, frequency), then the whole replacement is checked
    on a second, wider probe.
    """
    layouts = [(a, last, False) for a in (2, 3, 4) for last in (False, True)]
    new, failures = _read_channels(module, config, label, layouts)
    if new is None:
        raise ValueError(
            f"{label}: no reading of its channels as (axis, frequency) of exact tables matches "
            f"its output ({'; '.join(failures)}); posenc.hf does not recognise it, so it is not "
            "patched"
        )
    return new


def _enclosing_config(model: Any, name: str) -> Any:
    """The ``config`` of the nearest module around the submodule ``name`` (``model`` last)."""
    parts = name.split(".") if name else []
    for depth in range(len(parts) - 1, -1, -1):
        config = getattr(model.get_submodule(".".join(parts[:depth])), "config", None)
        if config is not None:
            return config
    return None


def _fixed_table(model: Any, name: str, module: Any, label: str) -> Any:
    """The replacement of a rotary module without HF's config and rope type attributes.

    GPT-J's and CodeGen's modules hold a table made at construction from their model's
    config (base-10000 RoPE over ``rotary_dim``, no RoPE key) and return ``(sin, cos)``
    of half width. The config is the nearest enclosing module's; the module's output on
    probe positions decides the form (``_verify_output``), and whether its tables
    come in ``x``'s dtype (GPT-J) or in its table's own (CodeGen).

    Raises:
        ValueError: naming the module: no enclosing config of such a model type (any
            other module of another contract), or tables that differ from posenc's.
    """
    import copy

    import torch

    from posenc.integration.hf_module import HFRotaryEmbedding

    config = _enclosing_config(model, name)
    if config is None or fixed_rope(config) is None:
        raise ValueError(
            f"{label} lacks HF's config/rope_type attributes and forward(x, position_ids) "
            "contract; posenc.hf cannot patch it"
        )
    spec = _read_spec(config, label)
    checked = _with_values(module, config, label)
    form = _verify_output(checked, {None: spec}, config, label)
    # the dtype of its tables: x's, or its own table's whatever x is (CodeGen)
    device = _device_of(checked)
    positions = torch.arange(4, device=device)[None]
    dtypes = []
    for dtype in (torch.float64, torch.float16):
        x = torch.zeros(1, 4, spec.rotary_dim, device=device, dtype=dtype)
        with torch.no_grad():
            out = copy.deepcopy(checked)(x, positions)
        dtypes.append({t.dtype for t in out})
    table_dtype = None
    if dtypes[0] == dtypes[1] and len(dtypes[0]) == 1:
        table_dtype = dtypes[0].pop()
    elif dtypes != [{torch.float64}, {torch.float16}]:
        raise ValueError(
            f"{label}: returns tables of {sorted(map(str, dtypes[0]))} for float64 input and "
            f"{sorted(map(str, dtypes[1]))} for float16; posenc.hf cannot tell their dtype, "
            "so it is not patched"
        )
    return HFRotaryEmbedding({None: spec}, config=config, form=form, table_dtype=table_dtype)


def patch_model(model: Any) -> Any:
    """Replace every HF rotary module of ``model`` with an exact :class:`HFRotaryEmbedding`.

    The rotary modules are found by their shape, not by model class: modules
    whose class name ends with ``RotaryEmbedding`` and that carry HF's
    ``config``, ``rope_type`` and ``inv_freq`` (or ``{layer_type}_inv_freq``
    for per-layer-type modules such as Gemma 3's, whose ``forward`` takes a
    ``layer_type``). Each is checked against its own float32 ``inv_freq``
    and then called on probe positions: its output decides the form of the
    replacement's tables (``(cos, sin)`` in the half or interleaved layout,
    half-width, or one complex tensor; :data:`posenc.integration.hf_module.FORMS`),
    and posenc's tables in that form must equal it within HF's float32 error,
    so a model computing RoPE some other way is refused instead of silently
    changed. M-RoPE modules (Qwen2-VL,
    Qwen3-VL text models) are also checked against their own tables on a
    probe, which settles their section order. GPT-J's and CodeGen's modules,
    which carry neither ``config`` nor ``rope_type``, are read with the
    enclosing model's config and checked the same way. A model built on the meta device
    (deferred initialisation) is checked against a copy of each rotary module
    built on the CPU from its config, and gets meta modules that ``to_empty``
    fills.

    Args:
        model: a loaded ``transformers`` model (any ``nn.Module``).

    Returns:
        ``model``, patched in place.

    Raises:
        ValueError: naming the module and its class: a rotary module that
            does not follow HF's contract (vision rotary modules of full VL
            models among them), whose config cannot be read, whose forward
            fails on the probe, or whose frequencies, output form or tables
            do not match posenc's; or no rotary module at all.

    Examples:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> import posenc.hf
        >>> config = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        ...                      vocab_size=64, intermediate_size=64)
        >>> model = posenc.hf.patch_model(LlamaForCausalLM(config))  # random weights
        >>> type(model.model.rotary_emb).__name__
        'HFRotaryEmbedding'
        >>> model(torch.tensor([[1, 2, 3, 4]])).logits.shape
        torch.Size([1, 4, 64])
    """
    found = [
        (name, module)
        for name, module in model.named_modules()
        if type(module).__name__.endswith("RotaryEmbedding")
    ]
    if not found:
        raise ValueError("model has no module whose class name ends with 'RotaryEmbedding'")
    from posenc.integration.hf_module import HFRotaryEmbedding

    # every module is checked (and its replacement built) before any is swapped: a refusal
    # leaves the model as it was
    replacements: list[tuple[str, Any, Any]] = []
    for name, module in found:
        label = f"{name or 'model'} ({type(module).__name__})"
        config = getattr(module, "config", None)
        rope_type = getattr(module, "rope_type", None)
        if config is None or rope_type is None:
            # GPT-J and CodeGen: a table of their model's config, read from its output
            replacements.append((name, module, _fixed_table(model, name, module, label)))
            continue
        if rope_type == "axial":  # a vision tower's RoPE over patch rows and columns
            new = _gathered(_with_values(module, config, label), config, label)
            replacements.append((name, module, new))
            continue
        one_type = isinstance(rope_type, Mapping) and not rope_type  # ESM's {}: one RoPE
        if one_type:
            rope_type = None
        layer_type_arg = inspect.signature(module.forward).parameters.get("layer_type")
        # ESM and Evolla take an optional layer_type and have one RoPE: that is not per type
        takes_layer_type = layer_type_arg is not None and (
            isinstance(rope_type, Mapping) or layer_type_arg.default is inspect.Parameter.empty
        )
        specs: dict[str | None, RopeSpec] = {}
        multi_axis = _is_multi_axis(module)
        checked = _with_values(module, config, label)
        if multi_axis and (takes_layer_type or isinstance(rope_type, Mapping)):
            new = _gathered_layer_types(checked, config, rope_type, label, None)
            replacements.append((name, module, new))
            continue
        form = "half"
        if takes_layer_type or isinstance(rope_type, Mapping):
            declared = dict(rope_type) if isinstance(rope_type, Mapping) else {}
            if not declared:
                raise ValueError(f"{label} takes a layer_type but names no layer types")
            for lt, lt_type in declared.items():
                specs[lt] = _read_spec(config, label, layer_type=lt)
                _check_type(label, specs[lt], lt_type)
                _check_against_module(checked, specs[lt], label, prefix=f"{lt}_")
            try:
                form = _verify_output(checked, specs, config, label)
            except _TakesAxes as exc:  # NeoMME: M-RoPE per layer type, no mrope_section
                new = _gathered_layer_types(checked, config, rope_type, label, exc)
                replacements.append((name, module, new))
                continue
        else:
            spec = _read_spec(config, label)
            if not one_type:
                _check_type(label, spec, rope_type)
            _check_against_module(checked, spec, label)
            if multi_axis:
                try:
                    specs[None] = _mrope_spec(checked, spec, label)
                except ValueError as exc:
                    # an M-RoPE order of its own (GLM-4V repeats each section's angles):
                    # read each channel's axis and frequency from its output instead
                    new = _gathered_mrope(checked, config, spec, label, exc)
                    replacements.append((name, module, new))
                    continue
            elif spec.mrope_section is not None:
                raise ValueError(
                    f"{label}: its config has mrope_section but the module is not an M-RoPE "
                    "module; posenc.hf cannot tell how it uses the sections"
                )
            else:
                specs[None] = spec
                form = _verify_output(checked, specs, config, label)
        replacements.append((name, module, HFRotaryEmbedding(specs, config=config, form=form)))

    for name, module, new in replacements:
        _keep_attributes(module, new)
        new.to(_device_of(module))
        if name:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, new)
        else:
            raise ValueError("patch_model takes a model that contains a rotary module, not one")
    return model


_PLAIN = (bool, int, float, str)


def _keep_attributes(old: Any, new: Any) -> None:
    """Copy the old module's plain attributes that the new one lacks, for the model's code.

    Models read settings off their rotary module (HunYuan-VL its ``mrope_section`` to
    build position ids); the replacement keeps them, as plain values.
    """
    import copy

    for key, value in vars(old).items():
        plain = isinstance(value, _PLAIN) or (
            isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value)
        )
        if plain and not key.startswith("_") and not hasattr(new, key):
            setattr(new, key, copy.copy(value))


def _with_values(module: Any, config: Any, label: str) -> Any:
    """``module``, or, if its buffers are on the meta device, its twin built on the CPU.

    The checks read the module's own frequencies and tables, which a meta-device
    module (deferred initialisation) does not hold; its class rebuilds them from the
    config, as transformers' own loader does.
    """
    import torch

    if not any(b.is_meta for b in module.buffers()):
        return module
    try:
        with torch.device("cpu"):
            return type(module)(config)
    except Exception as exc:
        raise ValueError(
            f"{label} is on the meta device and could not be rebuilt on the CPU from its "
            f"config to check it ({type(exc).__name__}: {exc}); patch the model once its "
            "tensors are materialised"
        ) from exc


def _read_spec(config: Any, label: str, layer_type: str | None = None) -> RopeSpec:
    """:func:`rope_spec` of a module's config, with anything but a ValueError said as one.

    transformers' configs can raise their own errors on attribute access (Gemma 4's
    per-layer ``head_dim`` raises ``AmbiguousGlobalPerLayerAttributeError`` on the global
    config, so a layer type is read from its own ``per_layer_config`` entry).
    """
    per_layer = getattr(config, "per_layer_config", None) if layer_type else None
    if per_layer is not None:
        # Gemma 4: head_dim varies by layer type, and each type's config resolves it (the
        # rotary module builds each type's frequencies from that config too)
        try:
            config = per_layer[layer_type]
        except Exception:  # transformers' own lookup: DeepSeek-V4's rope types ("main") are
            pass  # not its attention layer types, and its global config holds them
    try:
        return rope_spec(config, layer_type=layer_type)
    except (ValueError, TypeError) as exc:
        # the module's config, as posenc reads it, is not RoPE it knows: say whose it is
        raise ValueError(f"{label}: its config is not read as RoPE posenc knows: {exc}") from exc
    except Exception as exc:
        raise ValueError(
            f"{label}: reading its config failed ({type(exc).__name__}: {exc}); posenc.hf "
            "cannot tell its RoPE settings, so it is not patched"
        ) from None


def _check_type(label: str, spec: RopeSpec, module_type: Any) -> None:
    if parse_rope_type({"rope_type": module_type}, label) != spec.rope_type:
        raise ValueError(
            f"{label} uses rope type {module_type!r} but its config reads as {spec.rope_type!r}"
        )


# --------------------------------------------------------------------------------------
# Re-rotating a KV cache.


def _cache_layer_slots(layer: Any, index: int, head_dim: int) -> tuple[Any, int, int] | None:
    """``(keys view, tokens seen, slots held)`` of one HF cache layer; None if it is empty.

    The view holds the slots to re-rotate, the last ``slots`` of the ``tokens`` the
    layer has seen (a sliding window keeps only the last ones; a static layer fills its
    buffer from the start).
    """
    from transformers import cache_utils

    kind = type(layer)
    supported = (
        cache_utils.DynamicLayer,
        cache_utils.DynamicSlidingWindowLayer,
        cache_utils.StaticLayer,
    )
    if kind not in supported:
        raise ValueError(
            f"cache.layers[{index}] is a {kind.__name__}; rerotate_cache reads "
            f"{', '.join(k.__name__ for k in supported)} (DynamicCache, StaticCache)"
        )
    keys = getattr(layer, "keys", None)
    if not getattr(layer, "is_initialized", False) or keys is None or keys.numel() == 0:
        return None
    if keys.ndim != 4 or keys.shape[-1] != head_dim:
        raise ValueError(
            f"cache.layers[{index}] holds keys of shape {tuple(keys.shape)}; the config's RoPE "
            f"needs (batch, kv_heads, seq, head_dim={head_dim})"
        )
    if kind is cache_utils.StaticLayer:
        tokens = int(layer.cumulative_length)
        return keys[:, :, :tokens], tokens, tokens
    slots = int(keys.shape[-2])
    if kind is cache_utils.DynamicSlidingWindowLayer:
        return keys, int(layer.cumulative_length), slots
    return keys, slots, slots


def _per_token_lengths(old_len: Any, tokens: int) -> list[int]:
    """``old_len`` as one length per cached token."""
    import torch

    if isinstance(old_len, torch.Tensor):
        if old_len.is_floating_point() or old_len.is_complex() or old_len.dtype == torch.bool:
            raise TypeError(f"old_len must hold ints; got a tensor of {old_len.dtype}")
        old_len = old_len.tolist()
    if isinstance(old_len, (str, bytes)) or not hasattr(old_len, "__len__"):
        return [checks.check_int(old_len, "old_len", minimum=1)] * tokens
    lengths = [checks.check_int(v, f"old_len[{i}]", minimum=1) for i, v in enumerate(old_len)]
    if len(lengths) != tokens:
        raise ValueError(
            f"old_len must be an int or one length per cached token ({tokens}); got "
            f"{len(lengths)} lengths"
        )
    return lengths


def rerotate_cache(
    model_or_config: Any,
    cache: Any,
    old_len: Any,
    new_len: int,
    *,
    positions: Any = None,
) -> Any:
    """Re-rotate the keys of an HF cache from the RoPE tables of ``old_len`` to ``new_len``'s.

    For models whose RoPE depends on the sequence length: ``dynamic`` (NTK base grown
    for the length) and ``longrope`` (Phi-3: long factors past
    ``original_max_position_embeddings``). transformers' ``dynamic_rope_update``
    recomputes the rotary module's ``inv_freq`` from each call's ``seq_len =
    max(position_ids) + 1`` but leaves the cache alone: past
    ``max_position_embeddings`` a ``dynamic`` model (Llama) stores every decode step's
    key under a new base and attends with each new query to keys cached under all the
    earlier bases. Phi-3's ``prepare_inputs_for_generation`` (PhiMoE's and Phi-4
    multimodal's too) instead drops the cache the first time ``generate``'s input grows
    past ``original_max_position_embeddings`` and prefills the whole sequence again.
    This function is the third way: every cached key ``k`` at position ``p``, stored as
    ``a R(p omega_old) k``, is rotated in place to ``a' R(p omega_new) k``
    (:func:`posenc.rotary.rerotate.rerotate_keys`: the angle difference exact, equal to
    the new tables' rotation within float32 rounding).

    Call it before the forward that will use the new tables, with ``new_len`` the
    length whose tables that call uses: its ``max(position_ids) + 1`` (for
    ``dynamic``, a base once grown stays while calls remain between
    ``max_position_embeddings`` and the longest length seen: then that length).

    What it does not do: a key of layer 0 is a function of its token alone, so layer 0
    becomes exactly what a re-prefill would cache; the keys and values of later layers
    were computed from hidden states that attended under the old tables, which a
    re-rotation cannot redo (only a re-prefill does). A one-layer model decodes exactly
    as after a re-prefill; a deeper one decodes with consistent tables, not with a
    re-prefill's hidden states.

    Args:
        model_or_config: an HF model (its ``config`` is read) or config, or a
            ``config.json`` dict: read by :func:`rope_spec`.
        cache: a ``transformers`` ``DynamicCache`` or ``StaticCache`` (layers
            ``DynamicLayer``, ``DynamicSlidingWindowLayer``, ``StaticLayer``); its keys
            are ``(batch, kv_heads, seq, head_dim)``.
        old_len: the length the cached keys' tables were made for (the prefill's
            ``seq_len``), or one length per cached token, when the keys were cached
            by calls of different lengths: after a prefill of ``P`` tokens and
            decode steps past ``max_position_embeddings``, ``[P] * P + list(range(P +
            1, n + 1))`` for ``n`` cached tokens.
        new_len: the length whose tables the keys should carry.
        positions: ``(tokens,)`` or ``(batch, tokens)`` int positions of the cached
            tokens (left-padded batches: HF's ``attention_mask.cumsum(-1) - 1``);
            ``0 .. tokens - 1`` by default. Sliding-window layers take the last ones.

    Returns:
        ``cache``, its keys re-rotated in place (static layers keep their buffers).

    Raises:
        ValueError: a rope type whose tables do not depend on the length (nothing to
            re-rotate), M-RoPE or per-layer-type RoPE (not supported), a config
            posenc cannot read; cache layers of other kinds (quantized, offloaded
            kinds ...), keys not ``(batch, kv_heads, seq, head_dim)``, layers that
            disagree on how many tokens they have seen; ``old_len`` or ``positions``
            not matching the cached tokens. Nothing is changed then.
        TypeError: ``cache`` not an HF cache, non-int lengths or positions.

    Examples:
        >>> import torch
        >>> from transformers import DynamicCache, LlamaConfig
        >>> import posenc.hf
        >>> config = LlamaConfig(hidden_size=32, num_attention_heads=2, max_position_embeddings=8,
        ...                      rope_parameters={"rope_type": "dynamic", "factor": 2.0})
        >>> keys = torch.randn(1, 2, 6, 16)  # (batch, kv_heads, tokens, head_dim) of a prefill
        >>> cache = DynamicCache()
        >>> _ = cache.update(keys.clone(), torch.zeros_like(keys), 0)  # layer 0
        >>> posenc.hf.rerotate_cache(config, cache, old_len=6, new_len=12) is cache
        True
        >>> moved = cache.layers[0].keys  # position 0 does not turn, the others do
        >>> torch.equal(moved[..., 0, :], keys[..., 0, :]), torch.equal(moved, keys)
        (True, False)
    """
    import torch

    from posenc.families.rotary.apply import apply_rotary
    from posenc.families.rotary.dynamic import LENGTH_DEPENDENT
    from posenc.families.rotary.rerotate import rerotation_cos_sin

    config = model_or_config
    if isinstance(model_or_config, torch.nn.Module):
        config = getattr(model_or_config, "config", None)
        if config is None:
            raise TypeError("model_or_config is a module without an HF config attribute")
    if rope_layer_types(config):
        raise ValueError(
            "model_or_config has one RoPE per layer type; rerotate_cache handles one RoPE "
            "for all layers"
        )
    spec = _read_spec(config, "model_or_config")
    if spec.mrope_section is not None or spec.mrope_default is not None:
        raise ValueError("model_or_config describes M-RoPE; rerotate_cache handles one-axis RoPE")
    if spec.rope_type not in LENGTH_DEPENDENT:
        raise ValueError(
            f"model_or_config's rope type {spec.rope_type!r} has the same tables at every "
            f"length: cached keys never need re-rotation (rerotate_cache handles "
            f"{', '.join(map(repr, LENGTH_DEPENDENT))})"
        )
    new_len = checks.check_int(new_len, "new_len", minimum=1)
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list):
        raise TypeError(
            "cache must be a transformers Cache (DynamicCache, StaticCache) with .layers; "
            f"got {type(cache).__name__}"
        )

    # every layer is read (and every argument checked) before any key changes
    found: list[tuple[Any, int, int]] = []
    for i, layer in enumerate(layers):
        slots = _cache_layer_slots(layer, i, spec.head_dim)
        if slots is not None:
            found.append(slots)
    tokens = max((t for _, t, _ in found), default=0)
    for _, seen, _ in found:
        if seen != tokens:
            raise ValueError(
                f"cache layers disagree on the tokens seen ({seen} and {tokens}); "
                "rerotate_cache needs them to hold one sequence"
            )
    lengths = _per_token_lengths(old_len, tokens)
    if positions is None:
        positions = torch.arange(tokens)
    positions = checks.check_position_tensor(positions, "positions", floats=False, exact=True)
    if positions.ndim not in (1, 2) or positions.shape[-1] != tokens:
        raise ValueError(
            f"positions must be (tokens,) or (batch, tokens) with tokens = {tokens} cached; "
            f"got shape {tuple(positions.shape)}"
        )
    if positions.ndim == 2:
        for keys, _, _ in found:
            if positions.shape[0] not in (1, keys.shape[0]):
                raise ValueError(
                    f"positions has {positions.shape[0]} rows; the cache holds a batch of "
                    f"{keys.shape[0]}"
                )
    if not found:
        return cache

    # one table for every layer: float64 from the exact engine, rounded per layer's dtype
    new = spec.frequencies(new_len)
    width = spec.rotary_dim
    device = found[0][0].device
    positions = positions.to(device)
    cos = torch.empty((*positions.shape, width), dtype=torch.float64, device=device)
    sin = torch.empty_like(cos)
    # tokens cached under the same tables share one evaluation (dynamic is the original
    # at every length up to max_position_embeddings, longrope has two tables in all)
    unique, inverse = torch.unique(torch.tensor(lengths, dtype=torch.int64), return_inverse=True)
    groups: dict[Any, int] = {}
    group_of = [groups.setdefault(spec.frequencies(n), len(groups)) for n in unique.tolist()]
    token_group = torch.tensor(group_of, dtype=torch.int64)[inverse].to(device)
    for old, group in groups.items():
        index = torch.nonzero(token_group == group).flatten()
        c, s = rerotation_cos_sin(
            positions.index_select(-1, index), old, new, layout=spec.layout, dtype=torch.float64
        )
        cos.index_copy_(-2, index, c)
        sin.index_copy_(-2, index, s)
    if positions.ndim == 2:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (batch, 1, tokens, r): all heads

    with torch.no_grad():
        for keys, _, held in found:
            work = checks.work_dtype(keys.dtype)
            c = cos[..., tokens - held :, :].to(keys.device, work)
            s = sin[..., tokens - held :, :].to(keys.device, work)
            keys.copy_(apply_rotary(keys, c, s, layout=spec.layout, rotary_dim=width))
    return cache
