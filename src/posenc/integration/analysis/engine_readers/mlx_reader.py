"""Read a config's RoPE the way mlx-lm's model file for it does, and print its cos/sin tables.

Runs under MLX's own Python (``posenc engines build mlx``'s environment): standard library and mlx
only, never posenc or numpy. ``import mlx_lm`` pulls transformers, so the ``mlx_lm``
package is registered by path without running its ``__init__``, and
``mlx_lm.models.<model_type>`` (which imports only mlx and its sibling modules) is
imported from the installed wheel; a ``model_type`` mlx-lm has no file for is read by
``models/llama.py`` and the note says so.

The model is built as mlx-lm builds it, ``Model(ModelArgs.from_dict(config))`` (the
config's own sizes: the tiny configs posenc's tests and tables use cost little), and
the rotary module is the ``rope`` of the attention of the asked layer (the window's
``layer``, the first layer of its layer type; else layer 0). That is the module the
model applies to queries and keys with ``offset`` = the cache's length, so whatever
the model file reads from the config (``rope_theta``, ``rope_scaling``,
``rope_local_base_freq``, ``partial_rotary_factor``, ``rope_traditional``) and however
``models/rope_utils.py``'s ``initialize_rope`` builds it is what is measured.

The tables come from the module itself: applied to unit vectors (1 in the first
channel of every pair, 0 in the second), the rotated pair holds ``(m cos, m sin)``,
``m`` being any scale the module multiplies in (YaRN's mscale, LongRoPE's). Each
window is one prefill of ``seq_len`` tokens at offset 0 (the length dynamic NTK
reads), rows picked at the asked positions; when that prefill would be too large,
each position is one decode step (``offset = position``, one token) and the note
says so. mlx-lm is text only: its rotary modules take a token offset, never
multi-axis positions, so an M-RoPE window (``position_ids``) gets the rows at the
token index and the note says so.

The protocol (request, batch, answer) is :mod:`~posenc.analysis.engine_readers.protocol`'s.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import types
from typing import Any

#: The largest prefill evaluated in one call (elements of the unit-vector input).
MAX_PREFILL_ELEMENTS = 2**26


def _package() -> None:
    spec = importlib.util.find_spec("mlx_lm")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("mlx_lm is not installed in this environment")
    if "mlx_lm" not in sys.modules:
        package = types.ModuleType("mlx_lm")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec  # its __init__ never runs; submodules are found by path
        sys.modules["mlx_lm"] = package


def _model_file(model_type: str) -> tuple[Any, str]:
    """``mlx_lm.models.<model_type>`` (else llama's), and a note when it is llama's."""
    _package()
    name = model_type.replace("-", "_")
    if name and importlib.util.find_spec(f"mlx_lm.models.{name}") is not None:
        return importlib.import_module(f"mlx_lm.models.{name}"), ""
    note = f"mlx-lm has no models/{name}.py: read as models/llama.py reads it"
    return importlib.import_module("mlx_lm.models.llama"), note


def _rope(model: Any, layer: int) -> tuple[Any, str, Any]:
    """Layer ``layer``'s rotary module, its path in the model, and its attention's scale."""
    layers = model.layers
    if not 0 <= layer < len(layers):
        raise ValueError(f"layer {layer}: the model has {len(layers)} layers")
    modules = dict(layers[layer].named_modules())
    for name, module in modules.items():
        if name.rsplit(".", 1)[-1] == "rope":
            owner = modules.get(name.rpartition(".")[0])
            scale = getattr(owner, "scale", None)
            return module, f"layers[{layer}].{name}", scale if isinstance(scale, float) else None
    raise ValueError(f"layers[{layer}] has no rope module (no rotary embedding)")


def _tables(rope: Any, dims: int, traditional: bool, seq_len: int, positions: list[int]) -> Any:
    import mlx.core as mx

    pairs = dims // 2
    if traditional:
        first = [1.0 if c % 2 == 0 else 0.0 for c in range(dims)]
    else:
        first = [1.0] * pairs + [0.0] * (dims - pairs)
    unit = mx.array(first, dtype=mx.float32)

    def split(out: Any) -> tuple[Any, Any]:
        if traditional:
            return out[..., 0::2], out[..., 1::2]
        return out[..., :pairs], out[..., pairs : 2 * pairs]

    if seq_len * dims <= MAX_PREFILL_ELEMENTS:
        x = mx.broadcast_to(unit, (1, 1, seq_len, dims))
        out = rope(x)[0, 0]
        rows = out[mx.array(positions)]
        c, s = split(rows)
        mode = f"one prefill of {seq_len} tokens at offset 0"
    else:
        cs, ss = [], []
        for p in positions:
            out = rope(unit.reshape(1, 1, 1, dims), offset=p)[0, 0]
            c1, s1 = split(out)
            cs.append(c1)
            ss.append(s1)
        c, s = mx.concatenate(cs), mx.concatenate(ss)
        mode = "one decode step per position (offset = position, one token)"
    mx.eval(c, s)
    return c.tolist(), s.tolist(), mode


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Build the answer to one request: the tables mlx-lm's model applies."""
    config = dict(request["config"])
    module, note = _model_file(str(config.get("model_type", "")))
    notes = [note] if note else []
    model = module.Model(module.ModelArgs.from_dict(config))
    if "rope_parameters" in config and "rope_scaling" not in config:
        notes.append("the config has rope_parameters (transformers v5's key) and no rope_scaling")
    windows, found = [], {}
    for w in request["windows"]:
        layer = int(w.get("layer") or 0)
        if layer not in found:
            found[layer] = _rope(model, layer)
        rope, path, _ = found[layer]
        dims = int(getattr(rope, "dims", getattr(rope, "dim", 0)))
        traditional = bool(getattr(rope, "traditional", False))
        positions = [int(p) for p in w["positions"]]
        c, s, mode = _tables(rope, dims, traditional, int(w["seq_len"]), positions)
        if w.get("position_ids") is not None:
            mode += "; at the token index (mlx-lm's rotary modules take no multi-axis positions)"
        windows.append({"seq_len": int(w["seq_len"]), "positions": positions, "cos": c,
                        "sin": s, "mode": mode, "layer_type": w.get("layer_type"),
                        "position_ids": w.get("position_ids"), "module": path,
                        "layout": "interleaved" if traditional else "half"})  # fmt: skip
    # the scale the module multiplies into the table: |(cos, sin)| at any position
    c0, s0 = windows[0]["cos"][0][0], windows[0]["sin"][0][0]
    rope0, _, softmax_scale = found[min(found)]
    return {
        "version": f"mlx {importlib.metadata.version('mlx')}, "
        f"mlx-lm {importlib.metadata.version('mlx-lm')}",
        "source": "installed",
        "module": f"{module.__name__}: {type(rope0).__name__}",
        "layout": windows[0]["layout"],
        "rotary_dim": int(getattr(rope0, "dims", getattr(rope0, "dim", 0))),
        "dtype": "float32",
        "attention_scaling": (c0 * c0 + s0 * s0) ** 0.5,
        "softmax_scale": softmax_scale,
        "windows": windows,
        "note": "; ".join(notes),
    }


if __name__ == "__main__":
    from protocol import serve

    sys.exit(serve(answer))
