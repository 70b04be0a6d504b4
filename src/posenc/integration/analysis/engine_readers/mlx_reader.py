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

Whether a layer rotates at all (the window's ``rotates``) is read from one forward of the
model (4 tokens; its graph is built, not evaluated) with the rope modules' classes and
``mx.fast.rope`` wrapped to record which layer calls them: a model file may hold a
``rope`` module that its attention skips on some layers (``models/cohere2.py``: ``if
self.use_sliding_window``), a no-op module (``models/smollm3.py``'s ``NoPE``), or layers
of another kind with no rope at all (``models/qwen3_5.py``'s linear-attention layers).
A layer that does not rotate gets rows of cos 1 and sin 0; where the forward raises, a
layer rotates when it has a rope module and the note says so. ``switching`` names the
rule of mlx-lm's LongRoPE and dynamic NTK modules (:data:`SWITCHING`).

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


def _rope(model: Any, layer: int) -> tuple[Any, str, Any] | None:
    """Layer ``layer``'s rotary module, its path in the model, and its attention's scale.

    ``None`` when the layer has no module named ``rope`` (a layer of another kind: Qwen3.5's
    linear-attention layers, say).
    """
    layers = model.layers
    if not 0 <= layer < len(layers):
        raise ValueError(f"layer {layer}: the model has {len(layers)} layers")
    modules = dict(layers[layer].named_modules())
    for name, module in modules.items():
        if name.rsplit(".", 1)[-1] == "rope":
            return module, f"layers[{layer}].{name}", _scale(modules, name)
    return None


def _scale(modules: dict[str, Any], name: str) -> float | None:
    """The softmax scale the module that owns ``name`` keeps (``scale``, or gpt_oss.py's
    ``sm_scale``), if any."""
    owner = modules.get(name.rpartition(".")[0])
    for attribute in ("scale", "sm_scale"):
        scale = getattr(owner, attribute, None)
        if isinstance(scale, float):
            return scale
    return None


def _is_rope_name(name: str) -> bool:
    last = name.rsplit(".", 1)[-1].lower()
    return "rope" in last or "rotary" in last


def _forward_calls(model: Any) -> tuple[dict[int, dict[str, Any]] | None, str]:
    """Run the model once (a prefill of 4 tokens) and record, per layer, what it rotated.

    The rope modules' classes (every module of the model named ``*rope*`` / ``*rotary*``)
    and ``mx.fast.rope`` are wrapped for the call, and the layers' classes say which layer
    is running: ``{layer: {"modules": [the rope modules called, in order], "fast": the
    calls of mx.fast.rope}}``. That is how a model file that applies ``self.rope`` only on
    some layers (cohere2.py: ``if self.use_sliding_window``) or gives a layer a no-op
    module (smollm3.py's ``NoPE``) is read. ``(None, why)`` when the forward raises.
    """
    import mlx.core as mx

    layers = list(model.layers)
    index = {id(layer): i for i, layer in enumerate(layers)}
    stack: list[int] = []
    found: dict[int, dict[str, Any]] = {i: {"modules": [], "fast": 0} for i in range(len(layers))}
    rope_classes = {type(m) for n, m in model.named_modules() if _is_rope_name(n)}
    layer_classes = {type(layer) for layer in layers}
    saved: list[tuple[type, Any]] = []

    def patch(cls: type, make: Any) -> None:
        saved.append((cls, cls.__dict__.get("__call__")))
        original = cls.__call__
        patched: Any = cls
        patched.__call__ = make(original)

    def layer_call(original: Any) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            i = index.get(id(self))
            if i is None:
                return original(self, *args, **kwargs)
            stack.append(i)
            try:
                return original(self, *args, **kwargs)
            finally:
                stack.pop()

        return call

    def rope_call(original: Any) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if stack and not any(m is self for m in found[stack[-1]]["modules"]):
                found[stack[-1]]["modules"].append(self)
            return original(self, *args, **kwargs)

        return call

    fast_rope = mx.fast.rope

    def fast(*args: Any, **kwargs: Any) -> Any:
        if stack:
            found[stack[-1]]["fast"] += 1
        return fast_rope(*args, **kwargs)

    for cls in layer_classes:
        patch(cls, layer_call)
    for cls in rope_classes - layer_classes:
        patch(cls, rope_call)
    mx.fast.rope = fast
    try:
        vocab = _vocab_size(model)
        tokens = mx.array([[t % vocab for t in range(4)]])
        # mlx is lazy: the call builds the forward's graph (which is what calls the rope
        # modules) without computing it, so a large config's weights are never made
        model(tokens)
    except Exception as exc:
        import traceback

        text = str(exc).strip().splitlines()
        last = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{last.filename.rpartition('site-packages/')[2]}:{last.lineno} in {last.name}"
        return None, f"{type(exc).__name__}: {text[0][:200] if text else ''} at {where}"
    finally:
        mx.fast.rope = fast_rope
        for cls, own in reversed(saved):
            restored: Any = cls
            if own is None:
                del restored.__call__
            else:
                restored.__call__ = own
    return found, ""


def _vocab_size(model: Any) -> int:
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "embed_tokens":
            weight = getattr(module, "weight", None)
            if weight is not None:
                return max(1, int(weight.shape[0]))
    return 1


def _path(model: Any, module: Any, layer: int) -> tuple[str, float | None]:
    """Where ``module`` sits (in layer ``layer``, else anywhere), and its owner's scale."""
    for prefix, root in ((f"layers[{layer}].", model.layers[layer]), ("", model)):
        modules = dict(root.named_modules())
        for name, m in modules.items():
            if m is module:
                return prefix + name, _scale(modules, name)
    return type(module).__name__, None


def _identity(c: list[list[float]], s: list[list[float]]) -> bool:
    """Whether the tables are those of no rotation: cos 1 and sin 0 at every row."""
    return all(v == 1.0 for row in c for v in row) and all(v == 0.0 for row in s for v in row)


#: The switching rule of mlx-lm's LongRoPE and dynamic NTK modules, by (file, class).
SWITCHING = {
    ("rope_utils", "SuScaledRoPE"): "never: long_factor at every length, multiplied into the "
    "frequencies once at initialisation, short_factor never read; the magnitude from "
    "max_position_embeddings / original_max_position_embeddings, also at initialisation "
    "(mlx_lm/models/rope_utils.py: SuScaledRoPE.__init__, __call__)",
    ("rope_utils", "DynamicNTKScalingRoPE"): "per forward pass, from the call's length: the "
    "base is recomputed from max(offset + tokens of the call, max_position_embeddings) "
    "(mlx_lm/models/rope_utils.py: DynamicNTKScalingRoPE.__call__)",
    ("internlm3", "DynamicNTKScalingRoPE"): "per forward pass, from x.shape[1] + offset "
    "(x is [batch, heads, tokens, dims]: the head count, not the tokens) past "
    "max_position_embeddings (mlx_lm/models/internlm3.py: DynamicNTKScalingRoPE.__call__)",
    ("hunyuan", "DynamicNTKAlphaRoPE"): "never: the base is scaled by alpha once at "
    "initialisation (mlx_lm/models/hunyuan.py: DynamicNTKAlphaRoPE.__init__)",
    ("hunyuan_v1_dense", "DynamicNTKAlphaRoPE"): "never: the base is scaled by alpha once at "
    "initialisation (mlx_lm/models/hunyuan_v1_dense.py: DynamicNTKAlphaRoPE.__init__)",
}


def _rope_type(config: dict[str, Any]) -> str | None:
    """The config's rope type (rope_scaling, else rope_parameters; text_config's if any)."""
    part = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    for key in ("rope_scaling", "rope_parameters"):
        value = part.get(key) if isinstance(part, dict) else None
        if isinstance(value, dict):
            kind = value.get("rope_type") or value.get("type")
            if kind is not None:
                return str(kind)
    return None


def _switching(config: dict[str, Any], rope: Any) -> str | None:
    """The engine's switching rule for a LongRoPE or dynamic NTK config (else ``None``)."""
    cls = type(rope)
    rule = SWITCHING.get((cls.__module__.rsplit(".", 1)[-1], cls.__name__))
    if rule is not None:
        return rule
    kind = _rope_type(config)
    if kind in ("longrope", "su", "dynamic"):
        return (f"never: the module applied is {cls.__module__}.{cls.__name__}, which has no "
                f"switch: the config's {kind} scaling is not what it applies")  # fmt: skip
    return None


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


def logits(request: dict[str, Any]) -> dict[str, Any]:
    """The ``"logits"`` request: mlx-lm's model loads the checkpoint and runs one prefill.

    The model is built as ``mlx_lm.utils.load_model`` builds it (``Model(ModelArgs.
    from_dict(config))``, the safetensors read with ``mx.load``, the model file's own
    ``sanitize``, ``load_weights``), by hand since ``mlx_lm.utils`` imports transformers;
    the prompt is one call ``model(tokens)`` without a cache (offset 0), float32.
    """
    import json
    from pathlib import Path

    import mlx.core as mx

    ask = request["logits"]
    directory = Path(ask["checkpoint"])
    config = json.loads((directory / "config.json").read_text())
    module, note = _model_file(str(config.get("model_type", "")))
    model = module.Model(module.ModelArgs.from_dict(config))
    weights: dict[str, Any] = {}
    for f in sorted(directory.glob("*.safetensors")):
        weights.update(mx.load(str(f)))
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    model.load_weights(list(weights.items()))
    model.eval()
    out = model(mx.array([[int(t) for t in ask["tokens"]]]))
    rows = [int(r) for r in ask["rows"]]
    picked = out[0][mx.array(rows)].astype(mx.float32)
    mx.eval(picked)
    return {
        "version": f"mlx {importlib.metadata.version('mlx')}, "
        f"mlx-lm {importlib.metadata.version('mlx-lm')}",
        "converter": f"none: {module.__name__}.Model.sanitize and load_weights read the "
        "safetensors as mlx_lm.utils.load_model does",
        "runtime": f"{module.__name__}.Model, mlx {importlib.metadata.version('mlx')} (CPU)",
        "dtype": "float32",
        "mode": f"one prefill of {len(ask['tokens'])} tokens, no cache",
        "rows": rows,
        "logits": picked.tolist(),
        "note": note,
    }


def _layer_rope(
    model: Any, layer: int, calls: dict[int, dict[str, Any]] | None
) -> tuple[Any, str, float | None, bool | None, str]:
    """The rope module layer ``layer`` applies, its path, its attention's scale, whether
    the forward applied it (``None``: not known), and how that was read."""
    if not 0 <= layer < len(model.layers):
        raise ValueError(f"layer {layer}: the model has {len(model.layers)} layers")
    named = _rope(model, layer)
    item = model.layers[layer]
    children = [k for k, v in item.items() if isinstance(v, nn_module())]
    kind = f"{type(item).__name__} of {', '.join(children)}"
    if calls is None:
        if named is None:
            return None, "", None, False, f"layers[{layer}] ({kind}) has no rope module"
        return (*named, None, "its rope module (the forward did not run)")
    called = calls[layer]["modules"]
    if called:
        path, scale = _path(model, called[0], layer)
        return called[0], path, scale, True, f"the forward called {path}"
    if calls[layer]["fast"]:
        raise ValueError(f"layers[{layer}] calls mx.fast.rope outside a rope module: not read")
    if named is None:
        return None, "", None, False, f"layers[{layer}] ({kind}) has no rope module"
    skipped = f"the forward never called {named[1]} (its attention skips it on this layer)"
    return named[0], named[1], named[2], False, skipped


def nn_module() -> type:
    """mlx's ``nn.Module`` class."""
    import mlx.nn as nn

    return nn.Module


def _pairs(model: Any, config: dict[str, Any]) -> int:
    """The pair count of the model's first rope module, else of the config's head (times
    its ``partial_rotary_factor``)."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "rope":
            dims = int(getattr(module, "dims", getattr(module, "dim", 0)) or 0)
            if dims:
                return dims // 2
    part: dict[str, Any] = config.get("text_config") or config
    head = part.get("head_dim") or part["hidden_size"] // part["num_attention_heads"]
    params = part.get("rope_parameters") or part.get("rope_scaling") or {}
    factor = part.get("partial_rotary_factor") or params.get("partial_rotary_factor") or 1.0
    return int(int(head) * float(factor)) // 2


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Build the answer to one request: the tables mlx-lm's model applies."""
    if "logits" in request:
        return logits(request)
    config = dict(request["config"])
    module, note = _model_file(str(config.get("model_type", "")))
    notes = [note] if note else []
    model = module.Model(module.ModelArgs.from_dict(config))
    if "rope_parameters" in config and "rope_scaling" not in config:
        notes.append("the config has rope_parameters (transformers v5's key) and no rope_scaling")
    calls, why_not = _forward_calls(model)
    if calls is None:
        notes.append(f"the model's forward raised ({why_not}): a layer rotates where it has "
                     "a rope module (not checked by a forward)")  # fmt: skip
    else:
        notes.append("rotates: read from one forward of 4 tokens, recording the rope modules "
                     "and mx.fast.rope each layer calls")  # fmt: skip
    windows, found = [], {}
    first: tuple[Any, str, float | None] | None = None
    for w in request["windows"]:
        layer = int(w.get("layer") or 0)
        if layer not in found:
            found[layer] = _layer_rope(model, layer, calls)
        rope, path, scale, applied, how = found[layer]
        positions = [int(p) for p in w["positions"]]
        seq_len = int(w["seq_len"])
        window: dict[str, Any] = {"seq_len": seq_len, "positions": positions,
                                  "layer_type": w.get("layer_type"), "module": path,
                                  "position_ids": w.get("position_ids")}  # fmt: skip
        rotates = applied is not False
        if rope is not None and rotates:
            dims = int(getattr(rope, "dims", getattr(rope, "dim", 0)))
            traditional = bool(getattr(rope, "traditional", False))
            c, s, mode = _tables(rope, dims, traditional, seq_len, positions)
            if _identity(c, s):
                rotates = False
                mode += f"; {type(rope).__name__} leaves q/k as they are (no rotation)"
            elif w.get("position_ids") is not None:
                mode += ("; at the token index (mlx-lm's rotary modules take no multi-axis "
                         "positions)")  # fmt: skip
            if rotates and first is None:
                first = (rope, path, scale)
            layout = "interleaved" if traditional else "half"
        else:
            pairs = _pairs(model, config)
            c = [[1.0] * pairs for _ in positions]
            s = [[0.0] * pairs for _ in positions]
            mode = f"no rotation in layers[{layer}]: {how}; cos 1 and sin 0 rows of {pairs} pairs"
            layout = "half"
        windows.append({**window, "cos": c, "sin": s, "mode": mode, "layout": layout,
                        "rotates": rotates})  # fmt: skip
    if first is None:
        # no window rotates: the module (if any) of the first window's layer describes it
        rope0, path0, scale0, _, _ = found[min(found)]
        first = (rope0, path0, scale0)
    rope0, _, softmax_scale = first
    rotating = [w for w in windows if w["rotates"]] or windows
    # the scale the module multiplies into the table: |(cos, sin)| at any position
    c0, s0 = rotating[0]["cos"][0][0], rotating[0]["sin"][0][0]
    return {
        "version": f"mlx {importlib.metadata.version('mlx')}, "
        f"mlx-lm {importlib.metadata.version('mlx-lm')}",
        "source": "installed",
        "module": f"{module.__name__}: {type(rope0).__name__ if rope0 is not None else 'none'}",
        "layout": rotating[0]["layout"],
        "rotary_dim": int(getattr(rope0, "dims", getattr(rope0, "dim", 0)) or 0),
        "dtype": "float32",
        "attention_scaling": (c0 * c0 + s0 * s0) ** 0.5,
        "softmax_scale": softmax_scale,
        "switching": _switching(config, rope0) if rope0 is not None else None,
        "windows": windows,
        "note": "; ".join(notes),
    }


if __name__ == "__main__":
    from protocol import serve

    sys.exit(serve(answer))
