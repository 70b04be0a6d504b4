"""HF transformers integration: patch models with exact cos/sin tables.

:func:`patch_model` swaps the rotary modules of a loaded model for
:class:`HFRotaryEmbedding`, which has the same ``forward(x, position_ids) ->
(cos, sin)`` contract but computes the tables exactly
(:func:`posenc.rotary.tables.cos_sin`) instead of from float32 angles (HF's
float32 angles err by about ``position * omega * 2**-23``: 6e-2 at position 1e6).

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

import functools
import inspect
import math
from collections.abc import Mapping
from typing import Any

from posenc.families.rotary.config import (
    DEFAULT_THETA,
    MROPE_AXES,
    MULTI_AXIS_KEYS,
    RopeSpec,
    parse_rope_type,
    raw_parameters,
    rope_layer_types,
    rope_spec,
)
from posenc.families.rotary.dynamic import LENGTH_DEPENDENT, LengthPolicy
from posenc.families.rotary.schedules import RopeFrequencies

# HFRotaryEmbedding is defined on first access (module __getattr__), so that rope_spec
# and this module import without torch
__all__ = ["DEFAULT_THETA", "RopeSpec", "patch_model", "rope_layer_types", "rope_spec"]

# --------------------------------------------------------------------------------------
# Patching models.


@functools.cache
def _module_class() -> type:
    """Define :class:`HFRotaryEmbedding` on first use: ``posenc.hf`` imports without torch."""
    import torch
    from torch import nn

    from posenc.families.rotary.multiaxis import mrope_cos_sin
    from posenc.families.rotary.tables import cos_sin

    class HFRotaryEmbedding(nn.Module):
        """Drop-in for HF's ``*RotaryEmbedding`` modules, with exact cos/sin tables.

        ``forward(x, position_ids, layer_type=None) -> (cos, sin)``, each of
        shape ``position_ids.shape + (rotary_dim,)`` in HF's half layout
        (``cat(theta, theta)``), times the attention scaling, in ``x.dtype`` on
        ``x.device``: the contract of ``LlamaRotaryEmbedding.forward`` (and of
        Gemma 3's, which takes ``layer_type``).

        Sequence-length-dependent types (``dynamic``, ``longrope``) follow HF's
        ``dynamic_rope_update`` with ``seq_len = max(position_ids) + 1``, through
        the policy :class:`posenc.rotary.dynamic.LengthPolicy` that
        :class:`posenc.Rotary` uses too: ``dynamic`` keeps the largest base it has
        grown to until a call falls strictly below ``max_position_embeddings``;
        ``longrope`` takes its long factors above ``original_max_position_embeddings``.
        (Keys cached under another base stay stale, as in HF: transformers #25104.)

        M-RoPE specs (``mrope_section`` set; Qwen2-VL, Qwen3-VL) take
        ``position_ids`` of ``(3, batch, seq)``, or ``(batch, seq)`` broadcast
        to the three axes as HF does, and return
        :func:`posenc.rotary.multiaxis.mrope_cos_sin` (``(batch, seq,
        rotary_dim)``).

        Args:
            specs: ``{None: spec}`` for a model with one RoPE, ``{layer_type:
                spec}`` for one RoPE per layer type.
            config: the HF config, kept as ``self.config`` for code that reads it.
        """

        def __init__(self, specs: Mapping[str | None, RopeSpec], config: Any = None) -> None:
            super().__init__()
            if not specs:
                raise ValueError("specs must hold at least one RopeSpec")
            self.specs = dict(specs)
            self.config = config
            self.per_layer_type = None not in self.specs
            self._policies = {
                k: LengthPolicy(
                    s.rope_type,
                    s.frequencies,
                    max_position_embeddings=s.max_position_embeddings,
                    original_max_position_embeddings=s.original_max_position_embeddings,
                )
                for k, s in self.specs.items()
            }
            self._fixed = {k: policy.original for k, policy in self._policies.items()}
            if self.per_layer_type:
                self.layer_types = sorted(k for k in self.specs if k is not None)
                self.rope_type: Any = {k: s.rope_type for k, s in self.specs.items()}
                for k, f in self._fixed.items():
                    self.register_buffer(f"{k}_inv_freq", _inv_freq(f), persistent=False)
                    setattr(self, f"{k}_attention_scaling", f.attention_scaling)
            else:
                fixed = self._fixed[None]
                self.rope_type = self.specs[None].rope_type
                section = self.specs[None].mrope_section
                if section is not None:
                    if self.specs[None].mrope_interleaved is None:
                        raise ValueError("an M-RoPE spec must say whether it is interleaved")
                    self.mrope_section = list(section)  # HF's attribute
                self.attention_scaling = fixed.attention_scaling
                # HF's attribute, float32 like HF's, for code that reads it; forward does not
                self.register_buffer("inv_freq", _inv_freq(fixed), persistent=False)

        def frequencies(
            self, seq_len: int | None, layer_type: str | None = None
        ) -> RopeFrequencies:
            """The frequencies for a call reaching ``seq_len`` (HF's ``dynamic_rope_update``).

            Length-dependent schedules update their state (as HF's module does);
            ``seq_len=None`` returns the frequencies in use without a change.
            """
            self._spec(layer_type)
            policy = self._policies[layer_type]
            if seq_len is not None:
                policy.update(seq_len)
            return policy.current

        def _spec(self, layer_type: str | None) -> RopeSpec:
            if layer_type not in self.specs:
                if self.per_layer_type:
                    raise ValueError(
                        f"layer_type must be one of {self.layer_types}; got {layer_type!r}"
                    )
                raise ValueError(f"this rotary module has one RoPE; got layer_type={layer_type!r}")
            return self.specs[layer_type]

        @torch.no_grad()
        def forward(
            self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
        ) -> tuple[torch.Tensor, torch.Tensor]:
            spec = self._spec(layer_type)
            seq_len = None
            if spec.rope_type in LENGTH_DEPENDENT:
                seq_len = int(position_ids.max()) + 1
            freqs = self.frequencies(seq_len, layer_type)
            if spec.mrope_section is not None:
                if position_ids.ndim == 2:
                    position_ids = position_ids.expand(MROPE_AXES, -1, -1)
                if position_ids.ndim != 3 or position_ids.shape[0] != MROPE_AXES:
                    raise ValueError(
                        f"M-RoPE position_ids must be (3, batch, seq) or (batch, seq); got "
                        f"shape {tuple(position_ids.shape)}"
                    )
                return mrope_cos_sin(
                    position_ids.to(x.device),
                    freqs,
                    spec.mrope_section,
                    interleaved=bool(spec.mrope_interleaved),
                    dtype=x.dtype,
                )
            return cos_sin(position_ids.to(x.device), freqs, layout="half", dtype=x.dtype)

        def extra_repr(self) -> str:
            return ", ".join(
                f"{k or 'rope'}: {s.rope_type}, base={s.base:g}, rotary_dim={s.rotary_dim}"
                + (
                    ""
                    if s.mrope_section is None
                    else f", mrope_section={list(s.mrope_section)}, "
                    f"interleaved={s.mrope_interleaved}"
                )
                for k, s in self.specs.items()
            )

    def _inv_freq(freqs: RopeFrequencies) -> torch.Tensor:
        return torch.tensor(freqs.inv_freq, dtype=torch.float32)

    HFRotaryEmbedding.__module__ = __name__
    return HFRotaryEmbedding


def __getattr__(name: str) -> Any:
    """``posenc.hf.HFRotaryEmbedding``, created on first access (it needs torch)."""
    if name == "HFRotaryEmbedding":
        return _module_class()
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
    probe, which settles their section order.

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
        if takes_layer_type or isinstance(rope_type, Mapping):
            types_ = list(rope_type) if isinstance(rope_type, Mapping) else []
            if not types_:
                raise ValueError(f"{label} takes a layer_type but names no layer types")
            for lt in types_:
                specs[lt] = rope_spec(config, layer_type=lt)
                _check_type(label, specs[lt], rope_type[lt])
                _check_against_module(module, specs[lt], label, prefix=f"{lt}_")
        else:
            spec = rope_spec(config)
            _check_type(label, spec, rope_type)
            _check_against_module(module, spec, label)
            if multi_axis:
                spec = _mrope_spec(module, spec, label)
            elif spec.mrope_section is not None:
                raise ValueError(
                    f"{label}: its config has mrope_section but the module is not an M-RoPE "
                    "module; posenc.hf cannot tell how it uses the sections"
                )
            specs[None] = spec
        replacements.append((name, module, specs, config))

    cls = _module_class()
    for name, module, specs, config in replacements:
        new = cls(specs, config=config)
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


def _check_type(label: str, spec: RopeSpec, module_type: Any) -> None:
    if parse_rope_type({"rope_type": module_type}, label) != spec.rope_type:
        raise ValueError(
            f"{label} uses rope type {module_type!r} but its config reads as {spec.rope_type!r}"
        )
