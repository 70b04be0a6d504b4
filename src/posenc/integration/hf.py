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

An M-RoPE model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL text models) gets a module that
takes ``(3, batch, seq)`` positions and computes
:func:`posenc.rotary.multiaxis.mrope_cos_sin`; whether the model's own module
interleaves its sections is read from the config when it says, and always checked
against the module's own output on a probe.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

from posenc.families.rotary.config import (
    DEFAULT_THETA,
    MULTI_AXIS_KEYS,
    RopeSpec,
    parse_rope_type,
    raw_parameters,
    rope_layer_types,
    rope_spec,
)

# HFRotaryEmbedding (posenc.integration.hf_module, which imports torch) is imported on
# first access through the module __getattr__, so that this module imports without torch
__all__ = ["DEFAULT_THETA", "RopeSpec", "patch_model", "rope_layer_types", "rope_spec"]

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


def _inv_freq_rtol(spec: RopeSpec) -> float:
    """Bound on the relative error of HF's float32 ``inv_freq`` (see ``_check_against_module``)."""
    factor = spec.params.get("factor")
    factor = factor if isinstance(factor, (int, float)) and factor > 1 else 1.0
    return (4 + abs(math.log(spec.base)) + factor) * 2.0**-23


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
    # HF's float32 inv_freq (tests/test_rotary_schedules.py derives it): the exponent's
    # rounding costs ln(base) ulps, pow and the divisions a few more, and the blends of
    # yarn and llama3 amplify the ramp's rounding up to (factor - 1) times
    rtol = _inv_freq_rtol(spec)
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
    with torch.no_grad():
        theirs = module(torch.zeros(1, device=device), probe)
    freqs = spec.frequencies(seq_len=int(probe.max()) + 1)
    # HF's table error over positions up to P: s (P max(omega) (rtol + 2**-24) + 2**-22)
    top = float(probe.max()) * float(max(freqs.inv_freq, default=0.0))
    tol = freqs.attention_scaling * (top * (_inv_freq_rtol(spec) + 2.0**-24) + 2.0**-22)
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


def patch_model(model: Any) -> Any:
    """Replace every HF rotary module of ``model`` with an exact :class:`HFRotaryEmbedding`.

    The rotary modules are found by their shape, not by model class: modules
    whose class name ends with ``RotaryEmbedding`` and that carry HF's
    ``config``, ``rope_type`` and ``inv_freq`` (or ``{layer_type}_inv_freq``
    for per-layer-type modules such as Gemma 3's, whose ``forward`` takes a
    ``layer_type``). Each is checked against its own float32 ``inv_freq``
    before it is replaced, so a model computing RoPE some other way is
    refused instead of silently changed. M-RoPE modules (Qwen2-VL,
    Qwen3-VL text models) are also checked against their own tables on a
    probe, which settles their section order. A model built on the meta device
    (deferred initialisation) is checked against a copy of each rotary module
    built on the CPU from its config, and gets meta modules that ``to_empty``
    fills.

    Args:
        model: a loaded ``transformers`` model (any ``nn.Module``).

    Returns:
        ``model``, patched in place.

    Raises:
        ValueError: a rotary module that does not follow HF's contract
            (vision rotary modules of full VL models among them), frequencies
            or M-RoPE tables that do not match, or no rotary module at all.
    """
    found = [
        (name, module)
        for name, module in model.named_modules()
        if type(module).__name__.endswith("RotaryEmbedding")
    ]
    if not found:
        raise ValueError("model has no module whose class name ends with 'RotaryEmbedding'")
    replacements = []
    for name, module in found:
        label = f"{name or 'model'} ({type(module).__name__})"
        config = getattr(module, "config", None)
        rope_type = getattr(module, "rope_type", None)
        if config is None or rope_type is None:
            raise ValueError(
                f"{label} lacks HF's config/rope_type attributes and forward(x, position_ids) "
                "contract; posenc.hf cannot patch it"
            )
        takes_layer_type = "layer_type" in inspect.signature(module.forward).parameters
        specs: dict[str | None, RopeSpec] = {}
        multi_axis = _is_multi_axis(module)
        if multi_axis and (takes_layer_type or isinstance(rope_type, Mapping)):
            raise ValueError(f"{label}: M-RoPE with one RoPE per layer type is not supported")
        checked = _with_values(module, config, label)
        if takes_layer_type or isinstance(rope_type, Mapping):
            types_ = list(rope_type) if isinstance(rope_type, Mapping) else []
            if not types_:
                raise ValueError(f"{label} takes a layer_type but names no layer types")
            for lt in types_:
                specs[lt] = rope_spec(config, layer_type=lt)
                _check_type(label, specs[lt], rope_type[lt])
                _check_against_module(checked, specs[lt], label, prefix=f"{lt}_")
        else:
            spec = rope_spec(config)
            _check_type(label, spec, rope_type)
            _check_against_module(checked, spec, label)
            if multi_axis:
                spec = _mrope_spec(checked, spec, label)
            elif spec.mrope_section is not None:
                raise ValueError(
                    f"{label}: its config has mrope_section but the module is not an M-RoPE "
                    "module; posenc.hf cannot tell how it uses the sections"
                )
            specs[None] = spec
        replacements.append((name, module, specs, config))

    from posenc.integration.hf_module import HFRotaryEmbedding

    for name, module, specs, config in replacements:
        new = HFRotaryEmbedding(specs, config=config)
        buffers = list(module.buffers())
        if buffers:
            new.to(buffers[0].device)
        if name:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, new)
        else:
            raise ValueError("patch_model takes a model that contains a rotary module, not one")
    return model


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


def _check_type(label: str, spec: RopeSpec, module_type: Any) -> None:
    if parse_rope_type({"rope_type": module_type}, label) != spec.rope_type:
        raise ValueError(
            f"{label} uses rope type {module_type!r} but its config reads as {spec.rope_type!r}"
        )
