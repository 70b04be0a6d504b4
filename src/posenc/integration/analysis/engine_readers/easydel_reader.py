"""Read a config's RoPE the way EasyDeL's model for it does, and print its cos/sin tables.

Runs under EasyDeL's own Python (``posenc engines build easydel``'s environment): standard
library, JAX, Flax and EasyDeL only, never posenc.

The config is read as EasyDeL reads a checkpoint's: written as ``config.json`` into a
temporary directory, its task found by ``modules/auto/auto_configuration.py:
infer_task_from_hf_config`` (the architectures' suffix; causal LM when it finds none, as
``AutoEasyDeLConfig`` falls back), the config built by
``AutoEasyDeLConfig.from_pretrained`` (the registered ``<Model>Config`` of its
``model_type``; a ``model_type`` EasyDeL has no module for is refused with the registry's
error, never read as Llama) and the model by the registered module class, as
``infra/mixins/bridge.py: from_pretrained`` builds it (float32, its default dtype).

The tables are the ones the model applies: one forward pass of 4 tokens records, for
every attention module, the ``frequencies`` its decoder passes it (``infra/base_module.py:
frequencies``, i.e. ``infra/base_config.py: get_basic_frequencies``, a bfloat16 cache of
``layers/rotary/_rotary.py: get_frequencies``; Gemma 3's sliding layers get a float32
``default_frequencies``). The asked layer's attention then rotates unit vectors (1 in
the first channel of every pair, 0 in the second) at the asked positions with that cache,
through its own ``_apply_rotary`` (which calls its ``rotary`` module, or skips it: Cohere
2's global layers, SmolLM3's NoPE layers), so the rotated pair holds ``(m cos, m sin)``
with any scale ``m`` the cache carries (YaRN's mscale, LongRoPE's). EasyDeL's caches do
not depend on the sequence length (each is computed once, for
``granted_freq_max_position_embedding`` positions), so a window's rows are these rows
whatever its ``seq_len``; a position past the cache's end reads its last row (JAX clamps
gathers). Multi-head latent attention (DeepSeek) applies the cache inline in
``layers/attention/_unified.py: UnifiedAttention.forward_mla`` (``cos, sin =
split(frequencies[position_ids])``, NeoX halves): that gather is restated here and the
note says so.

The protocol (request, batch, answer) is :mod:`~posenc.analysis.engine_readers.protocol`'s.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import math
import os
import re
import sys
import tempfile
from typing import Any

#: Tokens of the forward pass that records the caches the decoder passes its attentions.
PROBE_TOKENS = 4

_SWITCHING = {
    "longrope": "never: one factor set for every position, long_factor when the cache's "
    "length (granted_freq_max_position_embedding: freq_max_position_embeddings, else "
    "max_position_embeddings; eSurge sets it to max_model_len) exceeds "
    "original_max_position_embeddings, else short_factor, with the matching scale, "
    "chosen once when the cache is built (layers/rotary/_compute_fns.py: "
    "compute_phi3_frequencies)",
    "dynamic": "never: the base is scaled once, for factor x the cache's length, when the "
    "cache is built; every position and sequence length reads that base "
    "(layers/rotary/_compute_fns.py: compute_dynamic_frequencies)",
}


def _version() -> str:
    return (
        f"easydel {importlib.metadata.version('easydel')}, "
        f"jax {importlib.metadata.version('jax')}, flax {importlib.metadata.version('flax')}"
    )


def _load(config: dict[str, Any]) -> tuple[Any, Any, str]:
    """EasyDeL's config and model for ``config``, and the task it was read as."""
    import flax.nnx as nn
    import jax.numpy as jnp
    from easydel.infra.factory import TaskType
    from easydel.modules.auto.auto_configuration import (
        AutoEasyDeLConfig,
        get_modules_by_type,
        infer_task_from_hf_config,
    )

    with tempfile.TemporaryDirectory(prefix="posenc-easydel-") as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
        task = infer_task_from_hf_config(folder) or TaskType.CAUSAL_LM
        ed_config = AutoEasyDeLConfig.from_pretrained(folder, model_task=task)
    module_class = get_modules_by_type(ed_config.model_type, task)[1]
    model = module_class(config=ed_config, dtype=jnp.float32, param_dtype=jnp.float32,
                         precision=None, rngs=nn.Rngs(0))  # fmt: skip
    return ed_config, model, str(getattr(task, "value", task))


def _attentions(model: Any) -> dict[int, tuple[str, Any]]:
    """The text decoder's attention modules (those holding a ``rotary``), by layer index."""
    found: dict[int, tuple[str, Any]] = {}
    for path, module in model.iter_modules():
        name = ".".join(str(p) for p in path)
        if not hasattr(module, "rotary") or re.search(r"vision|visual", name):
            continue
        m = re.search(r"layers\.(\d+)\.", name + ".")
        if m and int(m.group(1)) not in found:
            found[int(m.group(1))] = (name, module)
    if not found:
        raise ValueError(f"{type(model).__name__} has no decoder attention with a rotary")
    return found


def _record(model: Any, attentions: dict[int, tuple[str, Any]]) -> dict[int, Any]:
    """The ``frequencies`` each attention receives in one forward pass, by ``id``."""
    import jax.numpy as jnp

    seen: dict[int, Any] = {}
    classes = {type(m) for _, m in attentions.values()}
    originals = {cls: cls.__call__ for cls in classes}

    def wrap(original: Any) -> Any:
        signature = inspect.signature(original)

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            bound = signature.bind_partial(self, *args, **kwargs)
            seen[id(self)] = bound.arguments.get("frequencies")
            return original(self, *args, **kwargs)

        return call

    try:
        for cls, original in originals.items():
            cls.__call__ = wrap(original)
        ids = jnp.ones((1, PROBE_TOKENS), dtype=jnp.int32)
        positions = jnp.arange(PROBE_TOKENS, dtype=jnp.int32)[None]
        with model.mesh:
            model(input_ids=ids, position_ids=positions)
    finally:
        for cls, original in originals.items():
            cls.__call__ = original
    return seen


def _geometry(attention: Any, frequencies: Any) -> tuple[int, int, bool]:
    """(head_dim, rotary_dim, NeoX halves?) of an attention's rotation."""
    head_dim = int(getattr(attention, "qk_rope_head_dim", 0) or attention.head_dim)
    rotary = attention.rotary
    if getattr(attention, "attention_type", None) == "mla":
        return head_dim, head_dim, True
    rotary_dim = int(getattr(rotary, "rotary_dim", 0) or head_dim)
    if frequencies is not None and not hasattr(rotary, "mrope_section"):
        # the cache's width is what the rotation reads (cos and sin halves)
        rotary_dim = min(rotary_dim, int(_array(frequencies).shape[-1]))
    return head_dim, rotary_dim, bool(getattr(rotary, "is_neox_style", True))


def _array(frequencies: Any) -> Any:
    value = getattr(frequencies, "value", frequencies)
    return value


def _rows(attention: Any, frequencies: Any, positions: Any, geometry: tuple[int, int, bool]):
    """cos and sin rows (one per position, one value per pair) and whether it rotated."""
    import jax.numpy as jnp

    head_dim, rotary_dim, neox = geometry
    pairs = rotary_dim // 2
    if neox:
        first = [1.0] * pairs + [0.0] * (head_dim - pairs)
    else:
        first = [1.0 if c % 2 == 0 and c < rotary_dim else 0.0 for c in range(head_dim)]
    n = int(positions.shape[-1])
    unit = jnp.broadcast_to(jnp.asarray(first, dtype=attention.dtype), (1, n, 1, head_dim))
    if getattr(attention, "attention_type", None) == "mla":
        if frequencies is None:  # forward_mla rotates only with a cache
            out = unit
        else:  # restated: UnifiedAttention.forward_mla's gather and NeoX rotation
            cos, sin = jnp.split(_array(frequencies)[positions], 2, -1)
            out = jnp.concatenate([cos, sin], axis=-1)[:, :, None, :].astype(unit.dtype)
    else:
        out, _ = attention._apply_rotary(unit, unit, positions, frequencies)
    out = out[0, :, 0, :].astype(jnp.float32)
    if neox:
        c, s = out[:, :pairs], out[:, pairs : 2 * pairs]
    else:
        c, s = out[:, 0:rotary_dim:2], out[:, 1:rotary_dim:2]
    rotated = bool(jnp.any(out != unit[0, :, 0, :].astype(jnp.float32)))
    return c.tolist(), s.tolist(), rotated


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Build the answer to one request: the tables EasyDeL's model applies."""
    import jax.numpy as jnp

    config = dict(request["config"])
    ed_config, model, task = _load(config)
    attentions = _attentions(model)
    seen = _record(model, attentions)
    notes = []
    if any(getattr(a, "attention_type", None) == "mla" for _, a in attentions.values()):
        notes.append("multi-head latent attention: the cache's rows read as "
                     "layers/attention/_unified.py: UnifiedAttention.forward_mla gathers "
                     "them (restated: it rotates inline, with no module to call)")  # fmt: skip
    windows, dtypes, softmax = [], set(), None
    for w in request["windows"]:
        layer = int(w.get("layer") or 0)
        if layer not in attentions:
            raise ValueError(f"layer {layer}: the model's decoder has {len(attentions)} layers")
        path, attention = attentions[layer]
        if id(attention) not in seen:
            raise ValueError(f"{path} was not called in the model's forward pass")
        frequencies = seen[id(attention)]
        geometry = _geometry(attention, frequencies)
        dtype = "float32" if frequencies is None else str(_array(frequencies).dtype)
        positions_list = [int(p) for p in w["positions"]]
        if w.get("position_ids") is not None and hasattr(attention.rotary, "mrope_section"):
            positions = jnp.asarray(w["position_ids"], dtype=jnp.int32)[:, None, :]
        else:
            positions = jnp.asarray(positions_list, dtype=jnp.int32)[None]
        c, s, rotated = _rows(attention, frequencies, positions, geometry)
        mode = (f"rows of the cache the model passes {path} (recorded in a {PROBE_TOKENS}-token "
                f"forward), rotated by its _apply_rotary at the asked positions; EasyDeL's "
                f"cache does not depend on seq_len")  # fmt: skip
        if frequencies is not None:
            mode += f" (a cache of {int(_array(frequencies).shape[-2])} rows)"
        if w.get("position_ids") is not None and not hasattr(attention.rotary, "mrope_section"):
            mode += "; at the token index (the layer's rotary takes no multi-axis positions)"
        rotary = attention.rotary
        if hasattr(rotary, "mrope_section") and not (
            rotary.mrope_interleaved or rotary.repetition_style
        ):
            mode += ("; chunked M-RoPE without repetition_style (MultiModalRotaryEmbedding."
                     "_apply_chunked_mrope): the first half's cos and the second half's sin "
                     "may come from different axes")  # fmt: skip
        if not rotated:
            mode += f"; {path} does not rotate q/k (cos 1, sin 0)"
            pairs = geometry[1] // 2
            c = [[1.0] * pairs for _ in positions_list]
            s = [[0.0] * pairs for _ in positions_list]
        else:
            dtypes.add(dtype)
        scale = getattr(getattr(attention, "attention_performer", None), "softmax_scale", None)
        if softmax is None and isinstance(scale, (int, float)):
            softmax = float(scale)
        windows.append({"seq_len": int(w["seq_len"]), "positions": positions_list, "cos": c,
                        "sin": s, "mode": mode, "layer_type": w.get("layer_type"),
                        "position_ids": w.get("position_ids"), "module": path,
                        "rotates": rotated,
                        "attention_scaling": math.hypot(c[0][0], s[0][0]) if c and c[0] else 1.0,
                        "layout": "half" if geometry[2] else "interleaved"})  # fmt: skip
    first = next((w for w in windows if w["rotates"]), windows[0])
    rope_type = str(ed_config._get_rope_config().rope_type)
    _, attention0 = attentions[min(attentions)]
    return {
        "version": _version(),
        "source": "installed",
        "module": f"{type(model).__name__} ({task}): {type(attention0.rotary).__name__}",
        "layout": first["layout"],
        "rotary_dim": _geometry(attention0, seen.get(id(attention0)))[1],
        "dtype": "bfloat16" if "bfloat16" in dtypes else "float32",
        "attention_scaling": first["attention_scaling"],
        "softmax_scale": softmax,
        "switching": _SWITCHING.get(rope_type),
        "windows": windows,
        "note": "; ".join(notes),
    }


if __name__ == "__main__":
    from protocol import serve

    sys.exit(serve(answer))
